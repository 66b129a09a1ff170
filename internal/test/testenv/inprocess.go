package testenv

import (
	"bytes"
	"context"

	"sync"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console"
	"github.com/edgebox/edgebox/tunnel"
)

// Options change the in-process environment.
type Options struct {
	// Console adjusts the console's configuration before it starts.
	Console func(*console.Config)
}

// InProcess is a console and its agents running in the test's process.
type InProcess struct {
	t       testing.TB // the test the environment lives for
	opts    Options
	dataDir string
	addr    string
	url     string
	admin   *api.Client
	token   string
	caPEM   []byte

	mu      sync.Mutex // guards console and stop
	console *console.Console
	stop    func()
}

// NewInProcess starts a console on a free loopback port with fresh data;
// everything stops when the test ends.
func NewInProcess(t testing.TB, opts Options) *InProcess {
	t.Helper()
	e := &InProcess{t: t, opts: opts, dataDir: t.TempDir(), addr: "127.0.0.1:0"}
	var out bytes.Buffer
	e.startConsole(t, &out)
	tok, err := parseAdminToken(out.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	e.token = tok
	e.caPEM = FetchCA(t, e.url)
	e.admin, err = api.NewClient(e.url, tok, e.caPEM)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.stopConsole() })
	return e
}

func (e *InProcess) startConsole(t testing.TB, out *bytes.Buffer) {
	t.Helper()
	cfg := console.DefaultConfig()
	cfg.DataDir = e.dataDir
	cfg.Listen = e.addr
	cfg.Out = out
	if e.url != "" {
		cfg.PublicURL = e.url
	}
	cfg.Tunnel.PingInterval = time.Second
	cfg.Tunnel.PingTimeout = 2 * time.Second
	if e.opts.Console != nil {
		e.opts.Console(&cfg)
	}
	c, err := console.New(cfg, Logger(t).With("side", "console"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-c.Ready():
	case err := <-done:
		cancel()
		t.Fatalf("console did not start: %v", err)
	}
	e.mu.Lock()
	e.console = c
	e.stop = func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("the console's Run ended with %v, want nil", err)
		}
	}
	e.mu.Unlock()
	if e.url == "" {
		e.addr = c.Addr().String()
		e.url = "https://" + e.addr
	}
}

// StopConsole stops the console; RestartConsole starts it again.
func (e *InProcess) StopConsole() { e.stopConsole() }

func (e *InProcess) stopConsole() {
	e.mu.Lock()
	stop := e.stop
	e.stop = nil
	e.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// Console returns the running console.
func (e *InProcess) Console() *console.Console {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.console
}

func (e *InProcess) Admin() *api.Client { return e.admin }
func (e *InProcess) URL() string        { return e.url }
func (e *InProcess) CAPEM() []byte      { return e.caPEM }

// AdminToken is the admin API token the console printed.
func (e *InProcess) AdminToken() string { return e.token }

// DataDir is the console's data directory.
func (e *InProcess) DataDir() string { return e.dataDir }

func (e *InProcess) Token(t testing.TB, req api.TokenRequest) string {
	return createToken(t, e.admin, req)
}

func (e *InProcess) RestartConsole(t testing.TB) {
	t.Helper()
	e.stopConsole()
	e.StartConsole(t)
}

// StartConsole starts the console again after StopConsole.
func (e *InProcess) StartConsole(t testing.TB) {
	t.Helper()
	var out bytes.Buffer
	e.startConsole(t, &out)
}

func (e *InProcess) Enroll(t testing.TB, token, name string) (Box, error) {
	return EnrollInProcess(t, token, name)
}

// EnrollInProcess enrolls a box whose agent runs in the test's process
// (StartAgent), with any console: one of Binaries too, when a test wants
// the console in a process of its own and the agents where it can adjust
// them.
func EnrollInProcess(t testing.TB, token, name string) (Box, error) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, _, err := agent.Enroll(ctx, dir, token, agent.EnrollOptions{Name: name})
	if err != nil {
		return nil, err
	}
	return &inProcessBox{dir: dir, id: id.BoxID}, nil
}

// Agent is an in-process box.
type inProcessBox struct {
	dir string
	id  string

	mu    sync.Mutex
	agent *agent.Agent
	stop  func()
}

func (b *inProcessBox) ID() string      { return b.id }
func (b *inProcessBox) DataDir() string { return b.dir }

// Agent returns the running agent, or nil.
func (b *inProcessBox) Agent() *agent.Agent {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.agent
}

func (b *inProcessBox) Start(t testing.TB) { b.StartWith(t, nil) }

// StartWith starts the agent with its configuration adjusted by adjust.
func (b *inProcessBox) StartWith(t testing.TB, adjust func(*agent.Config)) {
	t.Helper()
	cfg := agent.DefaultConfig(b.dir)
	cfg.Version = "test"
	cfg.Tunnel.PingInterval = time.Second
	cfg.Tunnel.PingTimeout = 2 * time.Second
	cfg.Backoff = tunnel.Backoff{Min: 50 * time.Millisecond, Max: 500 * time.Millisecond}
	cfg.PendingRecheck = 200 * time.Millisecond
	cfg.RenewRetry = time.Second
	cfg.SyncRetry = 100 * time.Millisecond
	if adjust != nil {
		adjust(&cfg)
	}
	a, err := agent.New(cfg, Logger(t).With("side", "agent", "box", b.id))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	b.mu.Lock()
	b.agent = a
	b.stop = func() { cancel(); <-done }
	b.mu.Unlock()
	t.Cleanup(func() { b.Stop(t) })
}

func (b *inProcessBox) Stop(t testing.TB) {
	b.mu.Lock()
	stop := b.stop
	b.stop, b.agent = nil, nil
	b.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// StartAgent starts an in-process box's agent with its configuration
// adjusted by adjust (drivers, hooks, timings).
func StartAgent(t testing.TB, b Box, adjust func(*agent.Config)) {
	b.(*inProcessBox).StartWith(t, adjust)
}

// AgentOf returns the in-process agent of a box started by InProcess.
func AgentOf(b Box) *agent.Agent { return b.(*inProcessBox).Agent() }
