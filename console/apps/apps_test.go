package apps

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/console/store/storetest"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

var ctx = context.Background()

// boxes is a fleet of boxes for tests.
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

// images is a registry holding one repository with tags.
type images map[string]digest.Digest // "repo:tag" -> digest

func (im images) Resolve(_ context.Context, repo, tag string) (digest.Digest, error) {
	if d, ok := im[repo+":"+tag]; ok {
		return d, nil
	}
	return "", errdefs.NotFound("%s has no tag %q", repo, tag)
}

func (im images) HasManifest(_ context.Context, repo string, d digest.Digest) (bool, error) {
	for k, v := range im {
		if strings.HasPrefix(k, repo+":") && v == d {
			return true, nil
		}
	}
	return false, nil
}

const host = "console.example:8443"

var (
	d1 = digest.FromString("one")
	d2 = digest.FromString("two")
)

func newApps(t *testing.T, bs boxes) (*Apps, *desired.State) {
	t.Helper()
	return newAppsOn(t, storetest.Bolt(t), bs)
}

func newAppsOn(t testing.TB, s store.Store, bs boxes) (*Apps, *desired.State) {
	t.Helper()
	d := desired.New(s)
	im := images{"robots/clock:1": d1, "robots/clock:2": d2, "acme/clock:1": d1, "acme/clock:2": d2}
	return New(s, d, bs, im, []string{host, "console.example"}, nil, slog.New(slog.NewTextHandler(io.Discard, nil))), d
}

var admin = audit.Actor{TenantID: fleet.DefaultTenant, Name: "admin"}

func box(id, region, site string) fleet.Box {
	return fleet.Box{ID: id, TenantID: fleet.DefaultTenant, Region: region, Site: site, State: fleet.StateApproved}
}

