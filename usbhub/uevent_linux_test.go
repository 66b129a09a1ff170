package usbhub

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/edgebox/edgebox/internal/test/require"
)

// TestListenUevents: the listener hears the kernel. This kernel has no
// USB, so the test asks the kernel to announce the loopback interface
// again and listens for that.
func TestListenUevents(t *testing.T) {
	require.Root(t, "asking the kernel for a uevent")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := ListenUevents(ctx, func(u Uevent) bool { return u.Subsystem == "net" && u.Vars["INTERFACE"] == "lo" })
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("/sys/class/net/lo/uevent", []byte("change"), 0o200); err != nil {
		t.Fatal(err)
	}
	select {
	case u := <-ch:
		if u.Action != "change" {
			t.Fatalf("heard %+v", u)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no uevent heard")
	}
	cancel()
	for range ch { // closes once the listener has stopped
	}
}
