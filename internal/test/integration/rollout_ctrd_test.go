//go:build linux

package integration

import (
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/ctrdtest"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// TestContainerRolloutPrePullsAndGoesBackWithNoPull is a rollout with the
// built binaries and a real containerd per box, over two regions of one
// box each: both boxes pre-pull the new image while they run the old one
// (the registry's access log shows it), east goes first and west after,
// and each region ends pinned to the new release. Then a release whose
// probe fails stops at its first wave, and its box goes back to the old
// release from its own cache: the access log shows no pull after the stop.
func TestContainerRolloutPrePullsAndGoesBackWithNoPull(t *testing.T) {
	h := testenv.NewBinaries(t)
	img := ctrdtest.BusyboxImg(t)
	refs := map[string]string{}
	for _, v := range []string{"1", "2", "3"} {
		// The same files, another digest each.
		refs[v] = testenv.PushImage(t, h, "robots/clock:"+v, mutate.Annotations(img, map[string]string{"release": v}).(v1.Image))
	}
	region := map[string]string{}
	for _, r := range []string{"east", "west"} {
		sock := ctrdtest.Start(t)
		box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: r, Site: r + "-shop"}), r+"-box")
		if err != nil {
			t.Fatal(err)
		}
		testenv.StartAgentArgs(t, box, "--containerd", sock, "--runc-root", ctrdtest.RuncRoot(sock))
		region[box.ID()] = r
	}
	cli := func(args ...string) string {
		t.Helper()
		out, err := h.CLI(t, args...)
		if err != nil {
			t.Fatalf("edgebox %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	host := testenv.RegistryHost(h)
	cli("app", "create", "clock")
	for v, probe := range map[string]string{"1": "/bin/sh -c true", "2": "/bin/sh -c true", "3": "/bin/sh -c false"} {
		cli("release", "create", "--app", "clock", "--version", v, "--image", host+"/robots/clock:"+v, "--probe-exec", probe,
			"--probe-period", "1", "--probe-failures", "1")
	}
	cli("deploy", "clock@1", "--region", "east")
	cli("deploy", "clock@1", "--region", "west")
	admin := h.Admin()
	running := func(want map[string]string) bool {
		s, err := admin.AppStatus(ctx(t), "clock")
		if err != nil || len(s.Boxes) != 2 {
			return false
		}
		for _, b := range s.Boxes {
			if b.RunningRelease != want[region[b.BoxID]] || b.Phase != "Running" || b.Health != "healthy" {
				return false
			}
		}
		return true
	}
	testenv.WaitFor(t, 3*time.Minute, "clock 1 running healthy on both", func() bool { return running(map[string]string{"east": "1", "west": "1"}) })

	r, err := admin.CreateRollout(ctx(t), api.RolloutRequest{App: "clock", From: "1", To: "2", Regions: []string{"east", "west"}, Gate: "2s", BoxTimeout: "2m"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Prefetch == nil || r.Prefetch.Image != refs["2"] || r.Prefetch.Asked != 2 {
		t.Fatalf("pre-pull: %+v, want %s on 2 boxes", r.Prefetch, refs["2"])
	}
	testenv.WaitFor(t, 3*time.Minute, "the rollout done", func() bool {
		r, err = admin.Rollout(ctx(t), r.ID)
		if err == nil && r.State == "stopped" {
			t.Fatalf("stopped: %s", r.Reason)
		}
		return err == nil && r.State == "done"
	})
	testenv.WaitFor(t, time.Minute, "clock 2 running healthy on both", func() bool { return running(map[string]string{"east": "2", "west": "2"}) })
	pins, err := admin.Pins(ctx(t), "clock")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range pins {
		got[p.Scope+" "+p.Target] = p.Version
	}
	if len(got) != 2 || got["region east"] != "2" || got["region west"] != "2" {
		t.Errorf("pins after the rollout: %v, want each region's on 2", got)
	}
	log := h.ConsoleLog()
	d2 := refs["2"][strings.Index(refs["2"], "@")+1:]
	pulledBy := map[string]bool{}
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "box pull") && strings.Contains(line, d2) {
			for id := range region {
				if strings.Contains(line, id) {
					pulledBy[id] = true
				}
			}
		}
	}
	if len(pulledBy) != 2 {
		t.Errorf("the access log shows %d boxes pulling %s, want both", len(pulledBy), d2)
	}
	entries, _ := admin.Audit(ctx(t), 100, "clock@2")
	var order []string
	for _, e := range entries {
		if id, ok := strings.CutPrefix(e.Detail, "box "); ok && e.Action == "app.deploy" {
			order = append(order, region[id])
		}
	}
	if len(order) != 2 || order[0] != "east" || order[1] != "west" {
		t.Errorf("boxes told to move, by region: %v; want east, then west", order)
	}

	// 3's probe fails: the rollout stops at east's box, which goes back.
	bad, err := admin.CreateRollout(ctx(t), api.RolloutRequest{App: "clock", From: "2", To: "3", Regions: []string{"east"}, Gate: "2s", BoxTimeout: "2m"})
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Minute, "the failing rollout stopped", func() bool {
		bad, err = admin.Rollout(ctx(t), bad.ID)
		return err == nil && bad.State == "stopped"
	})
	stoppedAt := len(h.ConsoleLog())
	if b := bad.Groups[0].Boxes[0]; b.Phase != "failed" || !strings.HasPrefix(b.Reason, "probe") || !b.Reverted {
		t.Errorf("the box: %+v", b)
	}
	testenv.WaitFor(t, 2*time.Minute, "clock 2 running healthy again", func() bool { return running(map[string]string{"east": "2", "west": "2"}) })
	for _, line := range strings.Split(h.ConsoleLog()[stoppedAt:], "\n") {
		if strings.Contains(line, "box pull") {
			t.Errorf("a box pulled after the stop: %s", line)
		}
	}
}
