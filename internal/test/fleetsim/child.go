package fleetsim

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/fake"
	"github.com/edgebox/edgebox/tunnel"
)

// childEnv is set in a child's environment; its value is the child's
// number.
const childEnv = "EDGEBOX_FLEETSIM_CHILD"

// spec is what the parent tells a child, as one JSON line on its standard
// input. Then "run" on a line starts the agents; the end of standard input
// stops them and ends the child.
type spec struct {
	First   int    `json:"first"` // the fleet index of the child's first box
	Boxes   int    `json:"boxes"`
	Dir     string `json:"dir"`   // box i's data is in Dir/box-<i>
	Token   string `json:"token"` // the enrollment token
	Site    int    `json:"site"`  // the child's first source address
	PerAddr int    `json:"per_addr"`
	Enroll  int    `json:"enroll"` // enrolments at once
	// LogFile, when set, takes the agents' logs (info and above);
	// otherwise only errors go to standard error.
	LogFile string `json:"log_file,omitempty"`
	// CPUProfile, when set, takes the child's CPU profile, from its
	// start to its end.
	CPUProfile string `json:"cpu_profile,omitempty"`
	// Agent changes the agents' settings.
	Agent AgentSettings `json:"agent,omitzero"`
}

// apply sets the non-zero settings of s in cfg.
func (s AgentSettings) apply(cfg *agent.Config) {
	set := func(dst *time.Duration, v time.Duration) {
		if v != 0 {
			*dst = v
		}
	}
	set(&cfg.HelloTimeout, s.HelloTimeout)
	set(&cfg.UpAnswerTimeout, s.UpAnswerTimeout)
	set(&cfg.PendingRecheck, s.PendingRecheck)
	set(&cfg.SyncRetry, s.SyncRetry)
	set(&cfg.Tunnel.PingInterval, s.PingInterval)
	set(&cfg.Tunnel.PingTimeout, s.PingTimeout)
	set(&cfg.Tunnel.OpenTimeout, s.OpenTimeout)
	set(&cfg.Rejoin, s.Rejoin)
}

// Main runs this process as one of a fleet's child processes when the
// parent started it as one, and then exits; otherwise it returns at once.
// Call it first thing in the TestMain of any test package that starts a
// Fleet: the children are that test binary, started again.
func Main() {
	if os.Getenv(childEnv) == "" {
		return
	}
	events := os.NewFile(3, "events")
	if err := runChild(os.Stdin, events); err != nil {
		fmt.Fprintf(events, "error %s\n", oneLine(err.Error()))
		fmt.Fprintf(os.Stderr, "fleetsim child %s: %v\n", os.Getenv(childEnv), err)
		os.Exit(1)
	}
	os.Exit(0)
}

// oneLine keeps s to one bounded line.
func oneLine(s string) string {
	out := []rune{}
	for _, r := range s {
		if r == '\n' || r == '\r' {
			r = ' '
		}
		out = append(out, r)
		if len(out) >= 400 {
			break
		}
	}
	return string(out)
}

// siteAddr is the loopback source address numbered site: 127.1.x.y, 250
// a block, as BenchmarkFleet has always dialled from.
func siteAddr(site int) net.IP {
	return net.IPv4(127, 1+byte(site/(250*256)), byte(site/250%256), byte(site%250+1))
}

// whyFailed classes the error of a failed attempt at a session.
func whyFailed(err error) Why {
	var busy *tunnel.BusyError
	var alert tls.AlertError
	var netErr net.Error
	switch {
	case errors.As(err, &busy):
		return WhyBusy
	case errors.Is(err, syscall.ECONNREFUSED):
		return WhyRefused
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return WhyTimeout
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return WhyReset
	case errors.As(err, &alert):
		return WhyTLS
	}
	return WhyOther
}

// emitter writes events to the pipe, in the order they are given, and
// flushes every 50 ms and when closed.
type emitter struct {
	mu  sync.Mutex // guards w and err
	w   *bufio.Writer
	err error

	stop, done chan struct{} // close stop to end the flusher; done closes when it has
}

