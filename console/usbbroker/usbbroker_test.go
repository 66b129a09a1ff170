package usbbroker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/keys"
	"github.com/edgebox/edgebox/console/store/storetest"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/tunnel"
	"github.com/edgebox/edgebox/tunnel/forwarding"
)

// fakeStream is a box's usbip stream as the tunnel hands it out.
type fakeStream struct {
	net.Conn
	peer string
	meta map[string]string
}

func (f fakeStream) Peer() string { return f.peer }
func (f fakeStream) Header() tunnel.Header {
	return tunnel.Header{Kind: tunnel.KindUSBIP, Meta: f.meta}
}

// listener hands out the streams a test dials.
type listener struct {
	ch     chan net.Conn
	once   sync.Once
	closed chan struct{}
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}
func (l *listener) Close() error   { l.once.Do(func() { close(l.closed) }); return nil }
func (l *listener) Addr() net.Addr { return tunnel.Addr{Kind: tunnel.KindUSBIP} }

// keyBoxes opens streams to the keys' boxes: each answers as the box
// does, then echoes what comes. Offline boxes are refused.
type keyBoxes struct {
	mu      sync.Mutex
	offline map[string]bool
	opened  []map[string]string
}

func (k *keyBoxes) Open(_ context.Context, box string, kind tunnel.Kind, meta map[string]string) (net.Conn, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.offline[box] || kind != tunnel.KindUSBIP {
		return nil, tunnel.ErrOffline
	}
	k.opened = append(k.opened, meta)
	a, b := net.Pipe()
	go func() {
		defer b.Close()
		if forwarding.WriteReply(b, nil) != nil {
			return
		}
		io.Copy(b, b)
	}()
	return a, nil
}

