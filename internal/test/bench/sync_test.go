package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console/db"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/store"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// stored records when a box put each Sync batch on disk (just before it
// sends the ack).
type stored struct {
	mu  sync.Mutex
	at  []time.Time
	rev []uint64
}

func (s *stored) add(rev uint64) error {
	s.mu.Lock()
	s.at, s.rev = append(s.at, time.Now()), append(s.rev, rev)
	s.mu.Unlock()
	return nil
}

// when returns the time the box first stored revision rev or a later one.
func (s *stored) when(rev uint64) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range s.rev {
		if r >= rev {
			return s.at[i], true
		}
	}
	return time.Time{}, false
}

func (s *stored) last() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.rev) == 0 {
		return 0
	}
	return s.rev[len(s.rev)-1]
}

// BenchmarkSync measures, against the console binary and 1,000 real agents
// (EDGEBOX_BENCH_BOXES changes the count): the latency from an API write to
// the box storing it durably, at 100 writes/s across the fleet; then the
// catch-up after a console restart with every box 10 revisions behind.
func BenchmarkSync(b *testing.B) {
	n := boxCount(b, 1000)
	for range b.N {
		syncBench(b, n)
	}
}

func syncBench(b *testing.B, n int) {
	c, _, admin := startConsole(b)
	defer func() { c.kill() }()
	ctx := context.Background()
	dirs := enrollFleet(b, admin, n)

	var logTo io.Writer = io.Discard
	if p := os.Getenv("EDGEBOX_BENCH_AGENT_LOG"); p != "" {
		f, err := os.Create(p)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		logTo = f
	}
	quiet := slog.New(slog.NewTextHandler(logTo, nil))
	actx, stopAgents := context.WithCancel(ctx)
	var agents sync.WaitGroup
	defer func() { stopAgents(); agents.Wait() }()
	ids := make([]string, n)
	logs := make([]*stored, n)
	for i, dir := range dirs {
		logs[i] = &stored{}
		cfg := agent.DefaultConfig(dir)
		cfg.Hooks.AfterStore = logs[i].add
		a, err := agent.New(cfg, quiet)
		if err != nil {
			b.Fatal(err)
		}
		ids[i] = a.Identity().BoxID
		agents.Add(1)
		go func() { defer agents.Done(); a.Run(actx) }()
	}
	waitOnline(b, admin, n, 5*time.Minute, nil)

	// 100 writes/s for 30 s, spread over the fleet, from 8 API clients.
	const rate, seconds = 100, 30
	type write struct {
		box int
		rev uint64
		at  time.Time
	}
	var mu sync.Mutex
	var writes []write
	tick := time.NewTicker(time.Second / rate)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	rng := rand.New(rand.NewPCG(1, 2))
	for range rate * seconds {
		<-tick.C
		i := rng.IntN(n)
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			t0 := time.Now()
			rev, err := admin.PutDesired(ctx, ids[i], "Workload", fmt.Sprintf("w%d", t0.UnixNano()%20), workloadSpec(t0))
			if err != nil {
				b.Error(err)
				return
			}
			mu.Lock()
			writes = append(writes, write{i, rev, t0})
			mu.Unlock()
		}()
	}
	tick.Stop()
	wg.Wait()
	time.Sleep(3 * time.Second)
	var lat []time.Duration
	missing := 0
	for _, w := range writes {
		at, ok := logs[w.box].when(w.rev)
		if !ok {
			missing++
			continue
		}
		lat = append(lat, at.Sub(w.at))
	}
	if missing > 0 || len(lat) == 0 {
		b.Fatalf("%d of %d writes never reached their box", missing, len(writes))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	b.ReportMetric(float64(q(0.5).Microseconds())/1000, "sync-p50-ms")
	b.ReportMetric(float64(q(0.99).Microseconds())/1000, "sync-p99-ms")
	b.Logf("sync latency over %d writes at %d/s to %d boxes: p50 %v p90 %v p99 %v max %v",
		len(lat), rate, n, q(0.5), q(0.9), q(0.99), lat[len(lat)-1])

	// Catch-up: the console goes down; meanwhile every box's state moves
	// 10 revisions on (written to the console's store directly, as another
	// console of an HA pair would); the console comes back and the fleet
	// reconnects and catches up.
	c.kill()
	down := time.Now()
	targets := advanceOffline(b, c.data, ids, 10)
	restart := time.Now()
	c.start(b)
	var allOnline time.Duration
	var lastCheck time.Time
	for {
		if allOnline == 0 && time.Since(lastCheck) > 250*time.Millisecond {
			lastCheck = time.Now()
			if onlineCount(admin) == n {
				allOnline = time.Since(restart)
			}
		}
		behind := 0
		for i := range ids {
			if logs[i].last() < targets[i] {
				behind++
			}
		}
		if behind == 0 {
			break
		}
		if time.Since(restart) > 10*time.Minute {
			b.Fatalf("%d boxes still behind after 10 minutes", behind)
		}
		time.Sleep(50 * time.Millisecond)
	}
	storedAll := time.Since(restart)
	for i := 0; i < len(ids); {
		s, err := admin.BoxState(ctx, ids[i])
		if err != nil {
			b.Fatal(err)
		}
		if s.Acked == targets[i] {
			i++
			continue
		}
		time.Sleep(20 * time.Millisecond)
	}
	ackedAll := time.Since(restart)
	if allOnline == 0 {
		allOnline = storedAll
	}
	b.ReportMetric(storedAll.Seconds(), "catchup-s-all-stored")
	b.ReportMetric(ackedAll.Seconds(), "catchup-s-all-acked")
	b.Logf("catch-up: console down %v; after its restart %d boxes 10 revisions behind were all online in %v, had all stored in %v, all acks recorded in %v",
		restart.Sub(down).Round(time.Millisecond), n, allOnline.Round(time.Millisecond), storedAll.Round(time.Millisecond), ackedAll.Round(time.Millisecond))
}

// onlineCount is the number of boxes the console shows online, -1 on error.
func onlineCount(admin *api.Client) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bs, err := admin.Boxes(ctx)
	if err != nil {
		return -1
	}
	n := 0
	for _, x := range bs {
		if x.Online {
			n++
		}
	}
	return n
}

func workloadSpec(t time.Time) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"app":"robot","release":"%d","runtime":"containerd"}`, t.UnixNano()))
}

// advanceOffline writes k revisions for every box into the stopped
// console's store and returns each box's new revision.
func advanceOffline(b *testing.B, dir string, ids []string, k int) []uint64 {
	bdb, err := db.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer bdb.Close()
	st, err := store.OpenBolt(bdb)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	d := desired.New(st)
	out := make([]uint64, len(ids))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			for j := range k {
				o := &edgeboxv1.DesiredObject{Name: fmt.Sprintf("c%d", j), Spec: &edgeboxv1.DesiredObject_Workload{
					Workload: &edgeboxv1.Workload{App: "catchup", Release: "1", Runtime: "containerd"}}}
				rev, err := d.Put(context.Background(), id, o)
				if err != nil {
					b.Error(err)
					return
				}
				out[i] = rev
			}
		}()
	}
	wg.Wait()
	return out
}