func newEmitter(w io.Writer) *emitter {
	e := &emitter{w: bufio.NewWriterSize(w, 64<<10), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(e.done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-e.stop:
				return
			case <-t.C:
				e.mu.Lock()
				if e.err == nil {
					e.err = e.w.Flush()
				}
				e.mu.Unlock()
			}
		}
	}()
	return e
}

func (e *emitter) line(s string) {
	e.mu.Lock()
	if e.err == nil {
		_, e.err = e.w.WriteString(s + "\n")
	}
	e.mu.Unlock()
}

func (e *emitter) event(k Kind, box int, at time.Time, rev uint64) {
	e.line(formatEvent(Event{At: at, Kind: k, Box: box, Rev: rev}))
}

// failed reports a failed attempt at a session of box's, and why.
func (e *emitter) failed(box int, at time.Time, why Why) {
	e.line(formatEvent(Event{At: at, Kind: ConnectFailed, Box: box, Why: why}))
}

// close stops the flusher and flushes what is left.
func (e *emitter) close() error {
	close(e.stop)
	<-e.done
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err == nil {
		e.err = e.w.Flush()
	}
	return e.err
}

// runChild enrolls the child's boxes, runs their agents once told to and
// stops them when its input ends.
func runChild(in io.Reader, out io.Writer) error {
	em := newEmitter(out)
	defer em.close()
	rd := bufio.NewReader(in)
	line, err := rd.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("reading the spec: %w", err)
	}
	var s spec
	if err := json.Unmarshal(line, &s); err != nil {
		return fmt.Errorf("reading the spec: %w", err)
	}
	if s.Boxes <= 0 || s.PerAddr <= 0 || s.Enroll <= 0 || s.Dir == "" || s.Token == "" {
		return fmt.Errorf("bad spec %+v", s)
	}
	logTo := io.Writer(os.Stderr)
	level := slog.LevelError
	if s.LogFile != "" {
		f, err := os.Create(s.LogFile)
		if err != nil {
			return err
		}
		defer f.Close()
		logTo, level = f, slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(logTo, &slog.HandlerOptions{Level: level}))
	prof := &profiler{path: s.CPUProfile}
	if err := prof.next(); err != nil {
		return err
	}
	defer prof.stop()

	dirs := make([]string, s.Boxes)
	dialers := make([]*net.Dialer, s.Boxes)
	for j := range s.Boxes {
		dirs[j] = filepath.Join(s.Dir, "box-"+strconv.Itoa(s.First+j))
		ip := siteAddr(s.Site + j/s.PerAddr)
		dialers[j] = &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, LocalAddr: &net.TCPAddr{IP: ip}}
	}
	if err := enrollAll(s, dirs, dialers, em); err != nil {
		return err
	}
	em.line("enrolled " + strconv.Itoa(s.Boxes))

	// Wait for "run", or the end of input (stop before starting).
	cmd, err := rd.ReadString('\n')
	if err != nil {
		return nil
	}
	if cmd != "run\n" {
		return fmt.Errorf("unknown command %q", cmd)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agents := make([]*agent.Agent, s.Boxes)
	for j, dir := range dirs {
		box, d := s.First+j, dialers[j]
		cfg := agent.DefaultConfig(dir)
		cfg.Drivers = []runtime.Driver{fake.New("containerd")}
		s.Agent.apply(&cfg)
		cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			em.event(Dial, box, time.Now(), 0)
			return d.DialContext(ctx, network, addr)
		}
		cfg.Hooks.AfterStore = func(rev uint64) error {
			em.event(Stored, box, time.Now(), rev)
			return nil
		}
		a, err := agent.New(cfg, log.With("box", box))
		if err != nil {
			return fmt.Errorf("box %d: %w", box, err)
		}
		tc := a.Tunnel()
		onSession, onDialError := tc.OnSession, tc.OnDialError
		tc.OnSession = func(sess *tunnel.Session, up bool) {
			// Stamped before the agent's own record, so a hello it
			// answers is never seen before its session.
			at, k := time.Now(), Down
			if up {
				k = Up
			}
			if onSession != nil {
				onSession(sess, up)
			}
			em.event(k, box, at, 0)
		}
		tc.OnDialError = func(err error) {
			if onDialError != nil {
				onDialError(err)
			}
			em.failed(box, time.Now(), whyFailed(err))
		}
		agents[j] = a
	}

	var wg sync.WaitGroup
	errs := make([]error, s.Boxes)
	for j, a := range agents {
		wg.Add(1)
		go func() { defer wg.Done(); errs[j] = a.Run(ctx) }()
	}
	// The hellos the console answered, from each agent's status.
	wg.Add(1)
	go func() { defer wg.Done(); watchHellos(ctx, s.First, agents, em) }()

	// Until the parent closes our input; "profile" ends the CPU profile
	// and begins the next.
	for {
		cmd, err := rd.ReadString('\n')
		if err != nil {
			break
		}
		if cmd == "profile\n" {
			if err := prof.next(); err != nil {
				log.Error("profile", "err", err)
			}
		}
	}
	em.line("stopping")
	cancel()
	wg.Wait()
	var failed []error
	for j, err := range errs {
		if err != nil {
			failed = append(failed, fmt.Errorf("box %d: %w", s.First+j, err))
		}
	}
	return errors.Join(failed...)
}

