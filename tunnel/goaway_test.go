package tunnel

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/edgebox/edgebox/internal/test/toxic"
)

// endings records, for each session of a client that ended, whether the
// console had said goodbye on it.
type endings struct {
	mu   sync.Mutex
	seen []bool
}

func (e *endings) watch(c *Client) {
	c.OnSession = func(s *Session, up bool) {
		if up {
			return
		}
		_, ok := s.GoneAway()
		e.mu.Lock()
		e.seen = append(e.seen, ok)
		e.mu.Unlock()
	}
}

func (e *endings) get() []bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]bool(nil), e.seen...)
}

func TestBoxHearsGoodbyeOnlyWhenConsoleShutsDown(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		end     func(srv *testServer, id string)
		goodbye bool
	}{
		{"console shuts down", func(srv *testServer, _ string) { srv.stop() }, true},
		{"console drops the box (revocation)", func(srv *testServer, id string) { srv.Drop(id) }, false},
		{"the link breaks", func(srv *testServer, id string) {
			s, _ := srv.Session(id)
			s.ys.Close() // the connection ends under the session
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := newTestPKI(t)
			srv := startTestServer(t, p, DefaultConfig(), "")
			var seen endings
			cli := startTestClient(t, p, "box-1", srv.addr, func(c *ClientConfig) {
				// The test's backoff; after the ending only the first
				// session matters.
				c.Backoff = Backoff{Min: time.Minute, Max: time.Minute}
			}, seen.watch)
			waitFor(t, 10*time.Second, "session", func() bool { _, ok := srv.Session("box-1"); return ok && cli.Session() != nil })
			tt.end(srv, "box-1")
			waitFor(t, 10*time.Second, "the box to see its session end", func() bool { return len(seen.get()) > 0 })
			if got := seen.get()[0]; got != tt.goodbye {
				t.Fatalf("box heard goodbye: %v, want %v", got, tt.goodbye)
			}
		})
	}
}

// TestGoodbyeToAnUnansweringBoxIsBounded: a box that cannot answer (its
// link is blackholed) does not hold the console's shutdown beyond the
// goodbye timeout.
func TestGoodbyeToAnUnansweringBoxIsBounded(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	px := toxic.New(t, srv.addr)
	startTestClient(t, p, "box-1", px.Addr(), nil)
	waitFor(t, 10*time.Second, "session", func() bool { _, ok := srv.Session("box-1"); return ok })
	for _, dir := range []string{"upstream", "downstream"} {
		if err := px.Add(dir, "timeout", dir, `"timeout":0`); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	srv.Server.Close()
	took := time.Since(start)
	t.Logf("shutdown with an unanswering box took %v (goodbye timeout %v)", took.Round(time.Millisecond), goodbyeTimeout)
	if took < goodbyeTimeout/2 {
		t.Fatalf("shutdown took %v: the goodbye was not even tried", took)
	}
	if took > 4*goodbyeTimeout {
		t.Fatalf("shutdown took %v, want about %v", took, goodbyeTimeout)
	}
}

// TestConsoleRefusesGoodbyeFromABox: only the console says goodbye; on its
// side the kind is unknown, as it is on boxes that predate goodbyes (their
// refusal does not hold the console's shutdown).
func TestConsoleRefusesGoodbyeFromABox(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	cli := startTestClient(t, p, "box-1", srv.addr, nil)
	waitFor(t, 10*time.Second, "session", func() bool { _, ok := srv.Session("box-1"); return ok && cli.Session() != nil })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := cli.Session().sayGoodbye(ctx, "a box pretending")
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("got %v, want the console to refuse the kind", err)
	}
	cs, _ := srv.Session("box-1")
	if _, ok := cs.GoneAway(); ok {
		t.Fatal("the console recorded a goodbye from a box")
	}
}
