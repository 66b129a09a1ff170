package agentrel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/console/store/storetest"
	"github.com/edgebox/edgebox/errdefs"
)

type boxes []fleet.Box

func (bs boxes) Boxes(context.Context, string) ([]fleet.Box, error) { return bs, nil }
func (bs boxes) Box(_ context.Context, _, id string) (fleet.Box, error) {
	for _, b := range bs {
		if b.ID == id {
			return b, nil
		}
	}
	return fleet.Box{}, errdefs.NotFound("no box %s", id)
}

func TestReleasesArePinnedAndServedOnlyToTheirBoxes(t *testing.T) {
	ctx := context.Background()
	st := storetest.Bolt(t)
	d := desired.New(st)
	fl := boxes{
		{ID: "b1", TenantID: "bank", Region: "north", Site: "n1", State: fleet.StateApproved, OS: "linux", Arch: "amd64", AgentVersion: "1.0.0"},
		{ID: "b2", TenantID: "bank", Region: "east", Site: "e1", State: fleet.StateApproved, OS: "windows", Arch: "amd64", AgentVersion: "1.0.0"},
	}
	signed := 0
	s, err := New(st, t.TempDir(), func(msg []byte) ([]byte, error) { signed++; return []byte("sig"), nil }, d, fl, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	admin := audit.Actor{TenantID: "default", Name: "root"}
	for _, bad := range []struct{ version, platform string }{
		{"../etc", "linux/amd64"}, {"2.0.0", "linux/../../x"}, {"2.0.0", "plan9/amd64"}, {"", "linux/amd64"},
	} {
		if _, err := s.Upload(ctx, admin, bad.version, bad.platform, 0, strings.NewReader("x")); errdefs.Kind(err) != errdefs.ErrInvalid {
			t.Errorf("upload %q %q: %v", bad.version, bad.platform, err)
		}
	}
	bin := "the agent 2.0.0"
	rel, err := s.Upload(ctx, admin, "2.0.0", "linux/amd64", time.Minute, strings.NewReader(bin))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(bin))
	if b := rel.Binaries["linux/amd64"]; b.SHA256 != hex.EncodeToString(sum[:]) || signed != 1 || rel.Probation != time.Minute {
		t.Fatalf("release: %+v, %d signatures", rel, signed)
	}
	if _, err := s.Upload(ctx, admin, "2.0.0", "linux/amd64", 0, strings.NewReader("another binary")); errdefs.Kind(err) != errdefs.ErrConflict {
		t.Errorf("a second, different binary: %v", err)
	}
	if _, err := s.Upload(ctx, admin, "2.0.0", "linux/amd64", 0, strings.NewReader(bin)); err != nil {
		t.Errorf("the same binary again: %v", err)
	}
	who := audit.Actor{TenantID: "bank", Name: "alice"}
	if err := s.Pin(ctx, who, "2.0.0", ScopeRegion, "east"); err == nil || !strings.Contains(err.Error(), "windows/amd64") {
		t.Errorf("a pin to a box with no binary for it: %v", err)
	}
	// Not pinned: not served.
	if _, _, err := s.Open(ctx, "b1", "2.0.0", "linux/amd64"); err == nil {
		t.Error("a box fetched a version its desired state does not name")
	}
	if err := s.Pin(ctx, who, "2.0.0", ScopeRegion, "north"); err != nil {
		t.Fatal(err)
	}
	f, b, err := s.Open(ctx, "b1", "2.0.0", "linux/amd64")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(f)
	f.Close()
	if string(got) != bin || b.SHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("served %q", got)
	}
	if _, _, err := s.Open(ctx, "b2", "2.0.0", "linux/amd64"); err == nil {
		t.Error("another box fetched b1's version")
	}
	v, _ := s.Versions(ctx, "bank", fl)
	if v["b1"] != "2.0.0" || v["b2"] != "1.0.0" {
		t.Errorf("versions: %v", v)
	}
	// A version never uploaded may be pinned: the boxes must hold it.
	if err := s.Pin(ctx, who, "1.0.0", ScopeBox, "b1"); err != nil {
		t.Fatal(err)
	}
	live, _, _ := d.Live(ctx, "b1")
	if len(live) != 1 || live[0].GetAgentRelease().GetVersion() != "1.0.0" || live[0].GetAgentRelease().GetSha256() != "" {
		t.Errorf("b1's desired state: %v", live)
	}
	if err := s.Unpin(ctx, who, ScopeBox, "b1"); err != nil {
		t.Fatal(err)
	}
	if live, _, _ := d.Live(ctx, "b1"); len(live) != 1 || live[0].GetAgentRelease().GetVersion() != "2.0.0" {
		t.Errorf("after the box's unpin, b1 follows the region's pin: %v", live)
	}
}

