//go:build linux

package integration

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent/localstore"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/require"
	"github.com/edgebox/edgebox/internal/test/testenv"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

var (
	haHistoryRuns = flag.Int("ha-history-runs", 4, "randomized runs of TestSyncHistoryOnReplicas, on one deployment (make soak runs more)")
	haHistorySeed = flag.Uint64("ha-history-seed", 1, "seed of TestSyncHistoryOnReplicas's first run")
)

const (
	haHistoryBoxes = 3
	haHistorySteps = 30
	// haHistoryNames are the workloads a run changes: w0, w1…
	haHistoryNames = 5
	// haHistoryUIDs is the first workload user of the boxes; each box has
	// 10,000 of its own, apart from every other test's.
	haHistoryUIDs = 1_300_000
	// staleReadsMsg starts what a replica logs when its reads come from
	// one etcd member's copy, which may lag (console/store): a read that
	// goes back then is the store's documented behaviour, not a lost ack.
	staleReadsMsg = "etcd serves no linearizable reads"
)

// TestSyncHistoryOnReplicas runs randomized histories on the documented
// deployment (three console replicas as binaries on a three-member etcd
// cluster, HAProxy in front, agent binaries running native workloads):
// desired-state puts and deletes through HAProxy and through each replica
// directly, kill -9 of a replica and its restart later, SIGTERM and
// restart of a replica, changes to every box at once while a replica is
// killed or stopped, and restarts and kill -9 of agents; at least one
// replica runs throughout.
//
//   - Throughout, a checker reads each box's state through a running
//     replica picked at random for each read: no box's acknowledged
//     revision or revision ever goes back, and no read shows a revision
//     older than one the API confirmed before the read began. The acked
//     revision is an etcd key that only grows (desired.Ack) and reads are
//     linearizable, so a replica that just restarted reads what the others
//     do; only a replica that logged its reads stale (etcd without quorum,
//     which this test does not cause) is excused.
//   - Confirmed changes of a box get growing revisions, and none is lost:
//     at the end each workload is as its last confirmed change left it,
//     or as a later change whose answer was lost made it.
//   - At the end, with every replica back, every box acks its revision
//     and reports each workload running at its revision and release, and
//     none else; its own store holds exactly the console's objects at the
//     console's revision, and it runs exactly its workloads, each at its
//     release.
//
// Each run starts by deleting every workload, so a run's seed replays
// its steps: go test -run TestSyncHistoryOnReplicas -ha-history-seed=N
// -ha-history-runs=1 (the timing differs).
func TestSyncHistoryOnReplicas(t *testing.T) {
	require.Root(t, "the process driver runs workloads under users of their own")
	t.Parallel()
	ha := startReplicas(t, 3)
	// After the agents stop (cleanups run last first): workloads outlive
	// their agent.
	t.Cleanup(func() { endUsersProcesses(haHistoryUIDs, haHistoryBoxes*10_000) })
	h := &haHistory{ha: ha, live: []bool{true, true, true}, confirmed: map[string]uint64{}}
	h.enroll(t)
	testenv.WaitFor(t, 60*time.Second, "every box online, each held by a replica", func() bool {
		_, ok := holders(t, ha.admin, len(h.boxes))
		return ok
	})

	stop, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); h.check(t, stop) }()
	defer func() { close(stop); <-done }()
	t.Cleanup(func() {
		if t.Failed() {
			for i, r := range ha.reps {
				t.Logf("replica %d's log, its current run:\n%s", i, r.log())
			}
		}
	})
	for i := range *haHistoryRuns {
		h.run(t, *haHistorySeed+uint64(i))
	}
}

// haHistory is the deployment the runs share, and what the steps tell the
// checker.
type haHistory struct {
	ha    *haDeployment
	boxes []testenv.Box
	args  [][]string // each box's flags for 'edgebox-agent run'

	mu        sync.Mutex // guards what follows
	live      []bool     // replica i runs, as far as the steps know
	confirmed map[string]uint64
	// seed and steps are the current run's, for failures; violations
	// are what the checker found, at most 20.
	seed       uint64
	began      time.Time
	steps      []string
	violations []string
	reads      int // states the checker read
	failed     int // writes that failed
}

