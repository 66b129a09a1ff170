package integration

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/fake"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/internal/test/toxic"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

var (
	historyRuns = flag.Int("history-runs", 50, "randomized runs of TestSyncHistory (make soak runs more)")
	historySeed = flag.Uint64("history-seed", 1, "seed of the first randomized run")
)

// TestSyncHistory runs randomized histories of desired-state changes
// while the network between boxes and console misbehaves (latency, resets,
// blackholes) and the console and agents restart. Throughout, no box's
// acknowledged revision goes back; at the end every box holds exactly its
// desired state, deletes included, and runs exactly its workloads.
// A failing run names its seed: go test -run TestSyncHistory/seed=N.
func TestSyncHistory(t *testing.T) {
	t.Parallel()
	for i := range *historyRuns {
		seed := *historySeed + uint64(i)
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			runHistory(t, seed)
		})
	}
}

type historyBox struct {
	box   testenv.Box
	proxy *toxic.Proxy
	drv   *fake.Driver
	toxic string // the toxic in place, if any
}

func runHistory(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	h := testenv.NewInProcess(t, testenv.Options{})
	consoleAddr := h.URL()[len("https://"):]
	boxes := make([]*historyBox, 2)
	for i := range boxes {
		b := &historyBox{box: enrollOne(t, h, fmt.Sprintf("box-%d", i)), proxy: toxic.New(t, consoleAddr), drv: fake.New("containerd")}
		boxes[i] = b
		b.start(t)
	}

	// The checker: acknowledged revisions only grow.
	ctx, cancel := context.WithCancel(context.Background())
	var checker sync.WaitGroup
	var mu sync.Mutex
	var violation error
	checker.Add(1)
	go func() {
		defer checker.Done()
		last := map[string]uint64{}
		for ctx.Err() == nil {
			for _, b := range boxes {
				c := h.Console()
				if c == nil {
					continue
				}
				n, err := c.Desired().Acked(ctx, b.box.ID())
				if err != nil {
					continue // the console is restarting
				}
				if n < last[b.box.ID()] {
					mu.Lock()
					violation = fmt.Errorf("box %s: acked revision went back from %d to %d", b.box.ID(), last[b.box.ID()], n)
					mu.Unlock()
				}
				last[b.box.ID()] = n
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()

	var steps []string
	for range 30 {
		b := boxes[rng.IntN(len(boxes))]
		name := fmt.Sprintf("w%d", rng.IntN(12))
		st := h.Console().Desired()
		switch r := rng.IntN(100); {
		case r < 45:
			st.Put(ctx, b.box.ID(), workload(name, fmt.Sprint(rng.IntN(1000))))
			steps = append(steps, "put "+name)
		case r < 65:
			st.Delete(ctx, b.box.ID(), edgeboxv1.KindWorkload, name)
			steps = append(steps, "delete "+name)
		case r < 75:
			steps = append(steps, b.setToxic(t, "latency", `"latency": 40, "jitter": 40`))
		case r < 82:
			steps = append(steps, b.setToxic(t, "reset_peer", `"timeout": 0`))
		case r < 89:
			steps = append(steps, b.setToxic(t, "timeout", `"timeout": 300`))
		case r < 94:
			h.RestartConsole(t)
			steps = append(steps, "restart console")
		default:
			b.box.Stop(t)
			b.start(t)
			steps = append(steps, "restart agent")
		}
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
	}
	for _, b := range boxes {
		b.setToxic(t, "", "")
	}

	for _, b := range boxes {
		converged(t, h, b, steps)
	}
	cancel()
	checker.Wait()
	if violation != nil {
		t.Fatalf("%v\nsteps: %v", violation, steps)
	}
}

func (b *historyBox) start(t *testing.T) {
	addr := b.proxy.Addr()
	testenv.StartAgent(t, b.box, func(c *agent.Config) {
		c.Drivers = []runtime.Driver{b.drv}
		c.Reconcile = 200 * time.Millisecond
		c.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
	})
}

// setToxic replaces the box's toxic with one of kind ("" for none).
func (b *historyBox) setToxic(t *testing.T, kind, attrs string) string {
	if b.toxic != "" {
		if err := b.proxy.Remove(b.toxic); err != nil {
			t.Fatal(err)
		}
		b.toxic = ""
	}
	if kind == "" {
		return "clear network"
	}
	if err := b.proxy.Add(kind, kind, "downstream", attrs); err != nil {
		t.Fatal(err)
	}
	b.toxic = kind
	return kind
}

// converged waits until the box stored and acknowledged its whole desired
// state and runs exactly its workloads.
func converged(t *testing.T, h *testenv.InProcess, b *historyBox, steps []string) {
	t.Helper()
	var why string
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		why = differs(t, h, b)
		if why == "" {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("box %s never converged: %s\nsteps: %v", b.box.ID(), why, steps)
}

func differs(t *testing.T, h *testenv.InProcess, b *historyBox) string {
	ctx := context.Background()
	st := h.Console().Desired()
	live, rev, err := st.Live(ctx, b.box.ID())
	if err != nil {
		return err.Error()
	}
	if acked, _ := st.Acked(ctx, b.box.ID()); acked != rev {
		return fmt.Sprintf("acked %d of %d", acked, rev)
	}
	a := testenv.AgentOf(b.box)
	if a == nil {
		return "agent not running"
	}
	objs, err := a.DesiredObjects("")
	if err != nil {
		return err.Error()
	}
	if len(objs) != len(live) {
		return fmt.Sprintf("box holds %d objects, console %d", len(objs), len(live))
	}
	var want []string
	for i, o := range live {
		if objs[i].GetName() != o.GetName() || objs[i].GetRevision() != o.GetRevision() {
			return fmt.Sprintf("box holds %s@%d, console %s@%d", objs[i].GetName(), objs[i].GetRevision(), o.GetName(), o.GetRevision())
		}
		want = append(want, o.GetName())
	}
	sort.Strings(want)
	if got := b.drv.Running(); fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Sprintf("running %v, desired %v", got, want)
	}
	return ""
}