// TestHellosReadThePinsOnceUntilTheyChange: the boxes' syncs at their
// hellos read a tenant's agent pins, and the release they name, once,
// not once a box; this console's own pin is seen by the next one at
// once, another replica's as soon as the watch brings it.
func TestHellosReadThePinsOnceUntilTheyChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := &storetest.Observed{Store: storetest.Bolt(t), Prefix: "agent-", Lag: 500 * time.Millisecond}
	d := desired.New(st)
	newService := func(s store.Store) *Service {
		t.Helper()
		svc, err := New(s, t.TempDir(), func([]byte) ([]byte, error) { return []byte("sig"), nil }, d, boxes{}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		return svc
	}
	s, other := newService(st), newService(st.Store) // other: another replica
	storetest.Run(t, s.Run)

	who := audit.Actor{TenantID: "bank", Name: "alice"}
	if err := s.Pin(ctx, who, "1.0.0", ScopeRegion, "north"); err != nil {
		t.Fatal(err)
	}
	box := func(id, region string) fleet.Box {
		return fleet.Box{ID: id, TenantID: "bank", Region: region, State: fleet.StateApproved, OS: "linux", Arch: "amd64"}
	}
	version := func(b fleet.Box) string {
		t.Helper()
		if err := s.SyncBox(ctx, b); err != nil {
			t.Fatal(err)
		}
		live, _, err := d.Live(ctx, b.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range live {
			if r := o.GetAgentRelease(); r != nil {
				return r.GetVersion()
			}
		}
		return "-"
	}
	// Once the watches run, a hundred hellos read the pins and their
	// release once each.
	st.Settle(t, 2, "100 hellos", func() {
		for i := range 100 {
			if got := version(box(fmt.Sprintf("b%d", i), "north")); got != "1.0.0" {
				t.Fatalf("box %d is to run %s, want 1.0.0", i, got)
			}
		}
	})
	deadline := time.Now().Add(10 * time.Second)

	// This console's own pin: the very next hello has it.
	if err := s.Pin(ctx, who, "1.0.0", ScopeRegion, "west"); err != nil {
		t.Fatal(err)
	}
	if got := version(box("bw", "west")); got != "1.0.0" {
		t.Fatalf("after this console's pin: the box is to run %s, want 1.0.0", got)
	}
	// Another replica's: as soon as the watch brings it.
	if err := other.Pin(ctx, who, "1.0.0", ScopeRegion, "south"); err != nil {
		t.Fatal(err)
	}
	for got := ""; got != "1.0.0"; {
		if got = version(box("bs", "south")); got != "1.0.0" && time.Now().After(deadline.Add(10*time.Second)) {
			t.Fatalf("after another replica's pin: the box is to run %s, want 1.0.0", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The pinned version, held by the boxes until now, uploaded here: the
	// next hello names its binary.
	if _, err := s.Upload(ctx, audit.Actor{TenantID: "default", Name: "root"}, "1.0.0", "linux/amd64", 0, strings.NewReader("the agent 1.0.0")); err != nil {
		t.Fatal(err)
	}
	b := box("b0", "north")
	version(b)
	live, _, _ := d.Live(ctx, b.ID)
	if len(live) != 1 || live[0].GetAgentRelease().GetSha256() == "" {
		t.Fatalf("after the pinned version's upload here, the box's desired state: %v", live)
	}
}