// enroll enrolls the boxes through HAProxy, as enrollBoxes does, and
// starts them with workload users of their own and a data directory those
// users can pass: their workloads are real programs. Each box has a site
// of its own, so that the console writes no site peers to it: a box's
// desired state changes only as the run changes it.
func (h *haHistory) enroll(t *testing.T) {
	t.Helper()
	for i := range haHistoryBoxes {
		tok, err := h.ha.admin.CreateToken(ctx(t), api.TokenRequest{Region: "east", Site: fmt.Sprintf("history-%d", i), Uses: 1})
		if err != nil {
			t.Fatal(err)
		}
		b, err := testenv.EnrollBinary(t, tok.Text, fmt.Sprintf("hist-box-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		openToWorkloads(b.DataDir())
		h.boxes = append(h.boxes, b)
		h.args = append(h.args, []string{"--workload-uids", strconv.Itoa(haHistoryUIDs + i*10_000)})
		testenv.StartAgentArgs(t, b, h.args[i]...)
	}
}

// step records a step of the current run.
func (h *haHistory) step(format string, a ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.steps = append(h.steps, fmt.Sprintf("%6.2fs  %s", time.Since(h.began).Seconds(), fmt.Sprintf(format, a...)))
}

// story is the seed and the steps of the current run so far, and what the
// checker found, for a failure.
func (h *haHistory) story() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d (replay: go test -run TestSyncHistoryOnReplicas -ha-history-seed=%d -ha-history-runs=1 ./internal/test/integration/)\nsteps:\n", h.seed, h.seed)
	for _, s := range h.steps {
		b.WriteString("  " + s + "\n")
	}
	for _, v := range h.violations {
		b.WriteString("checker: " + v + "\n")
	}
	return b.String()
}

// pickLive is a running replica, at random; false when none runs.
func (h *haHistory) pickLive(rng *rand.Rand) (int, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var up []int
	for i, l := range h.live {
		if l {
			up = append(up, i)
		}
	}
	if len(up) == 0 {
		return 0, false
	}
	if rng == nil {
		return up[rand.IntN(len(up))], true
	}
	return up[rng.IntN(len(up))], true
}

// replicas returns the running and the stopped replicas.
func (h *haHistory) replicas() (up, down []int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, l := range h.live {
		if l {
			up = append(up, i)
		} else {
			down = append(down, i)
		}
	}
	return up, down
}

func (h *haHistory) setLive(i int, live bool) {
	h.mu.Lock()
	h.live[i] = live
	h.mu.Unlock()
}

// check reads every box's state, through a running replica picked anew
// for each read, until stop closes, and records what goes back.
func (h *haHistory) check(t *testing.T, stop <-chan struct{}) {
	type seen struct {
		acked, rev uint64
		ackedVia   int // the replica that read acked
		revVia     int
	}
	last := map[string]seen{}
	for {
		select {
		case <-stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
		for _, b := range h.boxes {
			id := b.ID()
			i, ok := h.pickLive(nil)
			if !ok {
				continue
			}
			h.mu.Lock()
			floor := h.confirmed[id] // confirmed before the read begins
			h.mu.Unlock()
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			st, err := h.ha.direct[i].BoxState(rctx, id)
			cancel()
			if err != nil {
				continue // a replica being killed or restarted
			}
			h.mu.Lock()
			h.reads++
			h.mu.Unlock()
			l := last[id]
			var why []string
			if st.Acked < l.acked {
				why = append(why, fmt.Sprintf("acked revision went back from %d (read through replica %d) to %d (through replica %d)", l.acked, l.ackedVia, st.Acked, i))
			}
			if st.Revision < l.rev {
				why = append(why, fmt.Sprintf("revision went back from %d (read through replica %d) to %d (through replica %d)", l.rev, l.revVia, st.Revision, i))
			}
			if st.Revision < floor {
				why = append(why, fmt.Sprintf("revision %d read through replica %d after the API confirmed revision %d", st.Revision, i, floor))
			}
			if st.Acked > l.acked {
				l.acked, l.ackedVia = st.Acked, i
			}
			if st.Revision > l.rev {
				l.rev, l.revVia = st.Revision, i
			}
			last[id] = l
			for _, w := range why {
				if strings.Contains(h.ha.reps[i].log(), staleReadsMsg) {
					// The replica said its reads are stale: documented,
					// and said; not what this test looks for.
					t.Logf("a stale read, which replica %d logged as such: box %s: %s", i, id, w)
					continue
				}
				h.mu.Lock()
				if len(h.violations) < 20 {
					h.violations = append(h.violations, fmt.Sprintf("%6.2fs  box %s: %s", time.Since(h.began).Seconds(), id, w))
				}
				h.mu.Unlock()
			}
		}
	}
}

// change is one attempt at a change of a box's workload.
type change struct {
	release string // "" for a delete
	rev     uint64 // the revision the API confirmed; 0 when err
	err     error
}

func (c change) String() string {
	what := "delete"
	if c.release != "" {
		what = "put release " + c.release
	}
	if c.err != nil {
		return what + ", failed"
	}
	return fmt.Sprintf("%s, confirmed at revision %d", what, c.rev)
}

// boxModel is what a run asked of one box: per workload, its last
// confirmed change, and the changes tried after it whose answers were lost
// (any of them may have landed).
type boxModel struct {
	last  map[string]change
	later map[string][]change
	rev   uint64 // the highest revision confirmed
}

// run runs one randomized history from seed.
func (h *haHistory) run(t *testing.T, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	h.mu.Lock()
	h.seed, h.began, h.steps = seed, time.Now(), nil
	h.mu.Unlock()
	models := map[string]*boxModel{}
	for _, b := range h.boxes {
		models[b.ID()] = &boxModel{last: map[string]change{}, later: map[string][]change{}}
	}
	n := 0 // changes planned, for unique releases
	plan := func(b testenv.Box) planned {
		n++
		p := planned{box: b.ID(), name: fmt.Sprintf("w%d", rng.IntN(haHistoryNames)), release: fmt.Sprintf("%d.%d", seed, n), via: -1}
		p.del = rng.IntN(100) < 30
		if rng.IntN(2) == 0 {
			p.via, _ = h.pickLive(rng)
		}
		return p
	}

	// A clean slate: the last run's workloads go.
	for _, b := range h.boxes {
		st, err := readState(h.ha.admin, b.ID())
		if err != nil {
			t.Fatalf("the state of box %s: %v\n%s", b.ID(), err, h.story())
		}
		for _, o := range st.Objects {
			if o.Kind == edgeboxv1.KindWorkload {
				n++
				h.write(t, models[b.ID()], planned{box: b.ID(), name: o.Name, del: true, via: -1})
			}
		}
	}

	var kills, terms, agents, bursts int
	for s := range haHistorySteps {
		b := h.boxes[rng.IntN(len(h.boxes))]
		up, down := h.replicas()
		r := rng.IntN(100)
		if s == haHistorySteps/2 && kills == 0 {
			r = 45 // a run kills at least one replica
		}
		switch {
		case r < 40:
			h.write(t, models[b.ID()], plan(b))
		case r < 52 && len(up) > 1:
			i := up[rng.IntN(len(up))]
			h.stopReplica(t, i, syscall.SIGKILL)
			kills++
		case r < 64 && len(down) > 0:
			h.restart(t, down[rng.IntN(len(down))])
		case r < 70 && len(up) > 1:
			i := up[rng.IntN(len(up))]
			h.stopReplica(t, i, syscall.SIGTERM)
			h.restart(t, i)
			terms++
		case r < 88:
			// Changes to every box at once, each box's one after the
			// other, and a replica killed (or stopped) as they go.
			plans := make([][]planned, len(h.boxes))
			for bi, b := range h.boxes {
				for range 1 + rng.IntN(3) {
					plans[bi] = append(plans[bi], plan(b))
				}
			}
			victim, sig := -1, syscall.SIGKILL
			if len(up) > 1 {
				victim = up[rng.IntN(len(up))]
			}
			if rng.IntN(3) == 0 {
				sig = syscall.SIGTERM
			}
			delay := time.Duration(rng.IntN(100)) * time.Millisecond
			var wg sync.WaitGroup
			for bi, b := range h.boxes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for _, p := range plans[bi] {
						h.write(t, models[b.ID()], p)
					}
				}()
			}
			time.Sleep(delay)
			if victim >= 0 {
				h.stopReplica(t, victim, sig)
			}
			wg.Wait()
			switch {
			case victim >= 0 && sig == syscall.SIGTERM:
				h.restart(t, victim)
				terms++
			case victim >= 0:
				kills++
			}
			bursts++
		case r < 94:
			bi := slices.Index(h.boxes, b)
			b.Stop(t)
			testenv.StartAgentArgs(t, b, h.args[bi]...)
			h.step("restart the agent of box %s", b.ID())
			agents++
		default:
			bi := slices.Index(h.boxes, b)
			testenv.KillAgent(t, b)
			testenv.StartAgentArgs(t, b, h.args[bi]...)
			h.step("kill -9 the agent of box %s, and start it", b.ID())
			agents++
		}
		time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond)
	}

	// Every replica back, HAProxy routing to each, every box online on
	// one of them.
	settled := time.Now()
	_, down := h.replicas()
	for _, i := range down {
		h.restart(t, i)
	}
	for i := range h.ha.reps {
		h.ha.waitRouted(t, i, 30*time.Second)
	}
	running := map[string]bool{}
	for _, r := range h.ha.reps {
		running[r.id(t)] = true
	}
	h.waitFor(t, 60*time.Second, "every box online on a running replica", func() string {
		by, ok := holders(t, h.ha.admin, len(h.boxes))
		if !ok {
			return "not every box is online"
		}
		for id, r := range by {
			if !running[r] {
				return fmt.Sprintf("box %s is held by %s, which no longer runs", id, r)
			}
		}
		return ""
	})
	h.step("every replica up and routed, every box online")

	// Every box acks its state and runs it; no confirmed change is lost.
	states := map[string]api.BoxState{}
	h.waitFor(t, 90*time.Second, "every box in sync", func() string {
		for _, b := range h.boxes {
			st, err := readState(h.ha.admin, b.ID())
			if err != nil {
				return fmt.Sprintf("box %s: %v", b.ID(), err)
			}
			if why := inSync(st); why != "" {
				return fmt.Sprintf("box %s: %s", b.ID(), why)
			}
			states[b.ID()] = st
		}
		return ""
	})
	synced := time.Since(settled)
	for _, b := range h.boxes {
		if why := h.lost(t, models[b.ID()], states[b.ID()]); why != "" {
			t.Fatalf("box %s: %s\n%s", b.ID(), why, h.story())
		}
	}

	// What each box holds itself: stopped, so its store can be read.
	for i, b := range h.boxes {
		b.Stop(t)
		st, err := readState(h.ha.admin, b.ID())
		if err != nil {
			t.Fatalf("the state of box %s: %v\n%s", b.ID(), err, h.story())
		}
		if why := onBox(b, st); why != "" {
			t.Fatalf("box %s: %s\n%s", b.ID(), why, h.story())
		}
		testenv.StartAgentArgs(t, b, h.args[i]...)
	}
	h.mu.Lock()
	violations, reads, failed := len(h.violations), h.reads, h.failed
	h.reads, h.failed = 0, 0
	h.mu.Unlock()
	if violations > 0 {
		t.Fatalf("the checker saw state go back\n%s", h.story())
	}
	t.Logf("seed %d: %d steps in %v: %d changes (%d attempts failed), %d kill -9 and %d SIGTERM of a replica, %d agent restarts, %d times changes to every box across a replica's stop; every box in sync %v after every replica was up again; the checker read %d states",
		seed, haHistorySteps, time.Since(h.began).Round(100*time.Millisecond), n, failed, kills, terms, agents, bursts, synced.Round(100*time.Millisecond), reads)
}

