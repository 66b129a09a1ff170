package bench

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// idleServer is a TCP server standing in for the console's port: it
// accepts connections, closes each after closeAfter when that is set,
// and records what it saw.
type idleServer struct {
	ln         net.Listener
	closeAfter time.Duration

	wg sync.WaitGroup // the accept loop and each connection's reader

	mu       sync.Mutex // guards the fields below
	open     int
	accepted int
	perAddr  map[string]int // open connections by source address
	maxAddr  int            // the most one address held at once
}

func startIdleServer(t *testing.T, closeAfter time.Duration) *idleServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &idleServer{ln: ln, closeAfter: closeAfter, perAddr: map[string]int{}}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(func() { ln.Close(); s.wg.Wait() })
	return s
}

func (s *idleServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		s.mu.Lock()
		s.open++
		s.accepted++
		s.perAddr[host]++
		s.maxAddr = max(s.maxAddr, s.perAddr[host])
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if s.closeAfter > 0 {
				c.SetReadDeadline(time.Now().Add(s.closeAfter))
			}
			io.Copy(io.Discard, c) // until the client closes it, or the deadline
			c.Close()
			s.mu.Lock()
			s.open--
			s.perAddr[host]--
			s.mu.Unlock()
		}()
	}
}

func (s *idleServer) counts() (open, accepted, addrs, maxAddr int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.perAddr {
		if n > 0 {
			addrs++
		}
	}
	return s.open, s.accepted, addrs, s.maxAddr
}

// eventually waits up to a minute for cond, generous for a loaded
// machine; it fails the test with what when the time is out.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("after a minute: %s", what)
		}
	}
}

// TestIdleHolder holds connections to a real TCP server that keeps them,
// or closes each soon after accepting it, as the console's limits do: the
// holder keeps n attempted from idlePerAddr an address, counts what the
// server closed and what it opened again, and closes every connection
// when stopped.
func TestIdleHolder(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name       string
		n          int
		closeAfter time.Duration // 0: the server keeps them
	}{
		{"the server keeps them", 2*idlePerAddr + 3, 0},
		{"the server closes them", 20, 20 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := startIdleServer(t, tc.closeAfter)
			h, err := startIdleHolder(s.ln.Addr().String(), tc.n, 10*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			defer h.stop()
			h.waitTried(time.Minute)
			killed := time.Now()
			h.markRestart()
			restart := time.Now()
			if tc.closeAfter == 0 {
				eventually(t, "every connection open", func() bool {
					open, _, _, _ := s.counts()
					return open == tc.n && h.open.Load() == int64(tc.n)
				})
				_, _, addrs, maxAddr := s.counts()
				if want := (tc.n + idlePerAddr - 1) / idlePerAddr; addrs != want || maxAddr != idlePerAddr {
					t.Errorf("connections from %d addresses, at most %d from one; want %d and %d", addrs, maxAddr, want, idlePerAddr)
				}
			} else {
				eventually(t, "connections closed by the server and opened again", func() bool {
					return h.closed.Load() >= int64(3*tc.n) && h.reopened.Load() >= int64(3*tc.n)
				})
			}
			time.Sleep(300 * time.Millisecond) // samples for the figures
			end := time.Now()
			h.stop()
			f := h.figures(killed, restart, end)
			if tc.closeAfter == 0 && (f.Closed != 0 || f.HeldMax != int64(tc.n)) {
				t.Errorf("closed %d, held at most %d; want 0 and %d", f.Closed, f.HeldMax, tc.n)
			}
			if tc.closeAfter > 0 && (f.Closed < int64(3*tc.n) || f.Reopened < int64(3*tc.n)) {
				t.Errorf("closed %d, reopened %d; want at least %d each", f.Closed, f.Reopened, 3*tc.n)
			}
			if f.Wanted != tc.n || f.HeldMax > int64(tc.n) {
				t.Errorf("wanted %d, held at most %d; want %d and no more", f.Wanted, f.HeldMax, tc.n)
			}
			if n := h.open.Load(); n != 0 {
				t.Errorf("%d connections open after stop", n)
			}
			eventually(t, "the server sees every connection closed", func() bool {
				open, _, _, _ := s.counts()
				return open == 0
			})
			// Stopped means stopped: nothing dials any more.
			_, before, _, _ := s.counts()
			time.Sleep(100 * time.Millisecond)
			if _, after, _, _ := s.counts(); after != before {
				t.Errorf("%d connections made after stop", after-before)
			}
		})
	}
}

// TestIdleFigures checks the holder's figures over a stretch of samples.
func TestIdleFigures(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	h := &idleHolder{n: 10}
	for i, open := range []int64{10, 10, 0, 0, 4, 8, 10, 6} { // every 100 ms
		h.samples = append(h.samples, idleSample{t: at(100 * i), open: open})
	}
	h.closed.Store(4)
	h.reopened.Store(28)
	cases := []struct {
		name                 string
		killed, restart, end time.Time
		atKill, max          int64
		mean, seconds        float64
	}{
		{"the whole storm", at(150), at(350), at(750), 10, 10, (4 + 8 + 10 + 6) / 4.0, 0.4},
		{"cut short", at(150), at(350), at(550), 10, 8, (4 + 8) / 2.0, 0.2},
		{"killed later", at(250), at(350), at(750), 0, 10, (4 + 8 + 10 + 6) / 4.0, 0.4},
		{"nothing sampled", at(150), at(360), at(370), 10, 0, 0, 0.01},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := h.figures(tc.killed, tc.restart, tc.end)
			if f.Wanted != 10 || f.AtKill != tc.atKill || f.HeldMax != tc.max || f.Closed != 4 || f.Reopened != 28 ||
				!near(f.HeldMean, tc.mean) || !near(f.Seconds, tc.seconds) {
				t.Errorf("figures %+v; want at the kill %d, max %d, mean %.2f over %.2f s, closed 4, reopened 28",
					f, tc.atKill, tc.max, tc.mean, tc.seconds)
			}
		})
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

// TestStartIdleHolderRefuses checks the holder's arguments and the
// process's open-file limit.
func TestStartIdleHolderRefuses(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		n     int
		pause time.Duration
		want  string // in the error
	}{
		{"no connections", 0, time.Second, "positive"},
		{"no pause", 10, 0, "positive"},
		{"more than the open-file limit", 1 << 20, time.Second, "open files"},
		{"more than the addresses", 1 << 30, time.Second, "source addresses"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, err := startIdleHolder("127.0.0.1:1", tc.n, tc.pause)
			if err == nil {
				h.stop()
				t.Fatal("started; want an error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q; want one about %q", err, tc.want)
			}
		})
	}
}
