package leader

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgebox/edgebox/internal/test/etcdtest"
)

// console is one console's elector, on a client of its own.
type console struct {
	id     string
	cli    *clientv3.Client
	e      *Etcd
	cancel context.CancelFunc
	done   chan error
}

// leaders counts the consoles leading at once, and the most ever.
type leaders struct {
	mu        sync.Mutex
	now, most int
	who       string
	terms     atomic.Int32
}

func (l *leaders) work(id string) func(context.Context) error {
	return func(ctx context.Context) error {
		l.mu.Lock()
		l.now++
		l.most = max(l.most, l.now)
		l.who = id
		l.mu.Unlock()
		l.terms.Add(1)
		<-ctx.Done()
		l.mu.Lock()
		l.now--
		if l.who == id {
			l.who = ""
		}
		l.mu.Unlock()
		return nil
	}
}

func (l *leaders) leader() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.who
}

func start(t *testing.T, endpoint, id string, ttl time.Duration, l *leaders) *console {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewEtcd(cli, "/edgebox/", id, ttl, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &console{id: id, cli: cli, e: e, cancel: cancel, done: make(chan error, 1)}
	go func() { c.done <- e.Lead(ctx, "rollouts", l.work(id)) }()
	t.Cleanup(func() { c.stop(t); cli.Close() })
	return c
}

func (c *console) stop(t *testing.T) {
	if c.cancel == nil {
		return
	}
	c.cancel()
	c.cancel = nil
	if err := <-c.done; err != nil {
		t.Errorf("console %s: Lead returned %v", c.id, err)
	}
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// TestOneLeadsAndAnotherTakesOver: of three consoles one leads; stopped,
// it gives the lead up at once; killed (its etcd client gone, its lease
// left to end), another leads within the lease. Never two at once.
func TestOneLeadsAndAnotherTakesOver(t *testing.T) {
	t.Parallel()
	endpoint := etcdtest.Start(t)
	const ttl = 2 * time.Second
	var l leaders
	cs := map[string]*console{}
	for _, id := range []string{"a", "b", "c"} {
		cs[id] = start(t, endpoint, id, ttl, &l)
	}
	waitFor(t, 10*time.Second, "a leader", func() bool { return l.leader() != "" })
	first := l.leader()
	cs[first].stop(t)
	d := waitFor(t, 5*time.Second, "a second leader after the first stopped", func() bool {
		w := l.leader()
		return w != "" && w != first
	})
	if d > time.Second {
		t.Errorf("the lead passed %v after its leader stopped, want at once", d)
	}
	second := l.leader()
	killed := time.Now()
	cs[second].cli.Close() // dead: no resign, its lease ends by itself
	d = waitFor(t, ttl+5*time.Second, "a third leader after the second died", func() bool {
		w := l.leader()
		return w != "" && w != first && w != second
	})
	t.Logf("the lead passed %v after its leader died (lease %v)", time.Since(killed).Round(10*time.Millisecond), ttl)
	if d > ttl+2*time.Second {
		t.Errorf("the lead passed %v after its leader died, want within the lease of %v", d, ttl)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.most != 1 {
		t.Errorf("%d consoles led at once", l.most)
	}
}

// TestAloneAlwaysLeads: a console alone on its store runs its work at
// once and until its context ends.
func TestAloneAlwaysLeads(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Alone{}.Lead(ctx, "x", func(ctx context.Context) error { close(ran); <-ctx.Done(); return nil })
	}()
	<-ran
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestWorkThatFailsEndsLead: a controller's failure while it leads is
// the console's failure, as it is without elections.
func TestWorkThatFailsEndsLead(t *testing.T) {
	t.Parallel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdtest.Start(t)}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	e, err := NewEtcd(cli, "/edgebox/", "a", time.Second, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	boom := context.DeadlineExceeded
	if err := e.Lead(context.Background(), "x", func(context.Context) error { return boom }); err != boom {
		t.Errorf("Lead returned %v, want the work's error", err)
	}
	if err := e.Lead(context.Background(), "x", func(context.Context) error { return nil }); err != errStopped {
		t.Errorf("Lead returned %v for work that stopped by itself", err)
	}
}
