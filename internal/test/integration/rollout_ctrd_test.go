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
// built binaries and a real containerd: the box pre-pulls the new image
// while it runs the old one (the registry's access log shows it), moves,
// and its region ends pinned to the new release. Then a release whose
// probe fails stops at its first wave, and the box goes back to the old
// release from its own cache: the access log shows no pull after the stop.
// (One box: two agents on one host share edgebox's cgroups and workload
// bridge, and each sweeps the other's containers; the two-region rollout
// of real agents is TestRolloutOverTwoRegions, with native processes.)
func TestContainerRolloutPrePullsAndGoesBackWithNoPull(t *testing.T) {
	h := testenv.NewBinaries(t)
	img := ctrdtest.BusyboxImg(t)
	refs := map[string]string{}
	for _, v := range []string{"1", "2", "3"} {
		// The same files, another digest each.
		refs[v] = testenv.PushImage(t, h, "robots/clock:"+v, mutate.Annotations(img, map[string]string{"release": v}).(v1.Image))
	}
	region := map[string]string{}
	for _, r := range []string{"east"} {
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
	for v, probe := range map[string][]string{"1": {"/bin/sh -c true"}, "2": {"/bin/sh -c true"}, "3": {"/bin/sh -c false", "--probe-failures", "1"}} {
		cli(append([]string{"release", "create", "--app", "clock", "--version", v, "--image", host + "/robots/clock:" + v,
			"--probe-period", "1", "--probe-exec"}, probe...)...)
	}
	cli("deploy", "clock@1", "--region", "east")
	admin := h.Admin()
	running := func(want map[string]string) bool {
		s, err := admin.AppStatus(ctx(t), "clock")
		if err != nil || len(s.Boxes) != len(want) {
			return false
		}
		for _, b := range s.Boxes {
			if b.RunningRelease != want[region[b.BoxID]] || b.Phase != "Running" || b.Health != "healthy" {
				return false
			}
		}
		return true
	}
	testenv.WaitFor(t, 3*time.Minute, "clock 1 running healthy", func() bool { return running(map[string]string{"east": "1"}) })

	r, err := admin.CreateRollout(ctx(t), api.RolloutRequest{App: "clock", From: "1", To: "2", Regions: []string{"east"}, Gate: "2s", BoxTimeout: "2m"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Prefetch == nil || r.Prefetch.Image != refs["2"] {
		t.Fatalf("pre-pull: %+v, want %s", r.Prefetch, refs["2"])
	}
	testenv.WaitFor(t, 3*time.Minute, "the rollout done", func() bool {
		r, err = admin.Rollout(ctx(t), r.ID)
		if err == nil && r.State == "stopped" {
			for id := range region {
				st, _ := admin.BoxState(ctx(t), id)
				for _, e := range st.Events {
					t.Logf("%s %s: %s %s/%s %s", region[id], e.Time.Format("15:04:05.000"), e.Reason, e.Kind, e.Name, e.Message)
				}
			}
			t.Fatalf("stopped: %s; %+v", r.Reason, r.Groups)
		}
		return err == nil && r.State == "done"
	})
	testenv.WaitFor(t, time.Minute, "clock 2 running healthy", func() bool { return running(map[string]string{"east": "2"}) })
	if p := r.Prefetch; p.Asked != 1 || p.OnDisk != 1 {
		t.Errorf("pre-pull: %+v, want the box asked and with 2 on disk", p)
	}
	// The end is stored first, the region's pin written next.
	var got map[string]string
	testenv.WaitFor(t, 30*time.Second, "the region pinned to 2 and the box's own pin gone", func() bool {
		pins, err := admin.Pins(ctx(t), "clock")
		got = map[string]string{}
		for _, p := range pins {
			got[p.Scope+" "+p.Target] = p.Version
		}
		return err == nil && len(got) == 1 && got["region east"] == "2"
	})
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
	if len(pulledBy) != 1 {
		t.Errorf("the access log shows no pull of %s by the box", d2)
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
	testenv.WaitFor(t, 2*time.Minute, "clock 2 running healthy again", func() bool { return running(map[string]string{"east": "2"}) })
	for _, line := range strings.Split(h.ConsoleLog()[stoppedAt:], "\n") {
		if strings.Contains(line, "box pull") {
			t.Errorf("a box pulled after the stop: %s", line)
		}
	}
}