// watchHellos reports each hello the console answers, read from the
// agents' status every 100 ms, until ctx ends.
func watchHellos(ctx context.Context, first int, agents []*agent.Agent, em *emitter) {
	last := make([]time.Time, len(agents))
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		for j, a := range agents {
			if st := a.Status(); st.Greeted() && !st.HelloAt.Equal(last[j]) {
				last[j] = st.HelloAt
				em.event(Hello, first+j, st.HelloAt, 0)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// enrollAll enrolls the boxes whose data directory has no identity yet,
// s.Enroll at a time, each from its own source address, and reports
// every box's identity.
func enrollAll(s spec, dirs []string, dialers []*net.Dialer, em *emitter) error {
	ctx := context.Background()
	var wg sync.WaitGroup
	sem := make(chan struct{}, s.Enroll)
	errs := make([]error, len(dirs))
	for j, dir := range dirs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := agent.LoadIdentity(dir); err == nil {
				return // enrolled by an earlier run
			}
			tr := &http.Transport{DialContext: dialers[j].DialContext}
			name := fmt.Sprintf("box-%05d", s.First+j)
			var err error
			for try := 1; ; try++ {
				_, _, err = agent.Enroll(ctx, dir, s.Token, agent.EnrollOptions{Name: name, Transport: tr})
				if err == nil || try == 5 {
					break
				}
				// Again only if nothing was stored: a box is enrolled once.
				if _, lerr := agent.LoadIdentity(dir); !errors.Is(lerr, agent.ErrNotEnrolled) {
					break
				}
				time.Sleep(time.Duration(try) * 200 * time.Millisecond)
			}
			errs[j] = err
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("enrolling: %w", err)
	}
	for j, dir := range dirs {
		id, err := agent.LoadIdentity(dir)
		if err != nil {
			return err
		}
		em.line("id " + strconv.Itoa(s.First+j) + " " + id.BoxID)
	}
	return nil
}

// profiler writes the child's CPU profile to path until told to split
// it, then to path.2, path.3 and so on; an empty path profiles nothing.
type profiler struct {
	path string
	n    int
	f    *os.File
}

// next ends the profile being taken, if any, and begins the next.
func (p *profiler) next() error {
	if p.path == "" {
		return nil
	}
	p.stop()
	p.n++
	name := p.path
	if p.n > 1 {
		name += "." + strconv.Itoa(p.n)
	}
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return err
	}
	p.f = f
	return nil
}

func (p *profiler) stop() {
	if p.f != nil {
		pprof.StopCPUProfile()
		p.f.Close()
		p.f = nil
	}
}
