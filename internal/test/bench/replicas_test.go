package bench

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/etcdtest"
	"github.com/edgebox/edgebox/internal/test/fleetsim"
	"github.com/edgebox/edgebox/internal/test/haproxytest"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// BenchmarkReplicas runs the simulated fleet (EDGEBOX_BENCH_BOXES boxes,
// 2,000 unless set) against three console replicas as docs/ha.md deploys
// them: a three-member etcd (embedded in the benchmark), one --shared
// directory, HAProxy in TCP mode in front, and each replica's own address
// in the enrollment tokens (--also-addr). It reports the cold start, the
// memory per idle box on each replica, etcd's size and write rate while
// the fleet is idle and while the API writes 100 desired objects a second
// (with how long a write takes to be acked by its box), and a restart of
// all three replicas at once: how long until every box is online and
// synced, and the API meanwhile.
func BenchmarkReplicas(b *testing.B) {
	n := boxCount(b, 2000)
	bin := testenv.BuildBinaries(b)
	cluster := etcdtest.StartCluster(b, 3)
	store := "etcd://" + strings.Join(cluster.Endpoints(), ",") + "/bench"
	shared := b.TempDir()
	reps := make([]*consoleProc, 3)
	addrs := make([]string, len(reps))
	for i := range reps {
		addrs[i] = testenv.FreeAddr(b)
		reps[i] = &consoleProc{bin: bin, data: b.TempDir(), addr: addrs[i], url: "https://" + addrs[i],
			hc:   &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}},
			args: []string{"--store", store, "--shared", shared, "--replica-listen", testenv.FreeAddr(b)}}
	}
	lb := haproxytest.Start(b, addrs)
	public := "https://" + lb.Addr
	for _, r := range reps {
		r.public = public
		r.args = append(r.args, "--replica-url", "https://"+r.args[len(r.args)-1])
		// HAProxy holds two files a box, and a process here may hold
		// 20,000: the tokens also name each replica's own address, which
		// the boxes start at as often as at HAProxy's (docs/ha.md).
		for _, a := range addrs {
			r.args = append(r.args, "--also-addr", a)
		}
	}
	out := reps[0].start(b)
	token := ""
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "admin token:"); ok {
			token = strings.TrimSpace(v)
		}
	}
	for _, r := range reps[1:] {
		r.start(b)
	}
	defer func() {
		for _, r := range reps {
			r.kill()
		}
	}()
	for _, r := range reps {
		r.token = token
	}
	for i := range reps {
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if st, err := lb.Status(addrs[i]); err == nil && st == "UP" {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("HAProxy does not find replica %d up", i+1)
			}
		}
	}
	caPEM := fetch(b, reps[0].hc, public+"/api/v1/ca")
	admin, err := api.NewClient(public, token, caPEM)
	if err != nil {
		b.Fatal(err)
	}
	f := startFleet(b, admin, n)
	defer f.Close()
	sessions := func() (float64, error) {
		sum := 0.0
		for _, r := range reps {
			v, err := r.metric("edgebox_tunnel_sessions")
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	}
	start, err := f.StartAgents()
	if err != nil {
		b.Fatal(err)
	}
	waitOnline(b, admin, n, 5*time.Minute+time.Duration(n)*20*time.Millisecond, sessions)
	logFleet(b, "cold start", waitSynced(b, f, fleetsim.Window{Since: start}))

	// Memory per idle box on each replica.
	time.Sleep(10 * time.Second)
	var perBox []string
	for i, r := range reps {
		held, err := r.metric("edgebox_console_boxes_held")
		if err != nil {
			b.Fatal(err)
		}
		rss := procRSS(b, r.cmd.Process.Pid)
		perBox = append(perBox, fmt.Sprintf("replica %d: %.0f boxes, RSS %.0f MiB", i+1, held, rss/(1<<20)))
		if held > 0 {
			b.ReportMetric(rss/held/1024, fmt.Sprintf("idle-rss-KiB/box-replica%d", i+1))
		}
	}
	b.Logf("idle: %s", strings.Join(perBox, "; "))

	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	etcdStatus := func() (rev, size int64) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := cli.Status(ctx, cluster.Endpoints()[0])
		if err != nil {
			b.Fatal(err)
		}
		return st.Header.Revision, st.DbSize
	}
	rev0, _ := etcdStatus()
	t0 := time.Now()
	time.Sleep(30 * time.Second)
	rev1, size := etcdStatus()
	idleRate := float64(rev1-rev0) / time.Since(t0).Seconds()
	b.ReportMetric(idleRate, "etcd-idle-writes/s")
	b.ReportMetric(float64(size)/(1<<20), "etcd-db-MiB")

	// 100 writes a second through the load balancer for 30 s; one in
	// ten is followed until its box acks it.
	ids := f.IDs()
	var lagMu sync.Mutex
	var lags []time.Duration
	var followers sync.WaitGroup
	rev0, _ = etcdStatus()
	t0 = time.Now()
	tick := time.NewTicker(10 * time.Millisecond)
	failed := 0
	for i := 0; time.Since(t0) < 30*time.Second; i++ {
		<-tick.C
		box := ids[rand.N(len(ids))]
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		at := time.Now()
		rev, err := admin.PutDesired(ctx, box, "Workload", "robot",
			[]byte(fmt.Sprintf(`{"app":"robot","release":"%d","runtime":"process"}`, i)))
		cancel()
		if err != nil {
			failed++
			continue
		}
		if i%10 != 0 {
			continue
		}
		followers.Add(1)
		go func() {
			defer followers.Done()
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				st, err := admin.BoxState(ctx, box)
				cancel()
				if err == nil && st.Acked >= rev {
					lagMu.Lock()
					lags = append(lags, time.Since(at))
					lagMu.Unlock()
					return
				}
			}
		}()
	}
	tick.Stop()
	writeSecs := time.Since(t0).Seconds()
	followers.Wait()
	rev1, size = etcdStatus()
	b.ReportMetric(float64(rev1-rev0)/writeSecs, "etcd-writes/s-at-100-api-writes/s")
	b.ReportMetric(float64(size)/(1<<20), "etcd-db-MiB-after-writes")
	slices.Sort(lags)
	pct := func(q float64) time.Duration {
		if len(lags) == 0 {
			return 0
		}
		return lags[min(len(lags)-1, int(q*float64(len(lags))))]
	}
	b.ReportMetric(float64(pct(0.5).Microseconds())/1000, "write-to-ack-p50-ms")
	b.ReportMetric(float64(pct(0.99).Microseconds())/1000, "write-to-ack-p99-ms")
	b.Logf("writes: %d failed; write to ack over %d followed: p50 %v, p99 %v; etcd %.0f writes/s idle, db %.1f MiB",
		failed, len(lags), pct(0.5), pct(0.99), idleRate, float64(size)/(1<<20))

	// Every replica killed and started again at once.
	downs := func() []int {
		var out []int
		for _, a := range addrs {
			n, err := lb.Downs(a)
			if err != nil {
				b.Fatal(err)
			}
			out = append(out, n)
		}
		return out
	}
	downs0 := downs()
	// All at once: killed one after another, a box whose session broke
	// with the first could land on another in the moment before its own
	// kill, and count as a session dropped after admission.
	window := fleetsim.Window{Since: time.Now()}
	killAll(reps...)
	restart := time.Now()
	var wg sync.WaitGroup
	for _, r := range reps {
		wg.Add(1)
		go func() { defer wg.Done(); r.launch(b) }()
	}
	wg.Wait()
	var profiled sync.WaitGroup
	defer profiled.Wait()
	if p := os.Getenv("EDGEBOX_BENCH_CPU_PROFILE"); p != "" {
		// Each replica's CPU over the restart's first
		// EDGEBOX_BENCH_CPU_PROFILE_SECONDS (30 unless set), in P.1, P.2
		// and P.3; go test's -cpuprofile has etcd's, which runs here.
		for i, r := range reps {
			r.debugFetch(b, &profiled, "profile", cmp.Or(os.Getenv("EDGEBOX_BENCH_CPU_PROFILE_SECONDS"), "30"), fmt.Sprintf("%s.%d", p, i+1), time.Now())
		}
	}
	// What the restart writes to etcd, by kind of key.
	census := writeCensus(cli, "/bench/")
	// An operator's calls through the load balancer from the restart
	// on, from a process of its own.
	probe := startProber(b, public, token, ids[0], caPEM)
	// Until HAProxy's checks find a replica up, calls through it fail:
	// the figures below are also given from the moment every replica
	// answers.
	for _, r := range reps {
		r.waitHealthy(b, 2*time.Minute)
	}
	allUp := time.Now()
	st := waitSynced(b, f, window)
	calls := probe.stop()
	logFleet(b, "restart of every replica", st)
	// HAProxy marks each replica down once for the kill, if it looks
	// before the replica is back; more are checks that failed under the
	// storm, each cutting that replica's sessions through HAProxy.
	var marked []string
	for i, n := range downs() {
		marked = append(marked, fmt.Sprintf("replica %d: %d", i+1, n-downs0[i]))
	}
	b.Logf("restart: HAProxy marked replicas down %s", strings.Join(marked, ", "))
	writes, byKind := census()
	b.ReportMetric(float64(writes)/float64(n), "restart-etcd-revisions/box")
	b.Logf("restart: %d etcd revisions until every box synced; keys written by kind: %s", writes, byKind)
	b.ReportMetric((st.AllSyncedAfter - restart.Sub(window.Since)).Seconds(), "restart-s-all-synced")
	// Failed calls count as 10 s, the prober's worst case.
	var apiLat, upLat latencies
	failedBefore, failedAfter := 0, 0
	for _, c := range calls {
		apiLat = append(apiLat, c.took)
		up := !c.at.Before(allUp)
		if up {
			upLat = append(upLat, c.took)
		}
		switch {
		case c.took < 10*time.Second:
		case up:
			failedAfter++
		default:
			failedBefore++
		}
	}
	if len(upLat) == 0 {
		b.Fatal("the prober made no call once every replica answered")
	}
	slices.Sort(apiLat)
	slices.Sort(upLat)
	b.Logf("restart: every replica answered %v after the kill; API over %d calls p50 %v p99 %v, %d failed; from then on over %d calls p50 %v p99 %v, %d failed",
		allUp.Sub(restart).Round(time.Millisecond), len(apiLat), apiLat.p(0.5), apiLat.p(0.99), failedBefore+failedAfter,
		len(upLat), upLat.p(0.5), upLat.p(0.99), failedAfter)
	b.ReportMetric(ms(apiLat.p(0.99)), "restart-api-p99-ms")
	b.ReportMetric(ms(upLat.p(0.99)), "restart-api-p99-ms-replicas-up")
}

