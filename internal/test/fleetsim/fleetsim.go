// Package fleetsim runs a simulated fleet of real agents against a console,
// split across child processes, so that more boxes run on one machine than
// one process may hold files for (each box holds its connection and its
// local store's file; a process here may hold 20,000).
//
// Each child is the test binary started again (its TestMain must call
// Main first). It enrolls its share of the boxes with the token it is
// given, each box from its own loopback source address (127.1.x.y, a few
// boxes an address, as a fleet comes from many), then runs their agents:
// the real agent code, tunnel and Sync, with the fake runtime driver. It
// reports what happens to each box over a pipe, with the time it happened:
// each dial, each failed connect, each session up and down, each hello the
// console answered and each Sync batch stored. The parent keeps those
// events and adds them up (Stats): boxes online and synced against time,
// dials per box, sessions dropped after the console admitted them.
//
// The parent holds only the children and their pipes, never a box's
// connection or file.
package fleetsim

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultBoxesPerProcess is how many boxes one child runs unless told
// otherwise: about 6,000 open files (a connection and a store file a box,
// and the agent's own), well under the 20,000 a process may hold here.
const DefaultBoxesPerProcess = 3000

// Config says what fleet to run.
type Config struct {
	// Boxes is the size of the fleet.
	Boxes int
	// Processes is the number of child processes; 0 means
	// ceil(Boxes / DefaultBoxesPerProcess).
	Processes int
	// Token is an enrollment token with at least Boxes uses (a few more
	// let a failed enrolment be tried again).
	Token string
	// Dir holds the boxes' data directories (Dir/box-<i>). Boxes already
	// enrolled there (by an earlier Fleet) are not enrolled again.
	Dir string
	// BoxesPerAddr is how many boxes share one source address; the
	// console limits what one address may hold.
	BoxesPerAddr int
	// EnrollParallel is the number of enrolments one child makes at once.
	EnrollParallel int
	// Env is added to each child's environment (GOMAXPROCS, GODEBUG…).
	Env []string
	// Nice, when above 0, runs the children at that niceness (nice(1)),
	// every thread of theirs: the simulated fleet then takes the CPU the
	// console beside it leaves, as a fleet on machines of its own would.
	Nice int
	// Agent shortens the agents' bounds; zero fields keep the agent's
	// defaults.
	Agent AgentSettings
	// LogDir, when set, takes each child's agents' logs at info level
	// (child-<k>.log); otherwise only their errors go to standard error.
	LogDir string
	// ProfileDir, when set, takes each child's CPU profile over its life
	// (child-<k>.cpu.pprof), split into phases by SplitProfiles.
	ProfileDir string
	// Log is the parent's logger; nil discards.
	Log *slog.Logger
}

// AgentSettings are the agent settings a test may change, for a fleet
// that meets its bounds sooner (agent.Config and tunnel.Config say what
// each means). Zero keeps the agent's default.
type AgentSettings struct {
	HelloTimeout    time.Duration `json:"hello_timeout,omitempty"`
	UpAnswerTimeout time.Duration `json:"up_answer_timeout,omitempty"`
	PendingRecheck  time.Duration `json:"pending_recheck,omitempty"`
	SyncRetry       time.Duration `json:"sync_retry,omitempty"`
	PingInterval    time.Duration `json:"ping_interval,omitempty"`
	PingTimeout     time.Duration `json:"ping_timeout,omitempty"`
	OpenTimeout     time.Duration `json:"open_timeout,omitempty"`
	Rejoin          time.Duration `json:"rejoin,omitempty"`
}

// DefaultConfig is a fleet of n boxes enrolled with token into dir.
func DefaultConfig(n int, token, dir string) Config {
	return Config{Boxes: n, Token: token, Dir: dir, BoxesPerAddr: 8, EnrollParallel: 16}
}

