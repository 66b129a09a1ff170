//go:build linux

// Package rolloutsim runs a rollout over a simulated fleet in one
// process: the real console, and real agents (tunnel, Sync, reconciler,
// local API) with the fake runtime driver. It drives what happens to a
// fleet during a rollout: boxes whose new release fails, workloads that
// hold update locks, regions whose maintenance window is closed at first,
// console restarts. It watches the fleet throughout and collects what the
// invariants need: the boxes down per site, what each box ends on, the
// audit log.
package rolloutsim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/fake"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console"
	"github.com/edgebox/edgebox/internal/test/testenv"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Config says what fleet and what trouble.
type Config struct {
	Regions, SitesPerRegion, BoxesPerSite int
	// FailRate is the share of boxes whose new release does not start.
	FailRate float64
	// LockRate is the share of boxes where a workload holds an update
	// lock from before the rollout for 1 to LockFor.
	LockRate float64
	LockFor  time.Duration
	// ClosedRegions are the first regions whose maintenance window is
	// closed until OpenAfter into the rollout.
	ClosedRegions int
	OpenAfter     time.Duration
	// Restarts is how many times the console is restarted while the
	// rollout runs, spread over it.
	Restarts int
	// Rollout is the request, but for its app, releases and regions.
	Rollout api.RolloutRequest
	// Tick is the controller's period (200 ms when zero).
	Tick time.Duration
	Seed uint64
	// Timeout bounds the rollout (5 min when zero).
	Timeout time.Duration
}

// Result is what the run saw.
type Result struct {
	Rollout api.Rollout
	// Took is from the rollout's creation to its end.
	Took time.Duration
	// Boxes: ID -> region, site.
	Region, Site map[string]string
	// Failing are the boxes whose new release does not start.
	Failing map[string]bool
	// LockedUntil: when each locked box's lock was released.
	LockedUntil map[string]time.Time
	// ClosedUntil: when each region with a closed window opened.
	ClosedUntil map[string]time.Time
	// MaxDown is, per site, the most boxes seen down at once: told a
	// release they do not run yet, or not running.
	MaxDown map[string]int
	// Final is the release each box runs at the end.
	Final map[string]string
	// Audit is the tenant's audit log over the run, oldest first.
	Audit []api.AuditEntry
	// Samples counts the looks the watcher took at the fleet.
	Samples int
	// CPU is the process's CPU time (user and system) from the rollout's
	// creation to its end: console and agents, which share the process.
	// HeapPeak is the largest Go heap in use the watcher saw meanwhile.
	CPU      time.Duration
	HeapPeak uint64
}

const app = "robot"

