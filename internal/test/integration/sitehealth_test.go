package integration

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console"
	"github.com/edgebox/edgebox/internal/test/etcdtest"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/internal/test/toxic"
)

// TestSiteHealthTellsALineFromADeath: three boxes of one site hear each
// other on their LAN (here three loopback addresses) and vote. Box 1's
// link to the console is cut: it is "disconnected-running" within three
// probe periods, as its two peers hear it. Its agent stopped, the peers
// no longer hear it and it is "down". Back, it is online. Alerts on both
// reach a webhook, which fails its first post, once per incident and
// once when each is resolved; none is left firing.
func TestSiteHealthTellsALineFromADeath(t *testing.T) {
	t.Parallel()
	const period = time.Second
	h := testenv.NewInProcess(t, testenv.Options{Console: func(c *console.Config) {
		c.SitePeriod, c.AlertEvery, c.AlertRetryMin = period, 500*time.Millisecond, 200*time.Millisecond
	}})
	hook := newWebhook(t, 1)
	if _, err := h.Admin().SetAlertRules(ctx(t), api.AlertRules{Rules: []api.AlertRule{{Kind: "box-offline"}, {Kind: "box-down"}},
		Webhooks: []api.Webhook{{URL: hook.URL}}}); err != nil {
		t.Fatal(err)
	}
	port := probePort(t)
	link := toxic.New(t, strings.TrimPrefix(h.URL(), "https://"))
	throughLink := func(c *agent.Config) {
		c.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, link.Addr())
		}
	}
	var boxes []testenv.Box
	listen := func(i int) func(*agent.Config) {
		return func(c *agent.Config) {
			c.SiteListen = []string{fmt.Sprintf("127.0.0.%d:%d", i+1, port)}
			if i == 0 {
				throughLink(c)
			}
		}
	}
	for i := range 3 {
		b := enrollOne(t, h, fmt.Sprintf("shop-%d", i+1))
		testenv.StartAgent(t, b, listen(i))
		boxes = append(boxes, b)
	}
	admin := h.Admin()
	health := func(id string) api.Box {
		b, err := admin.Box(ctx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	testenv.WaitFor(t, 30*time.Second, "the site online", func() bool {
		for _, b := range boxes {
			if health(b.ID()).Health != "online" {
				return false
			}
		}
		return true
	})
	// The boxes have their peers' lists, hear each other, and voted.
	one := boxes[0].ID()
	testenv.WaitFor(t, 30*time.Second, "box 1's site hearing it", func() bool {
		return strings.HasPrefix(health(one).HealthDetail, "2 of the 3 boxes of its site hear it")
	})
	link.Cut()
	cut := time.Now()
	testenv.WaitFor(t, 3*period+3*time.Second, "box 1 disconnected but running", func() bool {
		return health(one).Health == "disconnected-running"
	})
	t.Logf("box 1 was disconnected-running %v after its link was cut: %s", time.Since(cut).Round(100*time.Millisecond), health(one).HealthDetail)

	// The line back after longer than a vote counts for: box 1 sends the
	// votes it kept, which the console takes as history: they show it
	// ran all along.
	time.Sleep(6 * period)
	if err := link.Heal(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "box 1's votes showing it ran through the cut", func() bool {
		b := health(one)
		return b.RanUntil != nil && b.RanUntil.After(cut.Add(5*period))
	})
	testenv.WaitFor(t, 30*time.Second, "box 1's kept votes taken", func() bool {
		return strings.Contains(consoleMetrics(t, h), `edgebox_site_votes_total{result="kept"}`) &&
			!strings.Contains(consoleMetrics(t, h), `edgebox_site_votes_total{result="kept"} 0`)
	})
	if m := consoleMetrics(t, h); !strings.Contains(m, `edgebox_site_votes_total{result="refused"} 0`) {
		t.Fatalf("votes refused:\n%s", grepLines(m, "site_votes"))
	}
	t.Logf("votes: %s", strings.Join(strings.Fields(grepLines(consoleMetrics(t, h), "edgebox_site_votes_total{")), " "))
	link.Cut()
	testenv.WaitFor(t, 3*period+3*time.Second, "box 1 disconnected but running again", func() bool {
		return health(one).Health == "disconnected-running"
	})

	boxes[0].Stop(t)
	stopped := time.Now()
	testenv.WaitFor(t, 5*period+3*time.Second, "box 1 down once its agent stopped", func() bool { return health(one).Health == "down" })
	t.Logf("box 1 was down %v after its agent stopped: %s", time.Since(stopped).Round(100*time.Millisecond), health(one).HealthDetail)
	if b := health(boxes[1].ID()); b.Health != "online" {
		t.Fatalf("box 2: %s %s", b.Health, b.HealthDetail)
	}
	firing := func(kind string) bool {
		l, err := admin.Alerts(ctx(t), 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range l.Open {
			if in.Kind == kind && in.State == "firing" && in.Box == one {
				return true
			}
		}
		return false
	}
	testenv.WaitFor(t, 10*time.Second, "box-down firing", func() bool { return firing("box-down") && firing("box-offline") })

	if err := link.Heal(); err != nil {
		t.Fatal(err)
	}
	testenv.StartAgent(t, boxes[0], listen(0))
	testenv.WaitFor(t, 30*time.Second, "box 1 online again", func() bool { return health(one).Health == "online" })

	// Two cuts and a death: each incident told once, and its end once.
	testenv.WaitFor(t, 30*time.Second, "no alert left open", func() bool {
		l, err := admin.Alerts(ctx(t), 0)
		return err == nil && len(l.Open) == 0
	})
	testenv.WaitFor(t, 30*time.Second, "the webhook told of every incident's end", func() bool {
		return len(hook.took()) >= 6
	})
	time.Sleep(2 * time.Second) // for a post that should not come
	got := hook.took()
	for _, p := range got {
		t.Logf("posted: %s %s: %s", p.Status, p.Incident.Kind, p.Incident.Summary)
	}
	count := map[string]int{}
	perIncident := map[string]int{}
	for _, p := range got {
		if p.Incident.Box != one {
			t.Errorf("a post about another box: %+v", p)
		}
		count[p.Status+" "+p.Incident.Kind]++
		perIncident[p.Incident.ID+" "+p.Status]++
	}
	want := map[string]int{"firing box-offline": 2, "resolved box-offline": 2, "firing box-down": 1, "resolved box-down": 1}
	if fmt.Sprint(count) != fmt.Sprint(want) {
		t.Errorf("the webhook took %v, want %v", count, want)
	}
	for k, n := range perIncident {
		if n != 1 {
			t.Errorf("%s posted %d times", k, n)
		}
	}
	if hook.tries() != len(got)+1 {
		t.Errorf("the webhook was tried %d times for %d posts and one refusal", hook.tries(), len(got))
	}
}

// probePort is a UDP port free on loopback, for the boxes of a site to
// probe each other on, each on an address of its own.
func probePort(t *testing.T) int {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	return pc.LocalAddr().(*net.UDPAddr).Port
}

// TestReplicasJudgeASiteFromAllItsVotes: two console replicas on etcd, and
// three boxes of one site; box 1's tunnel goes to the first replica, boxes
// 2 and 3, which vote on it, go to the second. Box 1's link cut, both
// replicas call it disconnected-running: the first from the votes it
// gathers from the second. Its agent stopped, both call it down.
func TestReplicasJudgeASiteFromAllItsVotes(t *testing.T) {
	t.Parallel()
	const period = time.Second
	etcd := "etcd://" + etcdtest.Start(t) + "/site-replicas"
	h := testenv.NewInProcess(t, testenv.Options{Console: func(c *console.Config) {
		c.Store, c.ReplicaListen, c.SitePeriod = etcd, "127.0.0.1:0", period
	}})
	second, admin2 := secondReplica(t, h, etcd, func(c *console.Config) { c.SitePeriod = period })
	port := probePort(t)
	link := toxic.New(t, strings.TrimPrefix(h.URL(), "https://"))
	through := func(addr string) func(*agent.Config) {
		return func(c *agent.Config) {
			c.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			}
		}
	}
	boxAt := func(i int) func(*agent.Config) {
		to := second.Addr().String()
		if i == 0 {
			to = link.Addr()
		}
		return func(c *agent.Config) {
			c.SiteListen = []string{fmt.Sprintf("127.0.0.%d:%d", i+1, port)}
			through(to)(c)
		}
	}
	var boxes []testenv.Box
	for i := range 3 {
		b := enrollOne(t, h, fmt.Sprintf("branch-%d", i+1))
		testenv.StartAgent(t, b, boxAt(i))
		boxes = append(boxes, b)
	}
	health := func(c *api.Client, id string) api.Box {
		b, err := c.Box(ctx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	both := map[string]*api.Client{"first": h.Admin(), "second": admin2}
	one := boxes[0].ID()
	testenv.WaitFor(t, 30*time.Second, "box 1's peers, on the second replica, hearing it", func() bool {
		return strings.HasPrefix(health(admin2, one).HealthDetail, "2 of the 3 boxes of its site hear it")
	})
	if b := health(admin2, boxes[1].ID()); b.Replica == health(admin2, one).Replica {
		t.Fatalf("box 2 is on replica %s, as box 1: the test wants them apart", b.Replica)
	}

	link.Cut()
	cut := time.Now()
	for name, c := range both {
		testenv.WaitFor(t, 3*period+5*time.Second, "box 1 disconnected-running on the "+name+" replica", func() bool {
			return health(c, one).Health == "disconnected-running"
		})
		t.Logf("the %s replica: %s %v after the cut: %s", name, health(c, one).Health, time.Since(cut).Round(100*time.Millisecond), health(c, one).HealthDetail)
	}

	boxes[0].Stop(t)
	for name, c := range both {
		testenv.WaitFor(t, 5*period+5*time.Second, "box 1 down on the "+name+" replica", func() bool {
			return health(c, one).Health == "down"
		})
	}
}