func workloads(t *testing.T, d *desired.State, id string) map[string]*edgeboxv1.Workload {
	t.Helper()
	objs, _, err := d.Live(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*edgeboxv1.Workload{}
	for _, o := range objs {
		if w := o.GetWorkload(); w != nil {
			out[o.GetName()] = w
		}
	}
	return out
}

func TestReleasesResolveTagsAndAreImmutable(t *testing.T) {
	t.Parallel()
	a, _ := newApps(t, nil)
	if _, err := a.CreateApp(ctx, admin, "clock", ""); err != nil {
		t.Fatal(err)
	}
	r, err := a.CreateRelease(ctx, admin, "clock", Spec{Version: "1.0", Runtime: "containerd", Image: host + "/robots/clock:1"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Image != host+"/robots/clock@"+d1.String() || r.Tag != "1" {
		t.Fatalf("release image %q tag %q", r.Image, r.Tag)
	}
	// Without the host, and by digest, it is the same image.
	r2, err := a.CreateRelease(ctx, admin, "clock", Spec{Version: "1.1", Runtime: "containerd", Image: "robots/clock@" + d1.String(),
		Probes: []Probe{{HTTP: "http://127.0.0.1:8080/healthz", FailureThreshold: 2}}})
	if err != nil || r2.Image != r.Image {
		t.Fatalf("by digest: %q %v", r2.Image, err)
	}
	if w := r2.Workload(); len(w.GetProbes()) != 1 || w.GetProbes()[0].GetHttp() != "http://127.0.0.1:8080/healthz" || w.GetProbes()[0].GetFailureThreshold() != 2 {
		t.Fatalf("probes in the workload: %v", w.GetProbes())
	}
	for name, spec := range map[string]Spec{
		"same version":   {Version: "1.0", Runtime: "containerd", Image: host + "/robots/clock:2"},
		"missing tag":    {Version: "3", Runtime: "containerd", Image: host + "/robots/clock:3"},
		"other registry": {Version: "4", Runtime: "containerd", Image: "docker.io/library/busybox:1"},
		"unknown digest": {Version: "5", Runtime: "containerd", Image: host + "/robots/clock@" + digest.FromString("x").String()},
		"bad runtime":    {Version: "6", Runtime: "docker", Image: host + "/robots/clock:1"},
		"bad version":    {Version: "../x", Runtime: "containerd", Image: host + "/robots/clock:1"},
		"bad env":        {Version: "7", Runtime: "containerd", Image: host + "/robots/clock:1", Env: []string{"=x"}},
		"bad restart":    {Version: "8", Runtime: "containerd", Image: host + "/robots/clock:1", Restart: "sometimes"},
		"two checks":     {Version: "9", Runtime: "containerd", Image: host + "/robots/clock:1", Probes: []Probe{{HTTP: "http://x/", TCP: "x:1"}}},
		"no check":       {Version: "10", Runtime: "containerd", Image: host + "/robots/clock:1", Probes: []Probe{{PeriodSeconds: 5}}},
		"bad url":        {Version: "11", Runtime: "containerd", Image: host + "/robots/clock:1", Probes: []Probe{{HTTP: "ftp://x"}}},
		"bad port":       {Version: "13", Runtime: "containerd", Image: host + "/robots/clock:1", Ports: []Port{{Port: 80, Protocol: "sctp"}}},
		"key sans label": {Version: "14", Runtime: "containerd", Image: host + "/robots/clock:1", Keys: []KeyNeed{{}}},
		"bad key label":  {Version: "15", Runtime: "containerd", Image: host + "/robots/clock:1", Keys: []KeyNeed{{Labels: map[string]string{"Bad Label": "x"}}}},
		"volume at /":    {Version: "16", Runtime: "containerd", Image: host + "/robots/clock:1", Volumes: []Volume{{Name: "data", Path: "/"}}},
		"volume name":    {Version: "17", Runtime: "containerd", Image: host + "/robots/clock:1", Volumes: []Volume{{Name: "../x", Path: "/data"}}},
		"bad tcp":        {Version: "12", Runtime: "containerd", Image: host + "/robots/clock:1", Probes: []Probe{{TCP: "nohost"}}},
	} {
		if _, err := a.CreateRelease(ctx, admin, "clock", spec); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := a.CreateRelease(ctx, admin, "nope", Spec{Version: "1", Runtime: "process", Image: "/bin/true"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("release of a missing app: %v", err)
	}
	rels, err := a.Releases(ctx, fleet.DefaultTenant, "clock")
	if err != nil || len(rels) != 2 {
		t.Fatalf("releases: %d %v", len(rels), err)
	}
}

// TestPinsBoxOverSiteOverRegion: each box runs the release of its
// narrowest pin; removing a pin falls back to the wider one, removing the
// last removes the workload; hand-written workloads are left alone.
func TestPinsBoxOverSiteOverRegion(t *testing.T) {
	t.Parallel()
	fl := boxes{box("bx-a", "east", "s1"), box("bx-b", "east", "s2"), box("bx-c", "west", "s3")}
	a, d := newApps(t, fl)
	a.CreateApp(ctx, admin, "clock", "")
	for _, v := range []string{"1", "2"} {
		if _, err := a.CreateRelease(ctx, admin, "clock", Spec{Version: v, Runtime: "containerd", Image: "robots/clock:" + v}); err != nil {
			t.Fatal(err)
		}
	}
	hand := &edgeboxv1.DesiredObject{Name: "manual", Spec: &edgeboxv1.DesiredObject_Workload{Workload: &edgeboxv1.Workload{App: "manual", Runtime: "process", Image: "/bin/sleep"}}}
	if _, err := d.Put(ctx, "bx-a", hand); err != nil {
		t.Fatal(err)
	}
	release := func(id string) string {
		if w := workloads(t, d, id)["clock"]; w != nil {
			return w.GetRelease()
		}
		return "-"
	}
	check := func(step string, want map[string]string) {
		t.Helper()
		for id, v := range want {
			if got := release(id); got != v {
				t.Errorf("%s: box %s runs %s, want %s", step, id, got, v)
			}
		}
	}
	if _, out, err := a.Deploy(ctx, admin, "clock", "1", ScopeRegion, "east"); err != nil || len(out.Changed) != 2 {
		t.Fatalf("deploy to east: %v %v", out, err)
	}
	check("region", map[string]string{"bx-a": "1", "bx-b": "1", "bx-c": "-"})
	a.Deploy(ctx, admin, "clock", "2", ScopeSite, "s2")
	check("site", map[string]string{"bx-a": "1", "bx-b": "2"})
	a.Deploy(ctx, admin, "clock", "2", ScopeBox, "bx-a")
	a.Deploy(ctx, admin, "clock", "1", ScopeSite, "s1") // narrower box pin still wins
	check("box", map[string]string{"bx-a": "2", "bx-b": "2"})

	// A sync with nothing new writes nothing.
	_, rev, _ := d.Live(ctx, "bx-a")
	if n, err := a.SyncBox(ctx, fl[0]); n != 0 || err != nil {
		t.Errorf("idle sync changed %d objects: %v", n, err)
	}
	if _, rev2, _ := d.Live(ctx, "bx-a"); rev2 != rev {
		t.Errorf("idle sync moved the revision from %d to %d", rev, rev2)
	}

	if _, err := a.Undeploy(ctx, admin, "clock", ScopeBox, "bx-a"); err != nil {
		t.Fatal(err)
	}
	check("box pin removed", map[string]string{"bx-a": "1"})
	a.Undeploy(ctx, admin, "clock", ScopeSite, "s1")
	a.Undeploy(ctx, admin, "clock", ScopeSite, "s2")
	check("site pins removed", map[string]string{"bx-a": "1", "bx-b": "1"})
	if err := a.DeleteApp(ctx, admin, "clock"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("deleting a deployed app: %v", err)
	}
	a.Undeploy(ctx, admin, "clock", ScopeRegion, "east")
	check("all pins removed", map[string]string{"bx-a": "-", "bx-b": "-"})
	if workloads(t, d, "bx-a")["manual"] == nil {
		t.Error("a hand-written workload was removed")
	}
	if _, err := a.Undeploy(ctx, admin, "clock", ScopeRegion, "east"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("undeploying what is not deployed: %v", err)
	}
	if err := a.DeleteApp(ctx, admin, "clock"); err != nil {
		t.Errorf("deleting an app deployed nowhere: %v", err)
	}
}

// TestNewBoxGetsPinnedApps: a box that joins a pinned region gets the app
// at its first sync; a box waiting for approval gets nothing.
func TestNewBoxGetsPinnedApps(t *testing.T) {
	t.Parallel()
	fl := boxes{box("bx-a", "east", "s1")}
	a, d := newApps(t, fl)
	a.CreateApp(ctx, admin, "clock", "")
	a.CreateRelease(ctx, admin, "clock", Spec{Version: "1", Runtime: "containerd", Image: "robots/clock:1"})
	if _, _, err := a.Deploy(ctx, admin, "clock", "1", ScopeRegion, "east"); err != nil {
		t.Fatal(err)
	}
	late := box("bx-late", "east", "s9")
	if n, err := a.SyncBox(ctx, late); n != 1 || err != nil {
		t.Fatalf("late box: %d %v", n, err)
	}
	if w := workloads(t, d, "bx-late")["clock"]; w == nil || w.GetImage() != host+"/robots/clock@"+d1.String() {
		t.Fatalf("late box's workload: %v", w)
	}
	waiting := box("bx-wait", "east", "s9")
	waiting.State = fleet.StatePending
	if n, _ := a.SyncBox(ctx, waiting); n != 0 {
		t.Error("a box in the waiting room got workloads")
	}
	for _, bad := range [][2]string{{"planet", "x"}, {ScopeRegion, "UPPER"}, {ScopeBox, "bx-missing"}} {
		if _, _, err := a.Deploy(ctx, admin, "clock", "1", bad[0], bad[1]); err == nil {
			t.Errorf("deploy to %s %s accepted", bad[0], bad[1])
		}
	}
	if _, _, err := a.Deploy(ctx, admin, "clock", "9", ScopeRegion, "east"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("deploy of a missing release: %v", err)
	}
}

// TestHellosReadTheCatalogueOnceUntilItChanges: the boxes' syncs at
// their hellos read a tenant's catalogue once, not once a box; this
// console's own deploy is seen by the next one at once, another
// replica's as soon as the watch brings it.
func TestHellosReadTheCatalogueOnceUntilItChanges(t *testing.T) {
	t.Parallel()
	s := &storetest.Observed{Store: storetest.Bolt(t), Prefix: "apps/", Lag: 500 * time.Millisecond}
	a, d := newAppsOn(t, s, boxes{})
	other, _ := newAppsOn(t, s.Store, boxes{}) // another replica, on the same store
	storetest.Run(t, a.Run)

	a.CreateApp(ctx, admin, "clock", "")
	for _, v := range []string{"1", "2"} {
		if _, err := a.CreateRelease(ctx, admin, "clock", Spec{Version: v, Runtime: "containerd", Image: "robots/clock:" + v}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := a.Deploy(ctx, admin, "clock", "1", ScopeRegion, "east"); err != nil {
		t.Fatal(err)
	}
	release := func(b fleet.Box) string {
		t.Helper()
		if _, err := a.SyncBox(ctx, b); err != nil {
			t.Fatal(err)
		}
		if w := workloads(t, d, b.ID)["clock"]; w != nil {
			return w.GetRelease()
		}
		return "-"
	}
	// Once the watch runs, a hundred hellos read it once.
	s.Settle(t, 1, "100 hellos", func() {
		for i := range 100 {
			if got := release(box(fmt.Sprintf("bx-%d", i), "east", "s1")); got != "1" {
				t.Fatalf("box %d runs %s, want 1", i, got)
			}
		}
	})
	deadline := time.Now().Add(10 * time.Second)

	// This console's own deploy: the very next hello has it.
	if _, _, err := a.Deploy(ctx, admin, "clock", "2", ScopeRegion, "west"); err != nil {
		t.Fatal(err)
	}
	if got := release(box("bx-w", "west", "s2")); got != "2" {
		t.Fatalf("after this console's deploy: the box runs %s, want 2", got)
	}
	// Another replica's: as soon as the watch brings it.
	if _, _, err := other.Deploy(ctx, admin, "clock", "2", ScopeRegion, "north"); err != nil {
		t.Fatal(err)
	}
	for got := ""; got != "2"; {
		if got = release(box("bx-n", "north", "s3")); got != "2" && time.Now().After(deadline.Add(10*time.Second)) {
			t.Fatalf("after another replica's deploy: the box runs %s, want 2", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