// Validate reports what is wrong with c.
func (c Config) Validate() error {
	switch {
	case c.Boxes <= 0:
		return errors.New("fleetsim: Boxes must be positive")
	case c.Processes < 0 || c.Processes > c.Boxes:
		return fmt.Errorf("fleetsim: Processes is %d; want 0 (default) to Boxes", c.Processes)
	case c.Token == "" || c.Dir == "":
		return errors.New("fleetsim: Token and Dir are required")
	case c.BoxesPerAddr <= 0 || c.EnrollParallel <= 0:
		return errors.New("fleetsim: BoxesPerAddr and EnrollParallel must be positive")
	case (c.Boxes+c.BoxesPerAddr-1)/c.BoxesPerAddr+c.processes() > 255*250*256:
		return errors.New("fleetsim: not enough loopback source addresses for that many boxes; raise BoxesPerAddr")
	}
	return nil
}

func (c Config) processes() int {
	if c.Processes > 0 {
		return c.Processes
	}
	return (c.Boxes + DefaultBoxesPerProcess - 1) / DefaultBoxesPerProcess
}

// Fleet is a running simulated fleet. Its methods are safe to call
// concurrently.
type Fleet struct {
	cfg      Config
	log      *slog.Logger
	children []*child
	readers  sync.WaitGroup // one reader per child, until its pipe ends and it is waited for

	mu     sync.Mutex // guards events, ids and every child's state
	events [][]Event  // by box
	ids    []string   // by box

	closeOnce sync.Once
	closeErr  error
}

// child is one child process and what the parent knows of it. Fields
// below first are guarded by Fleet.mu.
type child struct {
	n, first, boxes int
	cmd             *exec.Cmd
	stdin           io.WriteCloser
	enrolled        chan struct{} // closed when every box of the child is enrolled
	exited          chan struct{} // closed when its pipe ended and the process was waited for

	stopping bool  // asked to stop, or said it stops: sessions that end now are the fleet's doing
	killed   bool  // Kill ended it
	gone     bool  // its boxes have left (Gone recorded)
	err      error // what it reported, or how it ended unasked
}

// Start starts the child processes and has them enroll their boxes; it
// returns once every box is enrolled, with no agent running yet
// (StartAgents). On error nothing is left running.
func Start(cfg Config) (*Fleet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for _, dir := range []string{cfg.Dir, cfg.LogDir, cfg.ProfileDir} {
		if dir == "" {
			continue
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
	}
	f := &Fleet{cfg: cfg, log: log.With("component", "fleetsim"),
		events: make([][]Event, cfg.Boxes), ids: make([]string, cfg.Boxes)}
	k := cfg.processes()
	first, site := 0, 0
	for n := range k {
		boxes := cfg.Boxes / k
		if n < cfg.Boxes%k {
			boxes++
		}
		s := spec{First: first, Boxes: boxes, Dir: cfg.Dir, Token: cfg.Token, Site: site,
			PerAddr: cfg.BoxesPerAddr, Enroll: cfg.EnrollParallel, Agent: cfg.Agent}
		if cfg.LogDir != "" {
			s.LogFile = filepath.Join(cfg.LogDir, "child-"+strconv.Itoa(n)+".log")
		}
		if cfg.ProfileDir != "" {
			s.CPUProfile = filepath.Join(cfg.ProfileDir, "child-"+strconv.Itoa(n)+".cpu.pprof")
		}
		c, err := f.startChild(n, s)
		if err != nil {
			f.Close()
			return nil, err
		}
		f.children = append(f.children, c)
		first += boxes
		site += (boxes + cfg.BoxesPerAddr - 1) / cfg.BoxesPerAddr // each child its own addresses
	}
	for _, c := range f.children {
		select {
		case <-c.enrolled:
			continue
		default:
		}
		select {
		case <-c.enrolled:
		case <-c.exited:
			err := f.childErr(c)
			f.Close()
			return nil, fmt.Errorf("fleetsim: child %d ended before its boxes were enrolled: %w", c.n, err)
		}
	}
	return f, nil
}

// startChild starts child n with spec s.
func (f *Fleet) startChild(n int, s spec) (*child, error) {
	line, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	// With no TestMain calling Main, the child would run the package's
	// tests again; these flags make it run none, and its pipe ends empty.
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	if f.cfg.Nice > 0 {
		cmd = exec.Command("nice", append([]string{"-n", strconv.Itoa(f.cfg.Nice)}, cmd.Args...)...)
	}
	cmd.Env = append(append(os.Environ(), f.cfg.Env...), childEnv+"="+strconv.Itoa(n))
	cmd.ExtraFiles = []*os.File{pw} // the child's fd 3
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		pr.Close()
		pw.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return nil, fmt.Errorf("fleetsim: starting child %d: %w", n, err)
	}
	pw.Close() // the child holds the write end now
	c := &child{n: n, first: s.First, boxes: s.Boxes, cmd: cmd, stdin: stdin,
		enrolled: make(chan struct{}), exited: make(chan struct{})}
	f.readers.Add(1)
	go f.read(c, pr)
	if _, err := stdin.Write(append(line, '\n')); err != nil {
		f.log.Warn("writing a child's spec", "child", n, "err", err) // it ended; read says why
	}
	return c, nil
}

