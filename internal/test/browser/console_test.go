package browser

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/require"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// webDir is the web app's source folder, where its tests and their
// node_modules (scripts/test-deps.sh) are.
func webDir(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..", "..", "web")
	require.File(t, filepath.Join(dir, "node_modules", "playwright-core", "package.json"), "npm ci in web/ (scripts/test-deps.sh)")
	return dir
}

// screenshots is where a test's screenshots go.
func screenshots(t *testing.T) string {
	base := os.Getenv("EDGEBOX_SCREENSHOTS")
	if base == "" {
		base = filepath.Join(os.TempDir(), "edgebox-screenshots")
	}
	dir := filepath.Join(base, t.Name())
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

// runScript runs web/tests/<script> with node, the console's URL and
// what else the script needs in its environment, and fails the test with
// the script's output when it fails.
func runScript(t *testing.T, script string, env ...string) string {
	t.Helper()
	require.Tools(t, "apt-get install nodejs chromium (scripts/test-deps.sh)", "node", "chromium")
	dir := webDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Join("tests", script))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		t.Log(l)
	}
	if err != nil {
		t.Fatalf("node tests/%s: %v", script, err)
	}
	return out.String()
}

// TestWebConsole walks the web console as an operator does, in Chromium:
// log in, enroll a box and read its install line, approve a waiting box
// and see it come online without reloading, open a box, switch to
// Chinese, come back after the session expired to the page left, see
// hostile names as text, roll a new release out through the rollouts
// page (approved by a second user, paused, resumed, aborted with its box
// sent back, then a second rollout through both waves on the real boxes),
// and log out; a viewer sees no button it may not use.
// web/tests/console.mjs says each step.
func TestWebConsole(t *testing.T) {
	t.Parallel()
	h := testenv.NewBinaries(t)
	ctx := context.Background()
	admin := h.Admin()

	// Two real agents: one approved at once, one waiting for approval,
	// the first box labelled with markup that the page must show as text.
	first, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "shop-1"}), "shop-1-box")
	if err != nil {
		t.Fatal(err)
	}
	waiting, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "shop-2", RequireApproval: true}), "shop-2-box")
	if err != nil {
		t.Fatal(err)
	}
	// Workloads' users pass through the agents' data directories to their
	// homes, as they do on a box (the agent's data directory is o+x).
	for _, b := range []testenv.Box{first, waiting} {
		for d := b.DataDir(); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
			os.Chmod(d, 0o711)
		}
	}
	// One simulated bank key on the first box, for the keys page.
	sim := filepath.Join(t.TempDir(), "usb-sim.json")
	if err := os.WriteFile(sim, []byte(`{"hubs": [{"port": "1-1"}], "keys": [{"port": "1-1.1", "vendor_id": "096e", "product_id": "0702",
		"serial": "ICBC0001", "manufacturer": "Feitian", "product": "ICBC <b>U-Key</b>", "class": "smartcard"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// Each agent has workload users of its own: an agent stops what runs
	// as its users when it replaces a workload, so two on one range stop
	// each other's.
	testenv.StartAgentArgs(t, first, "--usb-sim", sim, "--workload-uids", "2000000")
	testenv.StartAgentArgs(t, waiting, "--workload-uids", "2010000")
	// Workloads outlive their agent, as on a box: the clock the page
	// deploys is undeployed before the agents stop (cleanups run last
	// first), and the boxes remove it.
	t.Cleanup(func() {
		ctx := context.Background()
		// A rollout left running would pin boxes again: stopped first.
		rs, _ := admin.Rollouts(ctx)
		for _, r := range rs {
			admin.RolloutDo(ctx, r.ID, "abort", api.RolloutAction{})
		}
		pins, err := admin.Pins(ctx, "clock")
		if err != nil || len(pins) == 0 {
			return // never deployed
		}
		for _, p := range pins {
			if _, err := admin.Undeploy(ctx, "clock", p.Scope, p.Target); err != nil {
				t.Errorf("undeploy the clock from %s %s: %v", p.Scope, p.Target, err)
			}
		}
		testenv.WaitFor(t, 30*time.Second, "the boxes to remove the clock", func() bool {
			for _, b := range []testenv.Box{first, waiting} {
				st, err := admin.BoxState(context.Background(), b.ID())
				if err != nil {
					return false
				}
				for _, s := range st.Statuses {
					if s.Kind == "Workload" {
						return false
					}
				}
			}
			return true
		})
	})
	if _, err := admin.Label(ctx, first.ID(), map[string]string{"note": `<img src=x onerror="window.__xss=1">`}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateUser(ctx, api.UserRequest{Name: "vera", Password: "vera's long password", Role: "viewer"}); err != nil {
		t.Fatal(err)
	}
	// Rollouts wait for a second user's approval to start: otto, an
	// operator, gives it where the admin may not. The window of region
	// west, which has no box, is there to be shown.
	if _, err := admin.CreateUser(ctx, api.UserRequest{Name: "otto", Password: "otto's long password", Role: "operator"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.SetRolloutRules(ctx, api.RolloutRules{ApproveStart: true, Calendar: api.Calendar{Holidays: []string{"2026-10-01"}},
		Regions: map[string]api.UpdatePolicy{"west": {Zone: "Asia/Shanghai", Allow: []api.UpdateWindow{{Days: "workdays", From: "01:00", To: "05:00"}}}}}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "the first box online with its key", func() bool {
		b, err := admin.Box(ctx, first.ID())
		ks, kerr := admin.Keys(ctx, first.ID(), nil)
		return err == nil && b.Online && kerr == nil && len(ks) == 1
	})

	t.Cleanup(func() { // what the boxes said, when a step failed
		if !t.Failed() {
			return
		}
		for _, b := range []testenv.Box{first, waiting} {
			if st, err := admin.BoxState(context.Background(), b.ID()); err == nil {
				for _, s := range st.Statuses {
					t.Logf("box %s: %s/%s %s %s %s", b.ID(), s.Kind, s.Name, s.Phase, s.Health, s.Message)
				}
				for _, e := range st.Events {
					t.Logf("box %s event: %s %s/%s %s %s", b.ID(), e.Time.Format("15:04:05"), e.Kind, e.Name, e.Reason, e.Message)
				}
			}
		}
	})
	// The release's HTTP health probe: both boxes run on this one
	// machine, where the process runtime shares the host's network, so
	// they cannot both serve one port; the probe asks a server of the
	// test's instead.
	health := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") }))
	t.Cleanup(health.Close)
	runScript(t, "console.mjs",
		"EDGEBOX_PROBE_URL="+health.URL+"/healthz",
		"EDGEBOX_URL="+h.URL(),
		"EDGEBOX_ADMIN_PASSWORD="+h.AdminPassword(),
		"EDGEBOX_ADMIN_TOKEN="+h.AdminToken(),
		"EDGEBOX_VIEWER=vera",
		"EDGEBOX_VIEWER_PASSWORD=vera's long password",
		"EDGEBOX_OPERATOR=otto",
		"EDGEBOX_OPERATOR_PASSWORD=otto's long password",
		"EDGEBOX_FIRST_BOX="+first.ID(),
		"EDGEBOX_SCREENSHOTS="+screenshots(t))

	// What the page did, the console did.
	b, err := admin.Box(ctx, waiting.ID())
	if err != nil || b.State != "approved" {
		t.Errorf("the box approved in the page: %+v %v", b, err)
	}
	toks, err := admin.Tokens(ctx)
	if err != nil || len(toks) != 3 {
		t.Errorf("enrollment tokens after the page made one: %d %v", len(toks), err)
	}
	ks, err := admin.Keys(ctx, first.ID(), nil)
	if err != nil || len(ks) != 1 || ks[0].Holder != "robot" || ks[0].Labels["bank"] != "icbc" {
		t.Errorf("the key the page labelled and leased: %+v %v", ks, err)
	}
	// The page's first rollout was aborted with its box sent back, its
	// second went through: region east is on 1.1, with no box's own pin.
	rs, err := admin.Rollouts(ctx)
	if err != nil || len(rs) != 2 || rs[0].State != "done" || rs[1].State != "aborted" || rs[1].Progress.Reverted != 1 {
		t.Errorf("the rollouts the page made: %+v %v", rs, err)
	}
	pins, err := admin.Pins(ctx, "clock")
	if err != nil || len(pins) != 1 || pins[0].Scope != "region" || pins[0].Target != "east" || pins[0].Version != "1.1" {
		t.Errorf("the clock's pins after the rollouts: %+v %v", pins, err)
	}
}
