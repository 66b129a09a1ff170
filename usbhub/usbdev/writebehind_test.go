package usbdev

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// slowDevice takes its time over each OUT, keeps what reached it in
// order, and answers an IN with how many OUTs it had then.
type slowDevice struct {
	mu      sync.Mutex
	got     []string
	fail    string // an OUT with this data fails
	release chan struct{}
}

func (d *slowDevice) Info() Info { return Info{} }
func (d *slowDevice) Control(context.Context, Setup, []byte) ([]byte, error) {
	return []byte{1}, nil
}
func (d *slowDevice) Transfer(ctx context.Context, ep uint8, data []byte, length int) ([]byte, error) {
	if ep&0x80 != 0 {
		d.mu.Lock()
		defer d.mu.Unlock()
		return []byte{byte(len(d.got))}, nil
	}
	<-d.release
	d.mu.Lock()
	defer d.mu.Unlock()
	if string(data) == d.fail {
		return nil, ErrStall
	}
	d.got = append(d.got, string(data))
	return nil, nil
}

// TestWriteBehind: an OUT is answered before the device has it; an IN
// meanwhile is not held up; OUTs on one endpoint reach the device in
// order, the caller's buffer reused at once; an OUT that failed fails
// the next transfer, once.
func TestWriteBehind(t *testing.T) {
	d := &slowDevice{release: make(chan struct{}), fail: "bad"}
	w := WriteBehind(d)
	ctx := context.Background()
	buf := []byte("one")
	if _, err := w.Transfer(ctx, 0x01, buf, 0); err != nil {
		t.Fatal(err)
	}
	copy(buf, "xxx")
	if in, err := w.Transfer(ctx, 0x82, nil, 8); err != nil || in[0] != 0 {
		t.Fatalf("an IN while the OUT travels: %v, %v", in, err)
	}
	second := make(chan error, 1)
	go func() {
		_, err := w.Transfer(ctx, 0x01, []byte("two"), 0)
		second <- err
	}()
	select {
	case <-second:
		t.Fatal("a second OUT on the endpoint did not wait for the first")
	case <-time.After(50 * time.Millisecond):
	}
	close(d.release)
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if _, err := w.Transfer(ctx, 0x01, []byte("bad"), 0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	var err error
	for err == nil && time.Now().Before(deadline) {
		_, err = w.Control(ctx, Setup{RequestType: 0x80, Request: RequestGetStatus, Length: 2}, nil)
		time.Sleep(time.Millisecond)
	}
	if !errors.Is(err, ErrStall) {
		t.Fatalf("the failed OUT was reported as %v", err)
	}
	if _, err := w.Control(ctx, Setup{RequestType: 0x80, Request: RequestGetStatus, Length: 2}, nil); err != nil {
		t.Fatalf("a failure was reported twice: %v", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !slices.Equal(d.got, []string{"one", "two"}) {
		t.Fatalf("the device got %q", d.got)
	}
}