// read takes child c's events until its pipe ends, then waits for it.
func (f *Fleet) read(c *child, r *os.File) {
	defer f.readers.Done()
	defer close(c.exited)
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), maxLine+1)
	var readErr error
	for sc.Scan() {
		m, err := parseLine(sc.Text(), c.first, c.boxes)
		if err != nil {
			readErr = err
			break
		}
		f.take(c, m)
	}
	if readErr == nil {
		readErr = sc.Err()
	}
	if readErr != nil {
		f.log.Error("a child wrote what it should not; killing it", "child", c.n, "err", readErr)
		c.cmd.Process.Kill()
		io.Copy(io.Discard, r)
	}
	waitErr := c.cmd.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	if !c.stopping && !c.killed && c.err == nil {
		c.err = fmt.Errorf("child %d ended unasked: %v", c.n, errors.Join(readErr, waitErr))
	} else if readErr != nil && c.err == nil {
		c.err = readErr
	}
	f.leave(c, time.Now())
}

// take records one message of child c.
func (f *Fleet) take(c *child, m message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch m.word {
	case "id":
		f.ids[m.box] = m.text
	case "enrolled":
		close(c.enrolled)
	case "stopping":
		c.stopping = true
	case "error":
		c.err = fmt.Errorf("child %d: %s", c.n, m.text)
	case "event":
		ev := m.ev
		if ev.Kind == Down && c.stopping {
			ev.Kind = Gone // the fleet stopped it, not the console
		}
		f.events[ev.Box] = append(f.events[ev.Box], ev)
	}
}

// leave records that c's boxes left at t, once. Hold f.mu.
func (f *Fleet) leave(c *child, t time.Time) {
	if c.gone {
		return
	}
	c.gone = true
	for i := c.first; i < c.first+c.boxes; i++ {
		f.events[i] = append(f.events[i], Event{At: t, Kind: Gone, Box: i})
	}
}

func (f *Fleet) childErr(c *child) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return c.err
}

// StartAgents starts every box's agent and returns the time it asked.
func (f *Fleet) StartAgents() (time.Time, error) {
	at := time.Now()
	var errs []error
	for _, c := range f.children {
		if _, err := io.WriteString(c.stdin, "run\n"); err != nil {
			errs = append(errs, fmt.Errorf("fleetsim: starting child %d's agents: %w", c.n, err))
		}
	}
	return at, errors.Join(errs...)
}

// SplitProfiles ends each child's CPU profile and begins the next
// (child-<k>.cpu.pprof.2, .3, ...), so a phase can be profiled alone. It
// does nothing without a ProfileDir.
func (f *Fleet) SplitProfiles() error {
	if f.cfg.ProfileDir == "" {
		return nil
	}
	var errs []error
	for _, c := range f.children {
		if _, err := io.WriteString(c.stdin, "profile\n"); err != nil {
			errs = append(errs, fmt.Errorf("fleetsim: splitting child %d's profile: %w", c.n, err))
		}
	}
	return errors.Join(errs...)
}