// procRSS is the resident memory of process pid, in bytes.
func procRSS(b *testing.B, pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb float64
			fmt.Sscanf(strings.TrimSpace(v), "%f", &kb)
			return kb * 1024
		}
	}
	return 0
}

// writeCensus follows every write under prefix from now on; census stops
// it and returns how many revisions there were and how many keys of each
// kind were written: the key's first segment under prefix, and its
// second under ha/ (a replica's own keys).
func writeCensus(cli *clientv3.Client, prefix string) (census func() (int64, string)) {
	ctx, cancel := context.WithCancel(context.Background())
	// The watch's goroutine alone writes these until done closes.
	var first, last int64
	kinds := map[string]int{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for resp := range cli.Watch(ctx, prefix, clientv3.WithPrefix()) {
			for _, ev := range resp.Events {
				if first == 0 {
					first = ev.Kv.ModRevision
				}
				last = ev.Kv.ModRevision
				parts := strings.SplitN(strings.TrimPrefix(string(ev.Kv.Key), prefix), "/", 3)
				kind := parts[0]
				if kind == "ha" && len(parts) > 2 {
					kind += "/" + parts[1]
				}
				if ev.Type == mvccpb.DELETE {
					kind += " (deleted)"
				}
				kinds[kind]++
			}
		}
	}()
	return func() (int64, string) {
		cancel()
		<-done
		var out []string
		for k, v := range kinds {
			out = append(out, fmt.Sprintf("%s %d", k, v))
		}
		slices.Sort(out)
		if first == 0 {
			return 0, "none"
		}
		return last - first + 1, strings.Join(out, ", ")
	}
}