// Run builds the fleet, deploys release 1 everywhere, and rolls 2 out
// over the regions in order while it makes the trouble cfg asks for.
func Run(t testing.TB, cfg Config) Result {
	t.Helper()
	if cfg.Tick == 0 {
		cfg.Tick = 200 * time.Millisecond
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Minute
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5eed))
	h := testenv.NewInProcess(t, testenv.Options{Console: func(c *console.Config) {
		c.RolloutEvery = cfg.Tick
	}})
	admin := h.Admin()
	res := Result{Region: map[string]string{}, Site: map[string]string{}, Failing: map[string]bool{},
		LockedUntil: map[string]time.Time{}, ClosedUntil: map[string]time.Time{}, MaxDown: map[string]int{}, Final: map[string]string{}}
	var regions []string
	type box struct {
		b   testenv.Box
		drv *fake.Driver
	}
	var boxes []box
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for ri := range cfg.Regions {
		region := fmt.Sprintf("region-%02d", ri)
		regions = append(regions, region)
		for si := range cfg.SitesPerRegion {
			site := fmt.Sprintf("%s-site-%d", region, si)
			tok := h.Token(t, api.TokenRequest{Region: region, Site: site, Uses: cfg.BoxesPerSite, TTL: "1h"})
			for bi := range cfg.BoxesPerSite {
				fails := rng.Float64() < cfg.FailRate
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					b, err := h.Enroll(t, tok, fmt.Sprintf("%s-%02d", site, bi))
					if err != nil {
						t.Errorf("enroll: %v", err)
						return
					}
					drv := fake.New(edgeboxv1.RuntimeProcess)
					if fails {
						drv.FailRelease("2", errors.New("the new release does not start here"))
					}
					testenv.StartAgent(t, b, func(c *agent.Config) {
						c.Drivers = []runtime.Driver{drv}
						c.Reconcile = 2 * time.Second
					})
					mu.Lock()
					defer mu.Unlock()
					boxes = append(boxes, box{b, drv})
					res.Region[b.ID()], res.Site[b.ID()] = region, site
					if fails {
						res.Failing[b.ID()] = true
					}
				}()
			}
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	ctx := context.Background()
	if _, err := admin.CreateApp(ctx, app, "a robot"); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"1", "2"} {
		if _, err := admin.CreateRelease(ctx, app, api.ReleaseSpec{Version: v, Runtime: edgeboxv1.RuntimeProcess, Image: "/bin/robot"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range regions {
		if _, err := admin.Deploy(ctx, app, "1", "region", r); err != nil {
			t.Fatal(err)
		}
	}
	total := len(boxes)
	testenv.WaitFor(t, 3*time.Minute, "every box running 1", func() bool {
		s, err := admin.AppStatus(ctx, app)
		if err != nil || len(s.Boxes) != total {
			return false
		}
		for _, b := range s.Boxes {
			if b.RunningRelease != "1" || b.Phase != "Running" {
				return false
			}
		}
		return true
	})

	// Closed windows: denied from an hour ago to an hour ahead.
	now := time.Now().UTC()
	closed := api.RolloutRules{Regions: map[string]api.UpdatePolicy{}}
	for _, r := range regions[:min(cfg.ClosedRegions, len(regions))] {
		closed.Regions[r] = api.UpdatePolicy{Zone: "UTC", Deny: []api.UpdateWindow{{Days: "every-day",
			From: now.Add(-time.Hour).Format("15:04"), To: now.Add(time.Hour).Format("15:04")}}}
	}
	if len(closed.Regions) > 0 {
		if _, err := admin.SetRolloutRules(ctx, closed); err != nil {
			t.Fatal(err)
		}
	}
	// Locks, taken before the rollout through each box's local API, as
	// its workload would.
	type held struct {
		id, dir string
		for_    time.Duration
	}
	var locks []held
	for _, b := range boxes {
		if rng.Float64() < cfg.LockRate {
			d := time.Duration(1+rng.Int64N(int64(max(cfg.LockFor, time.Second)/time.Millisecond))) * time.Millisecond
			locks = append(locks, held{b.b.ID(), b.b.DataDir(), d})
			if err := lock(b.b.DataDir(), http.MethodPut); err != nil {
				t.Fatal(err)
			}
		}
	}
	testenv.WaitFor(t, 30*time.Second, "the locks reported", func() bool {
		for _, l := range locks {
			st, err := admin.BoxState(ctx, l.id)
			if err != nil || !slices.ContainsFunc(st.Statuses, func(s api.ObjectStatus) bool { return s.Kind == "UpdateLock" }) {
				return false
			}
		}
		return true
	})

	q := cfg.Rollout
	q.App, q.From, q.To, q.Regions = app, "1", "2", regions
	cpu0 := cpuTime()
	start := time.Now()
	ro, err := admin.CreateRollout(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	var tasks sync.WaitGroup
	stop := make(chan struct{})
	for _, l := range locks {
		tasks.Add(1)
		go func() {
			defer tasks.Done()
			select {
			case <-stop:
			case <-time.After(l.for_):
			}
			if err := lock(l.dir, http.MethodDelete); err != nil {
				t.Errorf("releasing the lock of %s: %v", l.id, err)
			}
			mu.Lock()
			res.LockedUntil[l.id] = time.Now()
			mu.Unlock()
		}()
	}
	if len(closed.Regions) > 0 {
		tasks.Add(1)
		go func() {
			defer tasks.Done()
			select {
			case <-stop:
			case <-time.After(cfg.OpenAfter):
			}
			// The time is taken before the rules change: a box of those
			// regions told to move before it broke the window.
			at := time.Now()
			if _, err := admin.SetRolloutRules(context.Background(), api.RolloutRules{}); err != nil {
				t.Errorf("opening the windows: %v", err)
			}
			mu.Lock()
			for r := range closed.Regions {
				res.ClosedUntil[r] = at
			}
			mu.Unlock()
		}()
	}
	// The watcher: boxes down per site, and console restarts as the
	// rollout goes.
	restarted := 0
	deadline := time.Now().Add(cfg.Timeout)
	for {
		var ms goruntime.MemStats
		goruntime.ReadMemStats(&ms)
		res.HeapPeak = max(res.HeapPeak, ms.HeapInuse)
		s, err := admin.AppStatus(ctx, app)
		if err == nil {
			res.Samples++
			down := map[string]int{}
			for _, b := range s.Boxes {
				if b.DesiredRelease != b.RunningRelease || b.Phase != "Running" {
					down[res.Site[b.BoxID]]++
				}
			}
			for site, n := range down {
				res.MaxDown[site] = max(res.MaxDown[site], n)
			}
		}
		r, err := admin.Rollout(ctx, ro.ID)
		if err == nil {
			if r.State == "done" || r.State == "stopped" || r.State == "aborted" {
				res.Rollout, res.Took, res.CPU = r, time.Since(start), cpuTime()-cpu0
				break
			}
			if restarted < cfg.Restarts && r.Progress.Done+r.Progress.Failed >= (restarted+1)*r.Progress.Total/(cfg.Restarts+1) {
				restarted++
				t.Logf("restarting the console at %d of %d boxes", r.Progress.Done+r.Progress.Failed, r.Progress.Total)
				h.RestartConsole(t)
			}
		}
		if time.Now().After(deadline) {
			close(stop)
			t.Fatalf("the rollout did not end within %s: %+v", cfg.Timeout, r.Progress)
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	tasks.Wait()
	// Settled: every box runs what it should.
	testenv.WaitFor(t, 60*time.Second, "every box running what it should", func() bool {
		s, err := admin.AppStatus(ctx, app)
		if err != nil || len(s.Boxes) != total {
			return false
		}
		for _, b := range s.Boxes {
			if b.DesiredRelease != b.RunningRelease || b.Phase != "Running" {
				return false
			}
			res.Final[b.BoxID] = b.RunningRelease
		}
		return true
	})
	res.Audit = auditAll(t, admin)
	return res
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// lock takes (PUT) or releases (DELETE) the update lock of a box's
// workload "robot" through the agent's local API in dir.
func lock(dir, method string) error {
	sock := filepath.Join(agent.APIDir(dir), "agent.sock")
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	req, _ := http.NewRequest(method, "http://agent/v1/locks/robot", strings.NewReader(`{"reason":"signing a payment","ttl_seconds":600}`))
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s lock: %s", method, resp.Status)
	}
	return nil
}

// auditAll reads the whole audit log, a page at a time, newest pages
// first.
func auditAll(t testing.TB, admin *api.Client) []api.AuditEntry {
	t.Helper()
	seen := map[uint64]bool{}
	var all []api.AuditEntry
	until := time.Time{}
	for {
		page, err := admin.AuditQuery(context.Background(), api.AuditQuery{Limit: 1000, Until: until})
		if err != nil {
			t.Fatal(err)
		}
		added := 0
		for _, e := range page {
			if !seen[e.Seq] {
				seen[e.Seq] = true
				all = append(all, e)
				added++
			}
		}
		if added == 0 || len(page) < 1000 {
			break
		}
		until = page[0].Time.Add(time.Nanosecond)
	}
	slices.SortFunc(all, func(a, b api.AuditEntry) int { return int(a.Seq) - int(b.Seq) })
	return all
}