type fixture struct {
	keys    *keys.Registry
	desired *desired.State
	ln      *listener
	boxes   *keyBoxes
	key     string
	admin   audit.Actor
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	s := storetest.Bolt(t)
	st := desired.New(s)
	reg := keys.New(s, st)
	ctx := context.Background()
	boxA := fleet.Box{ID: "bx-a", TenantID: fleet.DefaultTenant}
	d := &edgeboxv1.UsbDevice{Port: "1-1.2", VendorId: "1050", ProductId: "0407", Serial: "UK-1"}
	if err := reg.Report(ctx, boxA, []*edgeboxv1.UsbDevice{d}); err != nil {
		t.Fatal(err)
	}
	f := &fixture{keys: reg, desired: st, ln: &listener{ch: make(chan net.Conn), closed: make(chan struct{})}, boxes: &keyBoxes{offline: map[string]bool{}},
		key: keys.ID("bx-a", d), admin: audit.Actor{TenantID: fleet.DefaultTenant, Name: "admin"}}
	b := New(Config{Keys: reg, Tunnel: f.boxes, Listener: f.ln, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Boxes: func(_ context.Context, id string) (fleet.Box, error) {
			return fleet.Box{ID: id, TenantID: fleet.DefaultTenant}, nil
		}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return f
}

// ask opens a usbip stream as box would, and reads the console's answer.
func (f *fixture) ask(t *testing.T, box, key string) (net.Conn, error) {
	t.Helper()
	a, b := net.Pipe()
	f.ln.ch <- fakeStream{Conn: b, peer: box, meta: map[string]string{forwarding.MetaKey: key}}
	a.SetDeadline(time.Now().Add(10 * time.Second))
	if err := forwarding.ReadReply(a); err != nil {
		a.Close()
		return nil, err
	}
	a.SetDeadline(time.Time{})
	t.Cleanup(func() { a.Close() })
	return a, nil
}

func (f *fixture) history(t *testing.T) string {
	h, err := f.keys.History(context.Background(), fleet.DefaultTenant, f.key)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range h {
		b.WriteString(e.Event + " " + e.Workload + " " + e.Detail + "\n")
	}
	return b.String()
}

// TestTheLeaseHolderIsJoinedToTheKeysBox: the box whose workload holds the
// lease reaches the key's box, through a stream the key's box is asked
// for by the key's ID; the join and its end are in the key's history
// with both boxes; ending the lease cuts the join at once.
func TestTheLeaseHolderIsJoinedToTheKeysBox(t *testing.T) {
	f := newFixture(t)
	if _, err := f.keys.Attach(context.Background(), f.admin, f.key, "robot", "bx-b"); err != nil {
		t.Fatal(err)
	}
	c, err := f.ask(t, "bx-b", f.key)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("urb")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 3)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "urb" {
		t.Fatalf("through the join: %q, %v", got, err)
	}
	f.boxes.mu.Lock()
	opened := f.boxes.opened
	f.boxes.mu.Unlock()
	if len(opened) != 1 || opened[0][forwarding.MetaKey] != f.key {
		t.Fatalf("the key's box was asked for %v", opened)
	}
	if h := f.history(t); !strings.Contains(h, "remote-attach robot on box bx-b from box bx-a to box bx-b") {
		t.Fatalf("history:\n%s", h)
	}

	released := time.Now()
	if _, err := f.keys.Release(context.Background(), f.admin, f.key); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(got); err == nil {
		t.Fatal("the join carried on after the lease ended")
	}
	t.Logf("the join was cut %s after the release", time.Since(released).Round(time.Millisecond))
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(f.history(t), "remote-detach") {
		if time.Now().After(deadline) {
			t.Fatalf("no detach in the history:\n%s", f.history(t))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if h := f.history(t); !strings.Contains(h, "box bx-b: the lease ended or moved") {
		t.Fatalf("history:\n%s", h)
	}
}

// TestABoxWithoutTheLeaseIsRefused: another box, a key not leased, a key
// of its own box, a stream naming no key, and a key whose box is offline
// are each refused with the reason.
func TestABoxWithoutTheLeaseIsRefused(t *testing.T) {
	f := newFixture(t)
	if _, err := f.ask(t, "bx-b", f.key); err == nil || !strings.Contains(err.Error(), "is not leased") {
		t.Fatalf("a key not leased: %v", err)
	}
	if _, err := f.keys.Attach(context.Background(), f.admin, f.key, "robot", "bx-b"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ask(t, "bx-c", f.key); err == nil || !strings.Contains(err.Error(), "leased to workload robot on box bx-b, not to a workload of box bx-c") {
		t.Fatalf("another box: %v", err)
	}
	if _, err := f.ask(t, "bx-b", ""); err == nil || !strings.Contains(err.Error(), "must name its key") {
		t.Fatalf("no key: %v", err)
	}
	if _, err := f.ask(t, "bx-b", "k-000000000000"); err == nil {
		t.Fatal("an unknown key was joined")
	}
	f.boxes.mu.Lock()
	f.boxes.offline["bx-a"] = true
	f.boxes.mu.Unlock()
	if _, err := f.ask(t, "bx-b", f.key); err == nil || !strings.Contains(err.Error(), "the key's box bx-a is offline") {
		t.Fatalf("the key's box offline: %v", err)
	}
	// A key leased on its own box travels nowhere.
	if _, err := f.keys.Release(context.Background(), f.admin, f.key); err != nil {
		t.Fatal(err)
	}
	if _, err := f.keys.Lease(context.Background(), f.admin, f.key, "robot"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ask(t, "bx-a", f.key); err == nil {
		t.Fatal("a key leased on its own box was joined")
	}
	f.boxes.mu.Lock()
	n := len(f.boxes.opened)
	f.boxes.mu.Unlock()
	if n != 0 {
		t.Fatalf("the key's box was asked %d times for refused streams", n)
	}
}

// TestAttachWritesBothBoxes: a remote lease is an assignment on both
// boxes, written again when attached again; the release removes both. A
// box whose agent is too old for it gets none.
func TestAttachWritesBothBoxes(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	// An agent too old to take a key of another box is not given one.
	if err := f.desired.SetServedCapability(ctx, "bx-b", keys.RemoteCapability-1); err != nil {
		t.Fatal(err)
	}
	if _, err := f.keys.Attach(ctx, f.admin, f.key, "robot", "bx-b"); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "too old") {
		t.Fatalf("a lease to an old agent: %v", err)
	}
	if err := f.desired.SetServedCapability(ctx, "bx-b", keys.RemoteCapability); err != nil {
		t.Fatal(err)
	}
	if _, err := f.keys.Attach(ctx, f.admin, f.key, "robot", "bx-b"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.keys.Attach(ctx, f.admin, f.key, "robot", "bx-b"); err != nil {
		t.Fatalf("attaching again to the same holder: %v", err)
	}
	if _, err := f.keys.Attach(ctx, f.admin, f.key, "other", "bx-b"); err == nil {
		t.Fatal("a leased key was given to another workload")
	}
	k, _, err := f.keys.Get(ctx, fleet.DefaultTenant, f.key)
	if err != nil || k.Holder != "robot" || k.HolderBox != "bx-b" {
		t.Fatalf("the key: %+v, %v", k, err)
	}
	assignment := func(box string) *edgeboxv1.UsbAssignment {
		objs, _, err := f.desired.Live(ctx, box)
		if err != nil {
			t.Fatal(err)
		}
		var out *edgeboxv1.UsbAssignment
		for _, o := range objs {
			if u := o.GetUsbAssignment(); u != nil && u.GetKeyId() == f.key {
				out = u
			}
		}
		return out
	}
	if u := assignment("bx-a"); u == nil || u.GetExportTo() != "bx-b" || u.GetWorkload() != "robot" || u.GetSerial() != "UK-1" {
		t.Fatalf("the key's box has %v", u)
	}
	if u := assignment("bx-b"); u == nil || u.GetImportFrom() != "bx-a" || u.GetWorkload() != "robot" {
		t.Fatalf("the holder's box has %v", u)
	}
	if _, err := f.keys.Release(ctx, f.admin, f.key); err != nil {
		t.Fatal(err)
	}
	if _, err := f.keys.Release(ctx, f.admin, f.key); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("released twice: %v", err)
	}
	if a, b := assignment("bx-a"), assignment("bx-b"); a != nil || b != nil {
		t.Fatalf("after the release: %v and %v", a, b)
	}
}
