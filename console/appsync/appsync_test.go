package appsync

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/edgebox/edgebox/console/apps"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store/storetest"
	"github.com/edgebox/edgebox/errdefs"
)

// lateFleet is a fleet whose boxes arrive without the apps hearing of
// them, as a box does whose sync failed when it arrived.
type lateFleet struct {
	mu    sync.Mutex
	boxes []fleet.Box
}

func (f *lateFleet) add(b fleet.Box) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.boxes = append(f.boxes, b)
}

func (f *lateFleet) Boxes(context.Context, string) ([]fleet.Box, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fleet.Box(nil), f.boxes...), nil
}

func (f *lateFleet) Box(_ context.Context, _, id string) (fleet.Box, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.boxes {
		if b.ID == id {
			return b, nil
		}
	}
	return fleet.Box{}, errdefs.NotFound("no box %s", id)
}

// oneImage is a registry holding robots/clock:1.
type oneImage struct{}

var clock1 = digest.FromString("clock 1")

func (oneImage) Resolve(_ context.Context, repo, tag string) (digest.Digest, error) {
	if repo == "robots/clock" && tag == "1" {
		return clock1, nil
	}
	return "", errdefs.NotFound("%s has no tag %q", repo, tag)
}

func (oneImage) HasManifest(_ context.Context, repo string, d digest.Digest) (bool, error) {
	return repo == "robots/clock" && d == clock1, nil
}

// TestRunBringsLateBoxesTheirApps: a box that arrives in a region after
// its pin, with nobody syncing it, gets its app from the loop; the loop
// returns nil when its context ends.
func TestRunBringsLateBoxesTheirApps(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st := storetest.Bolt(t)
	d := desired.New(st)
	boxes := &lateFleet{}
	a := apps.New(st, d, boxes, oneImage{}, []string{"console.example"}, nil, log)
	admin := audit.Actor{TenantID: fleet.DefaultTenant, Name: "admin"}
	if _, err := a.CreateApp(ctx, admin, "clock", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CreateRelease(ctx, admin, "clock", apps.Spec{Version: "1", Runtime: "containerd", Image: "console.example/robots/clock:1"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Deploy(ctx, admin, "clock", "1", apps.ScopeRegion, "east"); err != nil {
		t.Fatal(err)
	}
	boxes.add(fleet.Box{ID: "b-late", TenantID: fleet.DefaultTenant, Region: "east", State: fleet.StateApproved})

	l, err := New(a, func(context.Context) ([]string, error) { return []string{fleet.DefaultTenant}, nil }, 10*time.Millisecond, log)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- l.Run(runCtx) }()
	for {
		objs, _, err := d.Live(ctx, "b-late")
		if err != nil {
			t.Fatal(err)
		}
		if len(objs) > 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the late box has no app after a minute of periodic syncs")
		case <-time.After(10 * time.Millisecond):
		}
	}
	stop()
	if err := <-ran; err != nil {
		t.Fatalf("Run returned %v when its context ended, want nil", err)
	}
	if _, err := New(a, nil, 0, log); err == nil {
		t.Error("New accepted an interval of 0")
	}
}