// Processes is the number of child processes.
func (f *Fleet) Processes() int { return len(f.children) }

// ProcessBoxes returns the first box of child k and the number it runs.
func (f *Fleet) ProcessBoxes(k int) (first, n int) {
	c := f.children[k]
	return c.first, c.boxes
}

// IDs returns every box's ID, by index.
func (f *Fleet) IDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ids)
}

// Kill ends child k with SIGKILL, as a crash would, and waits until it is
// gone. Its boxes leave the fleet at that moment.
func (f *Fleet) Kill(k int) error {
	if k < 0 || k >= len(f.children) {
		return fmt.Errorf("fleetsim: no child %d", k)
	}
	c := f.children[k]
	f.mu.Lock()
	c.killed = true
	f.leave(c, time.Now())
	f.mu.Unlock()
	if err := c.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-c.exited
	return nil
}

// Events returns a copy of box i's events, in the order they arrived.
func (f *Fleet) Events(i int) []Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.events[i])
}

// CPUTime is the CPU time (user and system) the running children have
// used so far; children already ended are not counted. Linux only.
func (f *Fleet) CPUTime() (time.Duration, error) {
	var sum time.Duration
	for _, c := range f.children {
		select {
		case <-c.exited:
			continue
		default:
		}
		raw, err := os.ReadFile("/proc/" + strconv.Itoa(c.cmd.Process.Pid) + "/stat")
		if err != nil {
			return 0, fmt.Errorf("fleetsim: the CPU time of child %d: %w", c.n, err)
		}
		// Fields after the command's closing parenthesis: utime and stime
		// are the 12th and 13th, in clock ticks (100 a second on Linux).
		s := string(raw)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) < 13 {
			return 0, fmt.Errorf("fleetsim: /proc/%d/stat: %q", c.cmd.Process.Pid, s)
		}
		for _, x := range fields[11:13] {
			t, err := strconv.ParseInt(x, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("fleetsim: /proc/%d/stat: %w", c.cmd.Process.Pid, err)
			}
			sum += time.Duration(t) * 10 * time.Millisecond
		}
	}
	return sum, nil
}

// OpenFiles is the number of files each running child holds open, by
// child (0 for one that ended). Linux only.
func (f *Fleet) OpenFiles() ([]int, error) {
	out := make([]int, len(f.children))
	for k, c := range f.children {
		select {
		case <-c.exited:
			continue
		default:
		}
		fds, err := os.ReadDir("/proc/" + strconv.Itoa(c.cmd.Process.Pid) + "/fd")
		if err != nil {
			return nil, fmt.Errorf("fleetsim: the open files of child %d: %w", c.n, err)
		}
		out[k] = len(fds)
	}
	return out, nil
}

// Close stops every agent and child (a child that does not end within
// two minutes is killed) and reports what went wrong in any child. It is
// idempotent.
func (f *Fleet) Close() error {
	f.closeOnce.Do(func() {
		f.mu.Lock()
		for _, c := range f.children {
			c.stopping = true // asked: a child that ends now does not fail
		}
		f.mu.Unlock()
		for _, c := range f.children {
			c.stdin.Close()
		}
		for _, c := range f.children {
			select {
			case <-c.exited:
			case <-time.After(2 * time.Minute):
				f.log.Error("a child did not stop in two minutes; killing it", "child", c.n)
				f.mu.Lock()
				c.err = errors.Join(c.err, fmt.Errorf("child %d did not stop in two minutes", c.n))
				f.mu.Unlock()
				c.cmd.Process.Kill()
				<-c.exited
			}
		}
		f.readers.Wait()
		var errs []error
		f.mu.Lock()
		for _, c := range f.children {
			if c.err != nil {
				errs = append(errs, c.err)
			}
		}
		f.mu.Unlock()
		f.closeErr = errors.Join(errs...)
	})
	return f.closeErr
}
