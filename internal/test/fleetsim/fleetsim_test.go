package fleetsim

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/tunnel"
)

func TestMain(m *testing.M) {
	Main() // a fleet's child process runs here and exits
	os.Exit(m.Run())
}

// TestFleetAcrossProcesses runs 200 real agents in 3 child processes
// against the console binary: every box comes online and catches up with
// its desired state, each on one session; then one child is killed and
// only its boxes go offline in the console.
func TestFleetAcrossProcesses(t *testing.T) {
	const n, procs = 200, 3
	e := testenv.NewBinaries(t)
	admin := e.Admin()
	tok := e.Token(t, api.TokenRequest{Region: "sim", Site: "lab", Uses: n + 10, TTL: "1h"})
	cfg := DefaultConfig(n, tok, t.TempDir())
	cfg.Processes = procs
	cfg.Log = testenv.Logger(t)
	fds0 := openFiles(t)
	t0 := time.Now()
	f, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			f.Close()
		}
	})
	t.Logf("%d boxes enrolled by %d processes in %v", n, f.Processes(), time.Since(t0).Round(time.Millisecond))
	ids := f.IDs()
	for i, id := range ids {
		if id == "" {
			t.Fatalf("box %d has no ID", i)
		}
	}

	// Something to catch up with: one workload a box, for the fake driver.
	targets, err := PutWorkloads(admin, ids, "sim")
	if err != nil {
		t.Fatal(err)
	}
	since, err := f.StartAgents()
	if err != nil {
		t.Fatal(err)
	}
	w := Window{Since: since, Target: func(i int) uint64 { return targets[i] }}
	var st Stats
	waitFor(t, 2*time.Minute, "every box online and synced", func() bool {
		st = f.Stats(w)
		return st.AllSynced
	})
	t.Logf("all %d online and synced %v after the agents started", n, st.AllSyncedAfter.Round(time.Millisecond))
	// This process holds the children's pipes, not the boxes' files.
	fds := openFiles(t)
	perChild, err := f.OpenFiles()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("open files in this process: %d before the fleet, %d with it running; in its processes: %v", fds0, fds, perChild)
	if fds-fds0 > 30 {
		t.Errorf("this process holds %d open files more with %d boxes running; want only its children's pipes", fds-fds0, n)
	}
	online := onlineInConsole(t, admin)
	for i, id := range ids {
		if !online[id] {
			t.Errorf("box %d (%s) is synced by its own account but not online in the console", i, id)
		}
	}

	st = f.Stats(w)
	if st.Synced != n || st.Up != n || st.Left != 0 {
		t.Errorf("synced %d, up %d, left %d; want %d, %d, 0", st.Synced, st.Up, st.Left, n, n)
	}
	if st.Sessions != n || st.SessionsMin != 1 || st.SessionsMax != 1 || st.Dropped != 0 {
		t.Errorf("sessions %d (per box %d to %d), dropped %d; want one a box and none dropped",
			st.Sessions, st.SessionsMin, st.SessionsMax, st.Dropped)
	}
	if st.DialsMin < 1 || st.Dials != st.Sessions+st.ConnectFailures {
		t.Errorf("dials %d (per box %d to %d), failed connects %d, sessions %d: want at least one a box, and each dial a session or a failure",
			st.Dials, st.DialsMin, st.DialsMax, st.ConnectFailures, st.Sessions)
	}
	if last := st.Curve[len(st.Curve)-1]; last.Synced != n {
		t.Errorf("the curve ends at %+v; want %d synced", last, n)
	}

	// Kill one child: its boxes, and only they, go offline in the console.
	const victim = 1
	first, count := f.ProcessBoxes(victim)
	killed := time.Now()
	if err := f.Kill(victim); err != nil {
		t.Fatal(err)
	}
	var wrong []string
	waitFor(t, time.Minute, "the killed process's boxes offline in the console, the others online", func() bool {
		online := onlineInConsole(t, admin)
		wrong = wrong[:0]
		for i, id := range ids {
			dead := i >= first && i < first+count
			if online[id] == dead {
				wrong = append(wrong, fmt.Sprintf("%d online=%v", i, online[id]))
			}
		}
		return len(wrong) == 0
	})
	t.Logf("boxes %d–%d offline in the console %v after their process was killed", first, first+count-1, time.Since(killed).Round(time.Millisecond))
	st = f.Stats(w)
	if st.Left != count || st.Synced != n-count || st.Dropped != 0 || st.Sessions != n {
		t.Errorf("after the kill: left %d, synced %d, dropped %d, sessions %d; want %d, %d, 0, %d",
			st.Left, st.Synced, st.Dropped, st.Sessions, count, n-count, n)
	}

	closed = true
	t1 := time.Now()
	if err := f.Close(); err != nil {
		t.Errorf("closing the fleet: %v", err)
	}
	t.Logf("the fleet closed in %v", time.Since(t1).Round(time.Millisecond))
	st = f.Stats(w)
	if st.Left != n || st.Dropped != 0 {
		t.Errorf("after Close: left %d, dropped %d; want %d and 0", st.Left, st.Dropped, n)
	}

	// The same boxes again, enrolled already: the new fleet is the same
	// boxes, and closed before its agents start it ends cleanly.
	t1 = time.Now()
	g, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the fleet started again, enrolled already, in %v", time.Since(t1).Round(time.Millisecond))
	if got := g.IDs(); !reflect.DeepEqual(got, ids) {
		t.Errorf("the same directories gave other boxes: %v; want %v", got, ids)
	}
	if err := g.Close(); err != nil {
		t.Errorf("closing a fleet before its agents started: %v", err)
	}
}

