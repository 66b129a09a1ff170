//go:build linux

package browser

import (
	"context"
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

// TestWebVMScreen shows a real QEMU guest's screen in the web console,
// in Chromium: the console and the box's agent run in this process (the
// agent with the qemu driver, under TCG), the guest is pushed to the
// console's registry and deployed as a VM. An admin opens the VM's screen
// from the box's page and sees it painted, then watches it view only and
// sees the same; the Sessions page lists both screens; on a box kept to
// four eyes the page offers to ask for approval, a second maintainer
// approves the request on the Sessions page, and the screen opens and
// paints; a viewer is offered no screen. web/tests/screen.mjs says each
// step.
func TestWebVMScreen(t *testing.T) {
	vmtest.Require(t)
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	ctx := context.Background()
	admin := h.Admin()

	box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "robots"}), "vm-box")
	if err != nil {
		t.Fatal(err)
	}
	d := vmtest.Driver(t)
	testenv.StartAgent(t, box, func(c *agent.Config) { c.Drivers = []runtime.Driver{d}; c.Reconcile = time.Second })
	ref, err := name.ParseReference(testenv.RegistryHost(h) + "/robots/guest:1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := vm.Push(ref, vmtest.Files(t, t.TempDir(), 16), vm.Config{Cmdline: vmtest.Cmdline},
		remote.WithTransport(testenv.RegistryTransport(h)), remote.WithAuth(&authn.Basic{Username: "x", Password: h.AdminToken()})); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateApp(ctx, "guest", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateRelease(ctx, "guest", api.ReleaseSpec{Version: "1", Runtime: "qemu", Image: "robots/guest:1", MemoryBytes: 128 << 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Deploy(ctx, "guest", "1", "box", box.ID()); err != nil {
		t.Fatal(err)
	}
	// The page logs in with a password: an admin, a maintainer who
	// approves and a viewer of the test's, the console's own admin having
	// only its token here.
	for _, u := range []api.UserRequest{
		{Name: "ada", Password: "ada's long password", Role: "admin"},
		{Name: "max", Password: "max's long password", Role: "maintainer"},
		{Name: "vera", Password: "vera's long password", Role: "viewer"},
	} {
		if _, err := admin.CreateUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 120*time.Second, "the VM booted", func() bool {
		l, err := admin.Logs(ctx, box.ID(), "guest", 50)
		return err == nil && strings.Contains(l.Text, vmtest.Up)
	})

	t.Cleanup(func() { // what the box and the console said, when a step failed
		if !t.Failed() {
			return
		}
		if st, err := admin.BoxState(context.Background(), box.ID()); err == nil {
			for _, s := range st.Statuses {
				t.Logf("box: %s/%s %s %s %s", s.Kind, s.Name, s.Phase, s.Health, s.Message)
			}
		}
		recs, _ := admin.Sessions(context.Background(), false, "")
		for _, r := range recs {
			t.Logf("session %s: %s of %s by %s, view only %v, ended by %q, %d bytes in, %d out", r.ID, r.Kind, r.Workload, r.User, r.ViewOnly, r.EndedBy, r.BytesIn, r.BytesOut)
		}
		ends, _ := admin.AuditQuery(context.Background(), api.AuditQuery{Action: "screen.", Limit: 20})
		for _, e := range ends {
			t.Logf("audit: %s %s %s: %s", e.Action, e.Actor, e.Result, e.Detail)
		}
	})
	runScript(t, "screen.mjs",
		"EDGEBOX_URL="+h.URL(),
		"EDGEBOX_ADMIN=ada",
		"EDGEBOX_ADMIN_PASSWORD=ada's long password",
		"EDGEBOX_MAINTAINER=max",
		"EDGEBOX_MAINTAINER_PASSWORD=max's long password",
		"EDGEBOX_VIEWER=vera",
		"EDGEBOX_VIEWER_PASSWORD=vera's long password",
		"EDGEBOX_BOX="+box.ID(),
		"EDGEBOX_SITE=robots",
		"EDGEBOX_WORKLOAD=guest",
		"EDGEBOX_SCREENSHOTS="+screenshots(t))

	// What the page opened, the console recorded: three screens of the VM
	// by ada, ended, that showed the screen; the second view only; the
	// third asked for under four eyes and approved by max. Then a request
	// ada closed before anyone approved it.
	recs, err := admin.Sessions(ctx, false, box.ID())
	if err != nil || len(recs) != 4 {
		t.Fatalf("sessions on the box: %+v %v", recs, err)
	}
	closed, approved, watched, interactive := recs[0], recs[1], recs[2], recs[3] // newest first
	if closed.Kind != "screen" || closed.EndedBy != "user:ada" || closed.ApprovedBy != "" || closed.BytesOut != 0 {
		t.Errorf("the request closed before its approval: %+v", closed)
	}
	if !approved.FourEyes || approved.ApprovedBy != "max" || approved.ViewOnly {
		t.Errorf("the screen asked for under four eyes: %+v", approved)
	}
	for _, r := range []api.SessionRecord{interactive, watched, approved} {
		if r.Kind != "screen" || r.Workload != "guest" || r.User != "ada" || r.Live() || r.BytesOut == 0 {
			t.Errorf("a screen the page opened: %+v", r)
		}
	}
	if interactive.ViewOnly || !watched.ViewOnly {
		t.Errorf("view only: the first screen %v, the second %v", interactive.ViewOnly, watched.ViewOnly)
	}
}
