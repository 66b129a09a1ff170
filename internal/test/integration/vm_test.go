//go:build linux

package integration

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/images/vm"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/internal/test/vmtest"
)

// TestVMDeployedFromTheRegistry: a VM image pushed to the console's
// registry as an artifact becomes a release; deployed to a box, the agent
// pulls it through its tunnel and the qemu driver boots it on an overlay
// of the pulled disk; its serial console comes back through the API.
func TestVMDeployedFromTheRegistry(t *testing.T) {
	vmtest.Require(t)
	h := testenv.NewInProcess(t, testenv.Options{})
	d := vmtest.Driver(t)
	box := enrollOne(t, h, "vm-host")
	testenv.StartAgent(t, box, func(c *agent.Config) { c.Drivers = []runtime.Driver{d}; c.Reconcile = time.Second })

	deployGuest(t, h, box, []string{"GREETING=from-the-console"})
	admin := h.Admin()
	testenv.WaitFor(t, 120*time.Second, "the VM booted", func() bool {
		s, err := admin.AppStatus(ctx(t), "guest")
		if err != nil || len(s.Boxes) != 1 || s.Boxes[0].Phase != "Running" {
			return false
		}
		l, err := admin.Logs(ctx(t), box.ID(), "guest", 50)
		return err == nil && strings.Contains(l.Text, "hello from-the-console")
	})
	// The console counted what it served the box.
	if pulled := sumMetric(consoleMetrics(t, h), "edgebox_registry_served_bytes_total"); pulled < 10<<20 {
		t.Errorf("edgebox_registry_served_bytes_total = %v after the box pulled the VM's disk", pulled)
	}
	out, err := exec.Command("qemu-img", "info", "-U", d.OverlayPath("guest")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "backing file:") || !strings.Contains(string(out), "disk.qcow2") {
		t.Fatalf("the VM does not run on an overlay of the pulled disk: %v\n%s", err, out)
	}

	// The console gone, the VM lost, the agent restarted: the VM comes
	// back from the box's own store and image cache.
	box.Stop(t)
	h.StopConsole()
	if err := d.Stop(context.Background(), "guest", time.Second); err != nil {
		t.Fatal(err)
	}
	testenv.StartAgent(t, box, func(c *agent.Config) { c.Drivers = []runtime.Driver{d}; c.Reconcile = time.Second })
	testenv.WaitFor(t, 60*time.Second, "the VM back without the console", func() bool {
		in, err := d.Inspect(context.Background(), "guest")
		return err == nil && in.State == runtime.StateRunning
	})
	h.StartConsole(t)

	if _, err := admin.Undeploy(ctx(t), "guest", "box", box.ID()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, "the VM removed", func() bool {
		list, err := d.List(context.Background())
		return err == nil && len(list) == 0
	})
}

// deployGuest pushes the test guest to the console's registry as the
// app guest's release 1 (runtime qemu, 128 MiB, env) and deploys it to box.
func deployGuest(t *testing.T, h *testenv.InProcess, box testenv.Box, env []string) {
	t.Helper()
	ref, _ := name.ParseReference(testenv.RegistryHost(h) + "/robots/guest:1")
	if _, err := vm.Push(ref, vmtest.Files(t, t.TempDir(), 16), vm.Config{Cmdline: vmtest.Cmdline},
		remote.WithTransport(testenv.RegistryTransport(h)), remote.WithAuth(&authn.Basic{Username: "x", Password: h.AdminToken()})); err != nil {
		t.Fatal(err)
	}
	admin := h.Admin()
	if _, err := admin.CreateApp(ctx(t), "guest", "a tiny Linux VM"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateRelease(ctx(t), "guest", api.ReleaseSpec{Version: "1", Runtime: "qemu",
		Image: "robots/guest:1", Env: env, MemoryBytes: 128 << 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Deploy(ctx(t), "guest", "1", "box", box.ID()); err != nil {
		t.Fatal(err)
	}
}
