package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console"
	"github.com/edgebox/edgebox/internal/test/netlab"
	"github.com/edgebox/edgebox/internal/test/require"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/internal/test/toxic"
)

// TestSiteHealthInNetworkNamespaces: three boxes of a branch, each an
// agent in a network namespace of its own, on a bridge that is the
// branch's LAN, each reaching the console through a line of its own (a
// link to the test's namespace and a proxy there). Box 1's line is cut
// with iptables: it is disconnected-running within three probe periods
// of the console losing it, its workload runs on and keeps its key's
// lease, and a rollout over the branch updates the two others and holds
// it, neither telling nor failing it. Its agent and
// workload killed, it is down. The whole branch's line cut, the site is
// unreachable and its boxes unknown, never down; back, their kept votes
// show they ran all along. Healed, every box is online and no alert is
// left open; each incident reached the webhook once, and its end once.
func TestSiteHealthInNetworkNamespaces(t *testing.T) {
	t.Parallel()
	require.Root(t, "network namespaces and iptables in them need root")
	require.Tools(t, "apt-get install iproute2 iptables", "ip", "iptables")
	const period = time.Second
	h := testenv.NewInProcess(t, testenv.Options{Console: func(c *console.Config) {
		c.SitePeriod, c.AlertEvery, c.AlertRetryMin = period, 500*time.Millisecond, 200*time.Millisecond
		// A line that drops everything is noticed after DeadAfter.
		c.Tunnel.PingInterval, c.Tunnel.PingTimeout, c.Tunnel.DeadAfter = 500*time.Millisecond, time.Second, 2*time.Second
	}})
	admin := h.Admin()

	lab := netlab.New(t)
	lan := lab.Host("lan")
	lan.Bridge("br0")
	type branchBox struct {
		testenv.Box
		host *netlab.Host
		args []string
	}
	var boxes []branchBox
	for i := 1; i <= 3; i++ {
		host := lab.Host(fmt.Sprintf("b%d", i))
		lan.Attach("br0", host, "lan0", fmt.Sprintf("10.77.0.%d/24", i))
		host.Uplink("wan0", fmt.Sprintf("10.231.%d.2/30", i), fmt.Sprintf("10.231.%d.1/30", i))
		proxy := toxic.NewConnectProxyAt(t, fmt.Sprintf("10.231.%d.1:0", i), "branch", "line")
		b, err := testenv.EnrollBinary(t, h.Token(t, api.TokenRequest{Region: "east", Site: "branch-7"}), fmt.Sprintf("teller-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		for d := b.DataDir(); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
			os.Chmod(d, 0o711) // its robot runs as a user of its own
		}
		args := []string{}
		if i == 1 { // box 1 has a bank's key, leased to its robot
			sim := filepath.Join(t.TempDir(), "usb-sim.json")
			if err := os.WriteFile(sim, []byte(`{"keys": [{"port": "1-1", "vendor_id": "096e", "product_id": "0702", "serial": "ICBC0001", "class": "smartcard"}]}`), 0o644); err != nil {
				t.Fatal(err)
			}
			args = append(args, "--usb-sim", sim)
		}
		bb := branchBox{Box: b, host: host, args: []string{"--proxy", "http://branch:line@" + proxy.Addr,
			"--site-listen", fmt.Sprintf("10.77.0.%d:7946", i), "--containerd", "/nonexistent/containerd.sock",
			"--workload-uids", fmt.Sprint(770000 + 10000*i)}}
		bb.args = append(bb.args, args...)
		testenv.StartAgentIn(t, b, host.Name, bb.args...)
		boxes = append(boxes, bb)
	}
	health := func(id string) api.Box {
		b, err := admin.Box(ctx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	one := boxes[0].ID()
	testenv.WaitFor(t, 60*time.Second, "the branch online, each box heard by its site", func() bool {
		for _, b := range boxes {
			if !strings.HasPrefix(health(b.ID()).HealthDetail, "2 of the 3 boxes of its site hear it") {
				return false
			}
		}
		return true
	})
	// Alerts from here on: a box is offline from its enrollment until its
	// tunnel first comes up.
	hook := newWebhook(t, 0)
	if _, err := admin.SetAlertRules(ctx(t), api.AlertRules{Rules: []api.AlertRule{{Kind: "box-offline"}, {Kind: "box-down"}},
		Webhooks: []api.Webhook{{URL: hook.URL}}}); err != nil {
		t.Fatal(err)
	}
	// The branch runs robot 1.
	if _, err := admin.CreateApp(ctx(t), "robot", ""); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"1", "2"} {
		if _, err := admin.CreateRelease(ctx(t), "robot", api.ReleaseSpec{Version: v, Runtime: "process", Image: "/bin/sh",
			Args: []string{"-c", "trap 'exit 0' TERM; while :; do sleep 1; done # robot " + v}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.Deploy(ctx(t), "robot", "1", "site", "branch-7"); err != nil {
		t.Fatal(err)
	}
	runs := func(id string) string {
		st, err := admin.BoxState(ctx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range st.Statuses {
			if s.Kind == "Workload" && s.Name == "robot" && s.Phase == "Running" {
				return s.Release
			}
		}
		return ""
	}
	running := func() bool { return runs(one) != "" }
	testenv.WaitFor(t, 30*time.Second, "the robot running on the branch's boxes", func() bool {
		for _, b := range boxes {
			if runs(b.ID()) != "1" {
				return false
			}
		}
		return true
	})
	var key api.Key
	testenv.WaitFor(t, 30*time.Second, "box 1's key reported", func() bool {
		ks, err := admin.Keys(ctx(t), one, nil)
		if err != nil || len(ks) != 1 {
			return false
		}
		key = ks[0]
		return true
	})
	if _, err := admin.Lease(ctx(t), key.ID, "robot"); err != nil {
		t.Fatal(err)
	}
	leased := func() bool {
		ks, err := admin.Keys(ctx(t), one, nil)
		if err != nil {
			t.Fatal(err)
		}
		return len(ks) == 1 && ks[0].Holder == "robot"
	}
	agentPIDs := len(boxes[0].host.PIDs())

	// Box 1's line cut.
	boxes[0].host.Cut("wan0")
	cut := time.Now()
	testenv.WaitFor(t, 20*time.Second, "box 1 without a tunnel", func() bool { return !health(one).Online })
	lost := time.Now()
	testenv.WaitFor(t, 3*period+2*time.Second, "box 1 disconnected but running", func() bool {
		return health(one).Health == "disconnected-running"
	})
	t.Logf("box 1's line cut: the console lost its tunnel after %v, and it was disconnected-running %v later",
		lost.Sub(cut).Round(100*time.Millisecond), time.Since(lost).Round(100*time.Millisecond))
	time.Sleep(3 * period)
	if n := len(boxes[0].host.PIDs()); n < agentPIDs {
		t.Errorf("box 1 runs %d processes after its line was cut, %d before: its robot stopped", n, agentPIDs)
	}
	if h := health(one).Health; h != "disconnected-running" {
		t.Errorf("box 1 is %s three periods into its cut", h)
	}
	if !leased() {
		t.Error("box 1's key lost its lease while its line was down")
	}
	// A rollout of robot 2 over the branch: the two boxes with a line
	// update; box 1 is held, neither told nor failed.
	ro, err := admin.CreateRollout(ctx(t), api.RolloutRequest{App: "robot", From: "1", To: "2", Site: "branch-7",
		Waves: []string{"100%"}, Gate: "1s", BoxTimeout: "10s", MaxUnavailable: 3})
	if err != nil {
		t.Fatal(err)
	}
	rolloutBox := func(id string) api.RolloutBox {
		r, err := admin.Rollout(ctx(t), ro.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r.State != "running" {
			t.Fatalf("the rollout is %s: %s", r.State, r.Reason)
		}
		for _, g := range r.Groups {
			for _, b := range g.Boxes {
				if b.ID == id {
					return b
				}
			}
		}
		t.Fatalf("box %s is not in the rollout", id)
		return api.RolloutBox{}
	}
	testenv.WaitFor(t, 60*time.Second, "boxes 2 and 3 updated, box 1 held", func() bool {
		return rolloutBox(boxes[1].ID()).Phase == "done" && rolloutBox(boxes[2].ID()).Phase == "done" &&
			rolloutBox(one).Phase == "held" && strings.Contains(rolloutBox(one).Reason, "line is down")
	})

	// Box 1 dies: its agent and its robot killed.
	testenv.KillAgent(t, boxes[0].Box)
	for _, pid := range boxes[0].host.PIDs() {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	died := time.Now()
	testenv.WaitFor(t, 5*period+3*time.Second, "box 1 down", func() bool { return health(one).Health == "down" })
	t.Logf("box 1 was down %v after it died: %s", time.Since(died).Round(100*time.Millisecond), health(one).HealthDetail)
	firing := func(id, kind string) bool {
		l, err := admin.Alerts(ctx(t), 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range l.Open {
			if in.Kind == kind && in.State == "firing" && in.Box == id {
				return true
			}
		}
		return false
	}
	testenv.WaitFor(t, 10*time.Second, "box 1's alerts firing", func() bool { return firing(one, "box-down") && firing(one, "box-offline") })
	time.Sleep(12 * time.Second) // past the rollout's box timeout
	if b := rolloutBox(one); b.Phase != "held" {
		t.Fatalf("box 1 is %s in the rollout while it is down: %s", b.Phase, b.Reason)
	}
	boxes[0].host.Heal("wan0")
	testenv.StartAgentIn(t, boxes[0].Box, boxes[0].host.Name, boxes[0].args...)
	testenv.WaitFor(t, 60*time.Second, "box 1 online again, its robot back", func() bool { return health(one).Online && running() })
	if !leased() {
		t.Error("box 1's key lost its lease")
	}
	testenv.WaitFor(t, 60*time.Second, "the rollout done, box 1 updated once back", func() bool {
		r, err := admin.Rollout(ctx(t), ro.ID)
		return err == nil && r.State == "done" && runs(one) == "2"
	})

	// The whole branch's line cut: the console has nothing to go on.
	testenv.WaitFor(t, 30*time.Second, "box 1 heard by its site again", func() bool {
		return strings.HasPrefix(health(one).HealthDetail, "2 of the 3 boxes of its site hear it")
	})
	for _, b := range boxes {
		b.host.Cut("wan0")
	}
	siteCut := time.Now()
	deadline := siteCut.Add(8 * period)
	unknownAll := false
	for time.Now().Before(deadline) || !unknownAll {
		unknownAll = true
		for _, b := range boxes {
			x := health(b.ID())
			if x.Health == "down" {
				t.Fatalf("box %s is down while its whole site is out of sight: %s", x.Name, x.HealthDetail)
			}
			if x.Online || x.Health != "unknown" || !strings.Contains(x.HealthDetail, "site unreachable") {
				unknownAll = false
			}
		}
		if time.Since(siteCut) > 40*time.Second {
			t.Fatal("the branch's boxes never all showed unknown, site unreachable")
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, b := range boxes {
		b.host.Heal("wan0")
	}
	testenv.WaitFor(t, 60*time.Second, "the branch's kept votes showing it ran all along", func() bool {
		for _, b := range boxes {
			x := health(b.ID())
			if !x.Online || x.RanUntil == nil || !x.RanUntil.After(siteCut.Add(6*period)) {
				return false
			}
		}
		return true
	})

	// Healed: no alert left open, each incident posted once, its end once.
	testenv.WaitFor(t, 30*time.Second, "no alert left open", func() bool {
		l, err := admin.Alerts(ctx(t), 0)
		return err == nil && len(l.Open) == 0
	})
	time.Sleep(2 * time.Second) // for a post that should not come
	perIncident := map[string]int{}
	kinds := map[string]int{}
	for _, p := range hook.took() {
		perIncident[p.Incident.ID+" "+p.Status]++
		kinds[p.Status+" "+p.Incident.Kind]++
	}
	for k, n := range perIncident {
		if n != 1 {
			t.Errorf("%s posted %d times", k, n)
		}
	}
	// Box 1's cut and death, then the branch's cut: box-offline for
	// each box (box 1 twice), box-down for box 1 once.
	want := map[string]int{"firing box-offline": 4, "resolved box-offline": 4, "firing box-down": 1, "resolved box-down": 1}
	if fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Errorf("the webhook took %v, want %v", kinds, want)
	}
}
