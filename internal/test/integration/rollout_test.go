//go:build linux

package integration

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/require"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// TestRolloutOverTwoRegions is a rollout with the built binaries: four
// real agents in two regions move from release 1 to 2 region by region,
// in waves gated on health, through a console killed (SIGKILL) halfway,
// and end with each region pinned to 2 and no box told twice. Then a
// rollout back to 1 waits while a workload holds an update lock through
// its agent's local API, and goes on once it is released; and a release
// whose probe fails stops at its first box, which goes back.
func TestRolloutOverTwoRegions(t *testing.T) {
	require.Root(t, "the process driver runs workloads under users of their own")
	h := testenv.NewBinaries(t)
	admin := h.Admin()
	region, dirs := map[string]string{}, map[string]string{}
	for i, b := range []struct{ region, site, name string }{
		{"north", "n1", "north-a"}, {"north", "n2", "north-b"}, {"east", "e1", "east-a"}, {"east", "e2", "east-b"},
	} {
		box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: b.region, Site: b.site}), b.name)
		if err != nil {
			t.Fatal(err)
		}
		// Workloads' users pass through the data directory, as on a box.
		for d := box.DataDir(); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
			os.Chmod(d, 0o711)
		}
		// Each agent its own workload users: an agent ends the processes
		// of its range it does not know.
		testenv.StartAgentArgs(t, box, "--workload-uids", strconv.Itoa(700000+i*10000))
		region[box.ID()], dirs[box.ID()] = b.region, box.DataDir()
	}
	cli := func(args ...string) string {
		t.Helper()
		out, err := h.CLI(t, args...)
		if err != nil {
			t.Fatalf("edgebox %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	cli("app", "create", "robot")
	for _, v := range []string{"1", "2"} {
		if _, err := admin.CreateRelease(ctx(t), "robot", api.ReleaseSpec{Version: v, Runtime: "process", Image: "/bin/sleep", Args: []string{"360" + v}}); err != nil {
			t.Fatal(err)
		}
	}
	// 3 never passes its probe: nothing listens on port 1.
	if _, err := admin.CreateRelease(ctx(t), "robot", api.ReleaseSpec{Version: "3", Runtime: "process", Image: "/bin/sleep", Args: []string{"3603"},
		Probes: []api.Probe{{TCP: "127.0.0.1:1", PeriodSeconds: 1, TimeoutSeconds: 1, FailureThreshold: 1}}}); err != nil {
		t.Fatal(err)
	}
	cli("deploy", "robot@1", "--region", "north")
	cli("deploy", "robot@1", "--region", "east")
	runAll := func(v string, within time.Duration) {
		t.Helper()
		var s api.AppStatus
		defer func() {
			if t.Failed() {
				t.Logf("robot's status: %+v", s)
			}
		}()
		testenv.WaitFor(t, within, "every box running robot "+v, func() bool {
			var err error
			s, err = admin.AppStatus(ctx(t), "robot")
			if err != nil || len(s.Boxes) != 4 {
				return false
			}
			for _, b := range s.Boxes {
				if b.Phase != "Running" || b.RunningRelease != v {
					return false
				}
			}
			return true
		})
	}
	runAll("1", 60*time.Second)

	out := cli("-o", "json", "rollout", "create", "robot", "1", "2", "--regions", "north,east", "--waves", "1,100%", "--gate", "3s", "--box-timeout", "1m")
	var r api.Rollout
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if r.Progress.Total != 4 || len(r.Groups) != 2 || r.Groups[0].Name != "north" {
		t.Fatalf("rollout planned as %+v", r)
	}
	start := time.Now()
	// Halfway, the console is killed and started again.
	testenv.WaitFor(t, 60*time.Second, "north's first wave through", func() bool {
		r, err := admin.Rollout(ctx(t), r.ID)
		return err == nil && r.Groups[0].Wave >= 1
	})
	h.RestartConsole(t)
	testenv.WaitFor(t, 120*time.Second, "the rollout done", func() bool {
		r, err := admin.Rollout(ctx(t), r.ID)
		if err == nil && (r.State == "stopped" || r.State == "aborted") {
			t.Fatalf("rollout %s: %s", r.State, r.Reason)
		}
		return err == nil && r.State == "done"
	})
	t.Logf("4 boxes in 2 regions moved in %s", time.Since(start).Round(time.Millisecond))
	runAll("2", 30*time.Second)
	// A rollout is stored done before the tick that finished it writes
	// its last pins (stored first, pinned after, so that a kill at any
	// point carries on): the pins settle within a tick or two.
	var pins []api.Pin
	testenv.WaitFor(t, 10*time.Second, "the region pins alone", func() bool {
		var err error
		if pins, err = admin.Pins(ctx(t), "robot"); err != nil {
			t.Fatal(err)
		}
		return len(pins) == 2
	})
	for _, p := range pins {
		if p.Scope != "region" || p.Version != "2" {
			t.Errorf("pin left after the rollout: %s %s @%s", p.Scope, p.Target, p.Version)
		}
	}
	if len(pins) != 2 {
		t.Errorf("%d pins, want the 2 regions'", len(pins))
	}
	// The audit log tells the story: each box told once, north's before
	// east's.
	entries, err := admin.Audit(ctx(t), 1000, "robot@2")
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(entries, func(a, b api.AuditEntry) int { return int(a.Seq) - int(b.Seq) })
	var order []string
	for _, e := range entries {
		if id, ok := strings.CutPrefix(e.Detail, "box "); ok && e.Action == "app.deploy" {
			if slices.Contains(order, id) {
				t.Errorf("box %s was told to run 2 twice", id)
			}
			order = append(order, id)
		}
	}
	if len(order) != 4 || region[order[0]] != "north" || region[order[1]] != "north" || region[order[2]] != "east" {
		t.Errorf("boxes told in the order %v, want north's two first", order)
	}
	if show := cli("rollout", "show", r.ID); !strings.Contains(show, "done") || !strings.Contains(show, "4/4 done") {
		t.Errorf("edgebox rollout show:\n%s", show)
	}

	// A workload on north's first box takes an update lock through its
	// agent's local API: a rollout back to 1 waits for it, and says so.
	lockBox := r.Groups[0].Boxes[0].ID
	sock := filepath.Join(dirs[lockBox], "api", "agent.sock")
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	lockDo := func(method, body string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://agent/v1/locks/robot", strings.NewReader(body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("%s lock: %s", method, resp.Status)
		}
	}
	lockDo("PUT", `{"reason":"signing a payment","ttl_seconds":300}`)
	back, err := admin.CreateRollout(ctx(t), api.RolloutRequest{App: "robot", From: "2", To: "1", Regions: []string{"north"}, Waves: []string{"1", "100%"}, Gate: "1s", BoxTimeout: "1m"})
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "the locked box held", func() bool {
		back, err = admin.Rollout(ctx(t), back.ID)
		b := back.Groups[0].Boxes[0]
		return err == nil && b.ID == lockBox && b.Phase == "held" && strings.HasPrefix(b.Reason, "update lock held by robot: signing a payment")
	})
	time.Sleep(3 * time.Second)
	if back, _ = admin.Rollout(ctx(t), back.ID); back.Groups[0].Boxes[0].Phase != "held" {
		t.Fatalf("the locked box moved: %+v", back.Groups[0].Boxes[0])
	}
	lockDo("DELETE", "")
	testenv.WaitFor(t, 60*time.Second, "the rollout back to 1 done", func() bool {
		back, err = admin.Rollout(ctx(t), back.ID)
		return err == nil && back.State == "done"
	})

	// A release whose probe fails: its first box fails and goes back to
	// 1, and the rollout stops there.
	bad, err := admin.CreateRollout(ctx(t), api.RolloutRequest{App: "robot", From: "1", To: "3", Regions: []string{"north"}, Gate: "3s", BoxTimeout: "1m"})
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 90*time.Second, "the failing rollout stopped", func() bool {
		bad, err = admin.Rollout(ctx(t), bad.ID)
		return err == nil && bad.State == "stopped"
	})
	first := bad.Groups[0].Boxes[0]
	if first.Phase != "failed" || !strings.HasPrefix(first.Reason, "probe") || !first.Reverted {
		t.Errorf("the first box: %+v", first)
	}
	if bad.Groups[0].Boxes[1].Phase != "waiting" {
		t.Errorf("the second box moved: %+v", bad.Groups[0].Boxes[1])
	}
	// The stop is stored first, the pin back to 1 written next.
	var s api.AppStatus
	testenv.WaitFor(t, 30*time.Second, "north back on 1, east on 2", func() bool {
		s, err = admin.AppStatus(ctx(t), "robot")
		if err != nil {
			return false
		}
		for _, b := range s.Boxes {
			want := map[string]string{"north": "1", "east": "2"}[region[b.BoxID]]
			if b.DesiredRelease != want || b.RunningRelease != want {
				return false
			}
		}
		return true
	})
	if ls := cli("rollout", "ls"); !strings.Contains(ls, bad.ID) || !strings.Contains(ls, "stopped") || !strings.Contains(ls, r.ID) {
		t.Errorf("edgebox rollout ls:\n%s", ls)
	}
}
