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

// TestAFailedReleaseGoesBackWithNoPull is a rollout with the built binaries
// and a real containerd: the box pre-pulls the new image while it runs
// the old one (the registry's access log shows it), the new release's
// probe fails, the rollout stops at its first wave, and the box goes back
// to the old release from its own cache: the access log shows no pull of
// the old image after the stop.
func TestAFailedReleaseGoesBackWithNoPull(t *testing.T) {
	h := testenv.NewBinaries(t)
	img := ctrdtest.BusyboxImg(t)
	refA := testenv.PushImage(t, h, "robots/clock:1", img)
	// Another image for 2: the same files, another digest.
	refB := testenv.PushImage(t, h, "robots/clock:2", mutate.Annotations(img, map[string]string{"release": "2"}).(v1.Image))
	sock := ctrdtest.Start(t)
	box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "shop-a"}), "ctrd-box")
	if err != nil {
		t.Fatal(err)
	}
	testenv.StartAgentArgs(t, box, "--containerd", sock, "--runc-root", ctrdtest.RuncRoot(sock))
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
	cli("release", "create", "--app", "clock", "--version", "1", "--image", host+"/robots/clock:1", "--probe-exec", "/bin/sh -c true", "--probe-period", "1")
	cli("release", "create", "--app", "clock", "--version", "2", "--image", host+"/robots/clock:2", "--probe-exec", "/bin/sh -c false",
		"--probe-period", "1", "--probe-failures", "1")
	cli("deploy", "clock@1", "--region", "east")
	admin := h.Admin()
	running := func(v string) bool {
		s, err := admin.AppStatus(ctx(t), "clock")
		return err == nil && len(s.Boxes) == 1 && s.Boxes[0].RunningRelease == v && s.Boxes[0].Phase == "Running" && s.Boxes[0].Health == "healthy"
	}
	testenv.WaitFor(t, 3*time.Minute, "clock 1 running healthy", func() bool { return running("1") })

	r, err := admin.CreateRollout(ctx(t), api.RolloutRequest{App: "clock", From: "1", To: "2", Regions: []string{"east"}, Gate: "2s", BoxTimeout: "2m"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Prefetch == nil || r.Prefetch.Image != refB {
		t.Fatalf("pre-pull: %+v, want %s", r.Prefetch, refB)
	}
	testenv.WaitFor(t, 2*time.Minute, "the rollout stopped", func() bool {
		r, err = admin.Rollout(ctx(t), r.ID)
		return err == nil && r.State == "stopped"
	})
	stoppedAt := len(h.ConsoleLog())
	if b := r.Groups[0].Boxes[0]; b.Phase != "failed" || !strings.HasPrefix(b.Reason, "probe") || !b.Reverted {
		t.Errorf("the box: %+v", b)
	}
	if r.Prefetch.OnDisk != 1 {
		t.Errorf("pre-pull: %+v, want the box to have had 2 on disk", r.Prefetch)
	}
	testenv.WaitFor(t, 2*time.Minute, "clock 1 running healthy again", func() bool { return running("1") })
	log := h.ConsoleLog()
	digestB := refB[strings.Index(refB, "@")+1:]
	if !strings.Contains(log[:stoppedAt], digestB) {
		t.Errorf("the access log shows no pull of %s before the stop", digestB)
	}
	digestA := refA[strings.Index(refA, "@")+1:]
	for _, line := range strings.Split(log[stoppedAt:], "\n") {
		if strings.Contains(line, "box pull") && (strings.Contains(line, digestA) || strings.Contains(line, "/robots/clock/")) {
			t.Errorf("the box pulled after the stop: %s", line)
		}
	}
}
