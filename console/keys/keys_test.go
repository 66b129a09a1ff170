package keys

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store/storetest"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

func newRegistry(t *testing.T) *Registry {
	s := storetest.Bolt(t)
	return New(s, desired.New(s))
}

var boxA = fleet.Box{ID: "bx-a", TenantID: fleet.DefaultTenant}

// TestBadReports: malformed ports and IDs are refused whole; absurd
// descriptor strings are cut down and cleaned; hubs are no keys.
func TestBadReports(t *testing.T) {
	t.Parallel()
	r := newRegistry(t)
	ctx := context.Background()
	for name, d := range map[string]*edgeboxv1.UsbDevice{
		"port":        {Port: "../../etc", VendorId: "096e", ProductId: "0702"},
		"empty port":  {VendorId: "096e", ProductId: "0702"},
		"vendor":      {Port: "1-1", VendorId: "XYZW", ProductId: "0702"},
		"long vendor": {Port: "1-1", VendorId: "096e0", ProductId: "0702"},
	} {
		if err := r.Report(ctx, boxA, []*edgeboxv1.UsbDevice{d}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	many := make([]*edgeboxv1.UsbDevice, MaxDevices+1)
	for i := range many {
		many[i] = &edgeboxv1.UsbDevice{Port: "1-1", VendorId: "096e", ProductId: "0702"}
	}
	if err := r.Report(ctx, boxA, many); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("too many devices: %v", err)
	}
	if ks, _ := r.List(ctx, fleet.DefaultTenant, Filter{}); len(ks) != 0 {
		t.Fatalf("bad reports left keys: %+v", ks)
	}
	absurd := strings.Repeat("\x00\x1b[31m\xffé", 500)
	err := r.Report(ctx, boxA, []*edgeboxv1.UsbDevice{
		{Port: "1-1", VendorId: "05e3", ProductId: "0608", Class: "hub"},
		{Port: "1-1.4", VendorId: "096e", ProductId: "0702", Serial: absurd, Product: absurd},
	})
	if err != nil {
		t.Fatal(err)
	}
	ks, _ := r.List(ctx, fleet.DefaultTenant, Filter{})
	if len(ks) != 1 || len(ks[0].Product) > maxString || strings.ContainsAny(ks[0].Product, "\x00\x1b") {
		t.Fatalf("keys after an absurd report: %+v", ks)
	}
}

// TestLeaseStaysOnItsBox: a key is leased on the box it sits in, and a
// report from another box cannot touch it.
func TestLeaseStaysOnItsBox(t *testing.T) {
	t.Parallel()
	r := newRegistry(t)
	ctx := context.Background()
	dev := &edgeboxv1.UsbDevice{Port: "1-2", VendorId: "096e", ProductId: "0702", Serial: "S1"}
	if err := r.Report(ctx, boxA, []*edgeboxv1.UsbDevice{dev}); err != nil {
		t.Fatal(err)
	}
	id := ID(boxA.ID, dev)
	who := audit.Actor{TenantID: fleet.DefaultTenant, Name: "op"}
	if _, err := r.Lease(ctx, who, id, "robot"); err != nil {
		t.Fatal(err)
	}
	// Box b says it has the very same key: it is b's own, another key.
	boxB := fleet.Box{ID: "bx-b", TenantID: fleet.DefaultTenant}
	if err := r.Report(ctx, boxB, []*edgeboxv1.UsbDevice{dev}); err != nil {
		t.Fatal(err)
	}
	if err := r.Report(ctx, boxB, nil); err != nil {
		t.Fatal(err)
	}
	k, _, err := r.Get(ctx, fleet.DefaultTenant, id)
	if err != nil || k.BoxID != boxA.ID || k.State != Present || k.Holder != "robot" {
		t.Fatalf("box b's reports changed box a's key: %+v %v", k, err)
	}
	if _, err := r.Lease(ctx, who, id, "Bad Name"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("lease to a bad workload name: %v", err)
	}
	if _, err := r.Release(ctx, who, "k-nothing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("release of a missing key: %v", err)
	}
}

// TestMissingKeysSaysWhatEnsureLeasesWould: keys a workload holds count
// first, then free present ones; each key meets one need; nothing is
// leased by asking.
func TestMissingKeysSaysWhatEnsureLeasesWould(t *testing.T) {
	t.Parallel()
	r := newRegistry(t)
	ctx := context.Background()
	admin := audit.Actor{TenantID: fleet.DefaultTenant, Name: "admin"}
	if err := r.Report(ctx, boxA, []*edgeboxv1.UsbDevice{
		{Port: "1-1", VendorId: "096e", ProductId: "0702", Serial: "A"},
		{Port: "1-2", VendorId: "096e", ProductId: "0702", Serial: "B"},
	}); err != nil {
		t.Fatal(err)
	}
	ks, _ := r.List(ctx, fleet.DefaultTenant, Filter{})
	for _, k := range ks {
		if _, err := r.Label(ctx, admin, k.ID, map[string]string{"bank": "icbc"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Lease(ctx, admin, ks[0].ID, "other"); err != nil {
		t.Fatal(err)
	}
	icbc := map[string]string{"bank": "icbc"}
	for _, tc := range []struct {
		workload string
		needs    []map[string]string
		missing  string
	}{
		{"clock", []map[string]string{icbc}, ""},
		{"clock", []map[string]string{icbc, icbc}, "bank=icbc"},
		{"other", []map[string]string{icbc, icbc}, ""}, // its own key, then the free one
		{"clock", []map[string]string{{"bank": "abc"}}, "bank=abc"},
	} {
		got, err := r.MissingKeys(ctx, fleet.DefaultTenant, boxA.ID, tc.workload, tc.needs)
		if err != nil || strings.Join(got, ";") != tc.missing {
			t.Errorf("%s needing %v: missing %v, %v; want %q", tc.workload, tc.needs, got, err, tc.missing)
		}
	}
	after, _ := r.List(ctx, fleet.DefaultTenant, Filter{})
	held := 0
	for _, k := range after {
		if k.Holder != "" {
			held++
		}
	}
	if held != 1 {
		t.Errorf("%d keys held after asking, want the 1 leased before", held)
	}
}