// restart starts replica i again, on its addresses and data.
func (h *haHistory) restart(t *testing.T, i int) {
	t.Helper()
	start := time.Now()
	h.ha.reps[i].start(t)
	h.setLive(i, true)
	h.step("start replica %d again: up in %v, as %s", i, time.Since(start).Round(time.Millisecond), h.ha.reps[i].id(t))
}

// planned is a change of a box's workload, through replica via (-1:
// HAProxy).
type planned struct {
	box, name string
	release   string // of a put
	del       bool
	via       int
}

// write makes the change p; a failed attempt is tried again through
// HAProxy, a few times while replicas restart. Every attempt goes in m,
// which only this call changes meanwhile.
func (h *haHistory) write(t *testing.T, m *boxModel, p planned) {
	t.Helper()
	for attempt := range 4 {
		c := h.ha.admin
		route := "HAProxy"
		if attempt == 0 && p.via >= 0 {
			c, route = h.ha.direct[p.via], fmt.Sprintf("replica %d", p.via)
		}
		var ch change
		wctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		start := time.Now()
		if p.del {
			ch.rev, ch.err = c.DeleteDesired(wctx, p.box, edgeboxv1.KindWorkload, p.name)
		} else {
			ch.release = p.release
			ch.rev, ch.err = c.PutDesired(wctx, p.box, edgeboxv1.KindWorkload, p.name, historyWorkload(p.name, p.release))
		}
		cancel()
		took := time.Since(start).Round(time.Millisecond)
		if ch.err != nil {
			kind, ok := writeFailure(ch.err)
			h.step("box %s, %s %s through %s after %v: %s", p.box, p.name, ch, route, took, kind)
			if !ok {
				t.Errorf("box %s, %s %s through %s failed after %v with %v: want a 5xx or a broken connection within %v\n%s",
					p.box, p.name, ch, route, took, ch.err, writeTimeout, h.story())
			}
			m.later[p.name] = append(m.later[p.name], ch)
			h.mu.Lock()
			h.failed++
			h.mu.Unlock()
			time.Sleep(time.Duration(attempt+1) * 300 * time.Millisecond)
			continue
		}
		h.step("box %s, %s %s through %s", p.box, p.name, ch, route)
		// Later than every confirmed change: a put takes the next
		// revision, a delete of nothing the current one.
		if ch.rev < m.rev || !p.del && ch.rev == m.rev {
			t.Errorf("box %s: %s %s, after a change confirmed at revision %d\n%s", p.box, p.name, ch, m.rev, h.story())
		}
		m.rev = max(m.rev, ch.rev)
		m.last[p.name] = ch
		delete(m.later, p.name)
		h.mu.Lock()
		h.confirmed[p.box] = max(h.confirmed[p.box], ch.rev)
		h.mu.Unlock()
		return
	}
}

