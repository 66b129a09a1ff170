//go:build linux

package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/ctrdtest"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// TestDeployToARegion is the one-click deploy with the built binaries: an
// image pushed to the console's registry, an app and a release made with
// the CLI, deployed to a region of 3 boxes each with its own real
// containerd. All 3 pull it through their tunnels and run it, its logs
// come back through the API, and undeploying stops and removes it on all.
func TestDeployToARegion(t *testing.T) {
	h := testenv.NewBinaries(t)
	img := ctrdtest.BusyboxImg(t)
	testenv.PushImage(t, h, "robots/clock:1.0.0", img)

	const n = 3
	var boxes []testenv.Box
	for i := range n {
		sock := ctrdtest.Start(t)
		box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "shop-" + string(rune('a'+i))}), "clock-box-"+string(rune('a'+i)))
		if err != nil {
			t.Fatal(err)
		}
		testenv.StartAgentArgs(t, box, "--containerd", sock, "--runc-root", ctrdtest.RuncRoot(sock))
		boxes = append(boxes, box)
	}
	other, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "west", Site: "elsewhere"}), "west-box")
	if err != nil {
		t.Fatal(err)
	}
	other.Start(t)

	cli := func(args ...string) string {
		t.Helper()
		out, err := h.CLI(t, args...)
		if err != nil {
			t.Fatalf("edgebox %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	cli("app", "create", "clock", "--description", "says hello")
	out := cli("release", "create", "--app", "clock", "--version", "1.0.0",
		"--image", testenv.RegistryHost(h)+"/robots/clock:1.0.0", "--env", "GREETING=deployed", "--memory", "64Mi",
		"--probe-exec", "/bin/sh -c true", "--probe-period", "1", "--volume", "state:/var/lib/clock")
	if !strings.Contains(out, "@sha256:") {
		t.Fatalf("release not resolved to a digest: %s", out)
	}
	if out, err := h.CLI(t, "release", "create", "--app", "clock", "--version", "1.0.1", "--image", testenv.RegistryHost(h)+"/robots/clock:nope"); err == nil || !strings.Contains(out, "no tag") {
		t.Fatalf("release of a missing tag: %v %s", err, out)
	}
	start := time.Now()
	out = cli("deploy", "clock@1.0.0", "--region", "east")
	if !strings.Contains(out, "3 boxes") {
		t.Fatalf("deploy: %s", out)
	}
	took := testenv.WaitFor(t, 180*time.Second, "clock running on the 3 boxes of east", func() bool {
		s, err := h.Admin().AppStatus(ctx(t), "clock")
		if err != nil || len(s.Boxes) != n {
			return false
		}
		for _, b := range s.Boxes {
			if b.Phase != "Running" || b.RunningRelease != "1.0.0" || b.DesiredRelease != "1.0.0" || b.Health != "healthy" {
				return false
			}
		}
		return true
	})
	t.Logf("deployed to %d boxes, all running and healthy, %s after the deploy call (%s since start)", n, took, time.Since(start))
	status := cli("status", "clock")
	for _, want := range []string{"clock-box-a", "clock-box-c", "Running", "1.0.0", "healthy"} {
		if !strings.Contains(status, want) {
			t.Errorf("edgebox status clock lacks %q:\n%s", want, status)
		}
	}
	if strings.Contains(status, "west-box") {
		t.Errorf("the west box is in the app's status:\n%s", status)
	}
	for _, b := range boxes {
		var logs api.Logs
		testenv.WaitFor(t, 30*time.Second, "logs of "+b.ID(), func() bool {
			logs, err = h.Admin().Logs(ctx(t), b.ID(), "clock", 10)
			return err == nil && strings.Contains(logs.Text, "hello deployed")
		})
	}
	if out := cli("logs", boxes[0].ID(), "clock"); !strings.Contains(out, "hello deployed") {
		t.Errorf("edgebox logs: %q", out)
	}
	if _, err := h.Admin().Logs(ctx(t), boxes[0].ID(), "nothing-here", 10); err == nil || !strings.Contains(err.Error(), "no workload") {
		t.Errorf("logs of a missing workload: %v", err)
	}
	if s, _ := h.Admin().BoxState(ctx(t), other.ID()); len(s.Objects) != 0 {
		t.Errorf("the west box got %d desired objects", len(s.Objects))
	}
	if _, err := h.CLI(t, "app", "rm", "clock"); err == nil {
		t.Error("a deployed app was removed")
	}

	cli("undeploy", "clock", "--region", "east")
	testenv.WaitFor(t, 120*time.Second, "clock gone from the 3 boxes", func() bool {
		for _, b := range boxes {
			s, err := h.Admin().BoxState(ctx(t), b.ID())
			if err != nil || len(s.Objects) != 0 || len(s.Statuses) != 0 {
				return false
			}
		}
		return true
	})
	for _, b := range boxes {
		if _, err := h.Admin().Logs(ctx(t), b.ID(), "clock", 10); err == nil {
			t.Errorf("box %s still holds the clock container", b.ID())
		}
	}
	audit, err := h.Admin().Audit(context.Background(), 50, "")
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, e := range audit {
		actions = append(actions, e.Action)
	}
	for _, want := range []string{"app.create", "release.create", "app.deploy", "app.undeploy", "PUT image manifest"} {
		if !strings.Contains(strings.Join(actions, ","), want) {
			t.Errorf("audit log lacks %s: %v", want, actions)
		}
	}
}