// onlineInConsole is the set of boxes the console shows online, with
// their hello answered.
func onlineInConsole(t *testing.T, admin *api.Client) map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bs, err := admin.Boxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	online := map[string]bool{}
	for _, b := range bs {
		if b.Online && b.AgentVersion != "" {
			online[b.ID] = true
		}
	}
	return online
}

// openFiles is the number of files this process holds open.
func openFiles(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err) // Linux only, as the fleet's children are
	}
	return len(fds)
}

// waitFor polls cond every 200 ms until it holds, or fails the test
// after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestParseLine(t *testing.T) {
	t.Parallel()
	at := time.Unix(1700000000, 123)
	tests := []struct {
		line    string
		want    message
		wantErr bool
	}{
		{line: "id 12 bx-abc", want: message{word: "id", box: 12, text: "bx-abc"}},
		{line: "enrolled 10", want: message{word: "enrolled", count: 10}},
		{line: "stopping", want: message{word: "stopping"}},
		{line: "error enrolling: boom", want: message{word: "error", text: "enrolling: boom"}},
		{line: formatEvent(Event{At: at, Kind: Dial, Box: 10}), want: message{word: "event", ev: Event{At: at, Kind: Dial, Box: 10}}},
		{line: formatEvent(Event{At: at, Kind: Up, Box: 19}), want: message{word: "event", ev: Event{At: at, Kind: Up, Box: 19}}},
		{line: formatEvent(Event{At: at, Kind: Stored, Box: 11, Rev: 7}), want: message{word: "event", ev: Event{At: at, Kind: Stored, Box: 11, Rev: 7}}},
		{line: formatEvent(Event{At: at, Kind: ConnectFailed, Box: 12, Why: WhyBusy}), want: message{word: "event", ev: Event{At: at, Kind: ConnectFailed, Box: 12, Why: WhyBusy}}},
		{line: "fail 1700000000000000123 12", wantErr: true},       // no reason
		{line: "fail 1700000000000000123 12 tired", wantErr: true}, // not a reason
		{line: "", wantErr: true},
		{line: "enrolled 9", wantErr: true},                // not the child's count
		{line: "id 20 bx-abc", wantErr: true},              // not the child's box
		{line: "id 9 bx-abc", wantErr: true},               // nor this
		{line: "up 1700000000000000123 20", wantErr: true}, // box out of range
		{line: "gone 1700000000000000123 12", wantErr: true},
		{line: "teleport 1700000000000000123 12", wantErr: true},
		{line: "up -5 12", wantErr: true},
		{line: "up 1700000000000000123 12 3", wantErr: true},
		{line: "stored 1700000000000000123 12", wantErr: true},
		{line: "stored 1700000000000000123 12 -1", wantErr: true},
		{line: "id 12 " + strings.Repeat("x", 200), wantErr: true},
		{line: "error " + strings.Repeat("x", maxLine), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.line[:min(len(tt.line), 40)], func(t *testing.T) {
			got, err := parseLine(tt.line, 10, 10)
			if tt.wantErr {
				if err == nil || !errors.Is(err, errBadLine) {
					t.Fatalf("parseLine(%q) = %+v, %v; want errBadLine", tt.line, got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.word != tt.want.word || got.box != tt.want.box || got.count != tt.want.count || got.text != tt.want.text ||
				!got.ev.At.Equal(tt.want.ev.At) || got.ev.Kind != tt.want.ev.Kind || got.ev.Box != tt.want.ev.Box || got.ev.Rev != tt.want.ev.Rev || got.ev.Why != tt.want.ev.Why {
				t.Fatalf("parseLine(%q) = %+v; want %+v", tt.line, got, tt.want)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1700000000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ev := func(ms int, k Kind, box int, rev ...uint64) Event {
		e := Event{At: at(ms), Kind: k, Box: box}
		if len(rev) > 0 {
			e.Rev = rev[0]
		}
		return e
	}
	// Box 0 comes up at once; box 1 fails twice first; both store rev 5.
	cold := []Event{
		ev(0, Dial, 0), ev(10, Up, 0), ev(20, Hello, 0), ev(30, Stored, 0, 5),
		ev(0, Dial, 1), ev(5, ConnectFailed, 1), ev(1000, Dial, 1), ev(1005, ConnectFailed, 1),
		ev(2000, Dial, 1), ev(2010, Up, 1), ev(2020, Hello, 1), ev(2500, Stored, 1, 5),
	}
	cold[5].Why, cold[7].Why = WhyRefused, WhyBusy
	failedBy := [numWhy]int{WhyRefused: 1, WhyBusy: 1}
	tests := []struct {
		name   string
		events []Event
		w      Window
		want   Stats
		points []Point
	}{{
		name: "cold start", events: cold,
		w: Window{Since: t0, Until: at(3000), Target: func(int) uint64 { return 5 }},
		want: Stats{Boxes: 2, Up: 2, Synced: 2, AllSynced: true, AllSyncedAfter: 2500 * time.Millisecond,
			Dials: 4, DialsMean: 2, DialsMin: 1, DialsMax: 3, ConnectFailures: 2, FailedBy: failedBy, Sessions: 2, SessionsMin: 1, SessionsMax: 1},
		points: []Point{{0, 0, 0}, {time.Second, 1, 1}, {2 * time.Second, 1, 1}, {3 * time.Second, 2, 2}},
	}, {
		name: "no target: synced is greeted", events: cold,
		w: Window{Since: t0, Until: at(3000)},
		want: Stats{Boxes: 2, Up: 2, Synced: 2, AllSynced: true, AllSyncedAfter: 2020 * time.Millisecond,
			Dials: 4, DialsMean: 2, DialsMin: 1, DialsMax: 3, ConnectFailures: 2, FailedBy: failedBy, Sessions: 2, SessionsMin: 1, SessionsMax: 1},
	}, {
		name: "not yet at the target", events: cold,
		w: Window{Since: t0, Until: at(3000), Target: func(i int) uint64 { return uint64(5 + i) }},
		want: Stats{Boxes: 2, Up: 2, Synced: 1,
			Dials: 4, DialsMean: 2, DialsMin: 1, DialsMax: 3, ConnectFailures: 2, FailedBy: failedBy, Sessions: 2, SessionsMin: 1, SessionsMax: 1},
	}, {
		name: "a drop after admission, and a box that left",
		events: append(copyEvents(cold), ev(4000, Down, 0), ev(4000, Dial, 0), ev(4100, Up, 0), ev(4200, Hello, 0),
			ev(5000, Gone, 1)),
		w: Window{Since: at(3000), Until: at(6000)},
		want: Stats{Boxes: 2, Left: 1, Up: 1, Synced: 1, AllSynced: true, AllSyncedAfter: 1200 * time.Millisecond,
			Dials: 1, DialsMean: 1, DialsMin: 1, DialsMax: 1, Sessions: 1, SessionsMin: 1, SessionsMax: 1},
	}, {
		name: "the storm: sessions from before the window end, one admitted in it drops",
		events: append(copyEvents(cold), ev(4000, Down, 0), ev(4000, Down, 1), ev(4500, Dial, 0), ev(4600, Up, 0),
			ev(4700, Down, 0), ev(5000, Dial, 0), ev(5100, Up, 0), ev(5200, Hello, 0), ev(5000, Dial, 1), ev(5050, Up, 1), ev(5060, Hello, 1)),
		w: Window{Since: at(4000), Until: at(6000)},
		want: Stats{Boxes: 2, Up: 2, Synced: 2, AllSynced: true, AllSyncedAfter: 1200 * time.Millisecond,
			Dials: 3, DialsMean: 1.5, DialsMin: 1, DialsMax: 2, Sessions: 3, SessionsMin: 1, SessionsMax: 2, Dropped: 1},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := summarize(2, copyEvents(tt.events), tt.w)
			curve := got.Curve
			got.Curve = nil
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
			if tt.points != nil && fmt.Sprint(curve) != fmt.Sprint(tt.points) {
				t.Errorf("curve %v; want %v", curve, tt.points)
			}
		})
	}
}

// copyEvents copies evs, so a test's cases do not share one array.
func copyEvents(evs []Event) []Event { return append([]Event(nil), evs...) }

// BenchmarkStats adds up the events of a storm of 15,000 boxes (about ten
// each), as BenchmarkFleet does once a second while it waits.
func BenchmarkStats(b *testing.B) {
	const n = 15000
	t0 := time.Unix(1700000000, 0)
	f := &Fleet{events: make([][]Event, n), ids: make([]string, n)}
	for i := range n {
		at := t0.Add(time.Duration(i) * time.Millisecond)
		for _, k := range []Kind{Dial, ConnectFailed, Dial, ConnectFailed, Dial, Up, Hello, Stored, Down, Dial, Up, Hello} {
			f.events[i] = append(f.events[i], Event{At: at, Kind: k, Box: i, Rev: 1})
			at = at.Add(100 * time.Millisecond)
		}
	}
	for b.Loop() {
		if st := f.Stats(Window{Since: t0, Until: t0.Add(time.Minute)}); !st.AllSynced {
			b.Fatalf("%+v", st)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	good := DefaultConfig(10, "tok", "/tmp/x")
	tests := []struct {
		name   string
		change func(*Config)
		ok     bool
	}{
		{"default", func(*Config) {}, true},
		{"no boxes", func(c *Config) { c.Boxes = 0 }, false},
		{"more processes than boxes", func(c *Config) { c.Processes = 11 }, false},
		{"negative processes", func(c *Config) { c.Processes = -1 }, false},
		{"no token", func(c *Config) { c.Token = "" }, false},
		{"no dir", func(c *Config) { c.Dir = "" }, false},
		{"no boxes per address", func(c *Config) { c.BoxesPerAddr = 0 }, false},
		{"no enrolments at once", func(c *Config) { c.EnrollParallel = 0 }, false},
		{"more boxes than addresses", func(c *Config) { c.Boxes, c.BoxesPerAddr = 1<<30, 1 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			tt.change(&c)
			if err := c.Validate(); (err == nil) != tt.ok {
				t.Fatalf("Validate() = %v; want ok %v", err, tt.ok)
			}
		})
	}
}

// TestStartFailsClearly: a child that cannot enroll its boxes ends, and
// Start says which and why, leaving nothing running.
func TestStartFailsClearly(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig(4, "not-a-token", t.TempDir())
	cfg.Processes = 2
	f, err := Start(cfg)
	if err == nil {
		f.Close()
		t.Fatal("Start with a bad token succeeded")
	}
	if !strings.Contains(err.Error(), "ended before its boxes were enrolled") || !strings.Contains(err.Error(), "enrolling") {
		t.Fatalf("Start: %v; want the child's enrolment error", err)
	}
}

func TestWhyFailed(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		err  error
		want Why
	}{
		{fmt.Errorf("tunnel: %w", &tunnel.BusyError{RetryAfter: time.Second}), WhyBusy},
		{&net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, WhyRefused},
		{fmt.Errorf("tunnel: dial: %w", context.DeadlineExceeded), WhyTimeout},
		{&net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, WhyTimeout},
		{&net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, WhyReset},
		{fmt.Errorf("tls: %w", io.EOF), WhyReset},
		{fmt.Errorf("remote error: %w", tls.AlertError(42)), WhyTLS},
		{errors.New("something else"), WhyOther},
	} {
		if got := whyFailed(tt.err); got != tt.want {
			t.Errorf("whyFailed(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