// stopReplica stops replica i with sig; SIGTERM must stop it cleanly.
func (h *haHistory) stopReplica(t *testing.T, i int, sig syscall.Signal) {
	t.Helper()
	h.setLive(i, false)
	start := time.Now()
	err := h.ha.reps[i].stop(sig)
	if sig == syscall.SIGKILL {
		h.step("kill -9 replica %d", i)
		return
	}
	h.step("SIGTERM to replica %d: stopped in %v (%v)", i, time.Since(start).Round(time.Millisecond), err)
	if err != nil {
		t.Errorf("replica %d on SIGTERM: %v\n%s\n%s", i, err, h.ha.reps[i].log(), h.story())
	}
}

// historyWorkload is a native workload at release that runs until the run
// changes it; the release is in its environment, for the box to show.
func historyWorkload(name, release string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"app": name, "release": release, "runtime": "process",
		"image": "/bin/sleep", "args": []string{"3600"}, "env": []string{"HISTORY_RELEASE=" + release}})
	return b
}

// waitFor is testenv.WaitFor saying why the condition does not hold, and
// the run's story, when it times out.
func (h *haHistory) waitFor(t *testing.T, timeout time.Duration, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		why := cond()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not %s after %v: %s\n%s", what, timeout, why, h.story())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// releaseOf is a workload's release, from its spec.
func releaseOf(o api.DesiredObject) string {
	var w struct {
		Release string `json:"release"`
	}
	json.Unmarshal(o.Spec, &w)
	return w.Release
}

// inSync says how a box's state, as the API shows it, is not in sync: not
// every revision acked, or a workload not reported running at its
// revision and release, or a report of a workload no longer desired.
func inSync(st api.BoxState) string {
	if st.Acked != st.Revision {
		return fmt.Sprintf("acked %d of %d", st.Acked, st.Revision)
	}
	reported := map[string]api.ObjectStatus{}
	for _, s := range st.Statuses {
		if s.Kind == edgeboxv1.KindWorkload {
			reported[s.Name] = s
		}
	}
	for _, o := range st.Objects {
		if o.Kind != edgeboxv1.KindWorkload {
			continue
		}
		s, ok := reported[o.Name]
		if !ok {
			return fmt.Sprintf("no status of %s", o.Name)
		}
		if s.ObservedRevision != o.Revision || s.Phase != edgeboxv1.PhaseRunning || s.Release != releaseOf(o) {
			return fmt.Sprintf("%s (revision %d, release %s) is reported %s at revision %d, release %s: %s",
				o.Name, o.Revision, releaseOf(o), s.Phase, s.ObservedRevision, s.Release, s.Message)
		}
		delete(reported, o.Name)
	}
	for name, s := range reported {
		return fmt.Sprintf("%s is no longer desired but reported %s at revision %d", name, s.Phase, s.ObservedRevision)
	}
	return ""
}

// lost says which confirmed change of m a box's final state lost: each
// workload must be as its last confirmed change left it, or as a change
// tried after it made it (its answer was lost, it may have landed).
func (h *haHistory) lost(t *testing.T, m *boxModel, st api.BoxState) string {
	t.Helper()
	have := map[string]api.DesiredObject{}
	for _, o := range st.Objects {
		if o.Kind == edgeboxv1.KindWorkload {
			have[o.Name] = o
		}
	}
	names := map[string]bool{}
	for name := range have {
		names[name] = true
	}
	for name := range m.last {
		names[name] = true
	}
	for name := range m.later {
		names[name] = true
	}
	for _, name := range slices.Sorted(maps.Keys(names)) {
		o, present := have[name]
		got := "absent"
		if present {
			got = fmt.Sprintf("release %s at revision %d", releaseOf(o), o.Revision)
		}
		last, confirmed := m.last[name]
		if confirmed && (last.release == "" && !present || present && last.release == releaseOf(o) && last.rev == o.Revision) {
			continue
		}
		landed := false
		for _, c := range m.later[name] {
			if c.release == "" && !present || present && c.release == releaseOf(o) && o.Revision > last.rev {
				t.Logf("seed %d, box %s: %s is %s, from a change whose answer was lost", h.seed, st.BoxID, name, got)
				landed = true
			}
		}
		if !landed {
			want := "nothing: no change of it was confirmed"
			if confirmed {
				want = last.String()
			}
			return fmt.Sprintf("workload %s is %s; its last confirmed change: %s; changes tried after it: %v", name, got, want, m.later[name])
		}
	}
	return ""
}

// onBox says how what a stopped box holds differs from its state st: its
// store must hold the console's objects at the console's revision, and
// the box run exactly its workloads, each at its release.
func onBox(b testenv.Box, st api.BoxState) string {
	s, err := localstore.Open(b.DataDir())
	if err != nil {
		return err.Error()
	}
	defer s.Close()
	if err := s.Check(); err != nil {
		return "its store: " + err.Error()
	}
	rev, err := s.Revision()
	if err != nil {
		return err.Error()
	}
	if rev != st.Revision {
		return fmt.Sprintf("it stored revision %d, the console's is %d", rev, st.Revision)
	}
	objs, err := s.Objects("")
	if err != nil {
		return err.Error()
	}
	var held, want []string
	for _, o := range objs {
		held = append(held, fmt.Sprintf("%s/%s@%d", o.GetKind(), o.GetName(), o.GetRevision()))
	}
	workloads := map[string]string{} // name -> release
	for _, o := range st.Objects {
		want = append(want, fmt.Sprintf("%s/%s@%d", o.Kind, o.Name, o.Revision))
		if o.Kind == edgeboxv1.KindWorkload {
			workloads[o.Name] = releaseOf(o)
		}
	}
	slices.Sort(held)
	slices.Sort(want)
	if !slices.Equal(held, want) {
		return fmt.Sprintf("it stored %v, the console has %v", held, want)
	}

	// Its instances: <data>/process/<name>/ with spec.json and run.json.
	dir := filepath.Join(b.DataDir(), "process")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err.Error()
	}
	var names []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		names = append(names, e.Name())
		var spec struct {
			Env []string `json:"env"`
		}
		var run struct {
			PID      int  `json:"pid"`
			Starting bool `json:"starting"`
		}
		if err := readJSONFile(filepath.Join(dir, e.Name(), "spec.json"), &spec); err != nil {
			return fmt.Sprintf("instance %s: %v", e.Name(), err)
		}
		if err := readJSONFile(filepath.Join(dir, e.Name(), "run.json"), &run); err != nil {
			return fmt.Sprintf("instance %s: %v", e.Name(), err)
		}
		if rel, ok := workloads[e.Name()]; ok && !slices.Contains(spec.Env, "HISTORY_RELEASE="+rel) {
			return fmt.Sprintf("instance %s runs with %v, its release is %s", e.Name(), spec.Env, rel)
		}
		if run.Starting || run.PID <= 0 || syscall.Kill(run.PID, 0) != nil {
			return fmt.Sprintf("instance %s does not run (%+v)", e.Name(), run)
		}
	}
	var desired []string
	for name := range workloads {
		desired = append(desired, name)
	}
	slices.Sort(names)
	slices.Sort(desired)
	if !slices.Equal(names, desired) {
		return fmt.Sprintf("it has the instances %v, its workloads are %v", names, desired)
	}
	return ""
}

func readJSONFile(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// endUsersProcesses kills every process of the n users from first.
func endUsersProcesses(first, n int) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc", e.Name()), &st) == nil && int(st.Uid) >= first && int(st.Uid) < first+n {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
