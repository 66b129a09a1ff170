package testenv

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// BuildBinaries builds the three binaries once per test process and
// returns their directory.
func BuildBinaries(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			buildErr = err
			return
		}
		buildDir, buildErr = os.MkdirTemp("", "edgebox-bin-")
		if buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", buildDir+string(os.PathSeparator), "./cmd/...")
		cmd.Dir = filepath.Dir(strings.TrimSpace(string(root)))
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}

// Binaries is a console and agents running as the built programs.
type Binaries struct {
	bin     string
	dataDir string
	addr    string
	url     string
	admin   *api.Client
	token   string
	pw      string // the admin user's password
	caPEM   []byte
	cliConf string // the CLI's config file, once logged in

	mu      sync.Mutex
	console *exec.Cmd
	logs    *bytes.Buffer
	errBuf  *syncBuffer // logs, written as the console runs
}

// NewBinaries builds the binaries and starts edgebox-console on a free
// loopback port.
func NewBinaries(t testing.TB) *Binaries { return NewBinariesWith(t, nil) }

// NewBinariesWith is NewBinaries with prepare run on the console's data
// directory before the console starts (to put downloads in <data>/dist).
func NewBinariesWith(t testing.TB, prepare func(t testing.TB, dataDir, binDir string)) *Binaries {
	t.Helper()
	e := &Binaries{bin: BuildBinaries(t), dataDir: t.TempDir()}
	if prepare != nil {
		prepare(t, e.dataDir, e.bin)
	}
	e.addr = FreeAddr(t)
	e.url = "https://" + e.addr
	out := e.startConsole(t)
	tok, err := parseAdminToken(out)
	if err != nil {
		t.Fatal(err)
	}
	m := adminPasswordRE.FindSubmatch(out)
	if m == nil {
		t.Fatalf("no admin password in console output %q", out)
	}
	e.token, e.pw, e.caPEM = tok, string(m[1]), FetchCA(t, e.url)
	e.admin, err = api.NewClient(e.url, tok, e.caPEM)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.stopConsole(t, syscall.SIGTERM) })
	return e
}

// startConsole starts the console and waits until its API answers; it
// returns what the console printed on stdout.
func (e *Binaries) startConsole(t testing.TB) []byte {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(e.bin, "edgebox-console"), "--data", e.dataDir, "--listen", e.addr, "--public-url", e.url)
	errBuf := &syncBuffer{b: &stderr}
	cmd.Stdout, cmd.Stderr = &syncBuffer{b: &stdout}, errBuf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	e.console, e.logs, e.errBuf = cmd, &stderr, errBuf
	e.mu.Unlock()
	deadline := time.Now().Add(15 * time.Second)
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for {
		resp, err := hc.Get(e.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("console did not listen: %s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return []byte(cmd.Stdout.(*syncBuffer).String())
}

func (e *Binaries) stopConsole(t testing.TB, sig syscall.Signal) {
	e.mu.Lock()
	cmd := e.console
	e.console = nil
	e.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(sig)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Errorf("console did not stop on %v", sig)
	}
	if t.Failed() {
		t.Logf("console log:\n%s", e.logs.String())
	}
}

func (e *Binaries) Admin() *api.Client { return e.admin }

// ConsoleLog is what the running console wrote on its standard error so
// far.
func (e *Binaries) ConsoleLog() string {
	e.mu.Lock()
	b := e.errBuf
	e.mu.Unlock()
	if b == nil {
		return ""
	}
	return b.String()
}

// Bin is the directory of the built binaries.
func (e *Binaries) Bin() string { return e.bin }

// DataDir is the console's data directory.
func (e *Binaries) DataDir() string { return e.dataDir }

// CLICommand returns the edgebox CLI with args, logged in to the console
// with the admin token, for a test to run as it needs (under a PTY, with
// its own input).
func (e *Binaries) CLICommand(t testing.TB, args ...string) *exec.Cmd {
	t.Helper()
	if _, err := e.CLI(t, "whoami"); err != nil {
		t.Fatalf("edgebox whoami: %v", err)
	}
	cmd := exec.Command(filepath.Join(e.bin, "edgebox"), args...)
	cmd.Env = append(os.Environ(), "EDGEBOX_CONFIG="+e.cliConf)
	return cmd
}

// CLI runs the edgebox CLI, logged in to the console with the admin token,
// and returns its combined output.
func (e *Binaries) CLI(t testing.TB, args ...string) (string, error) {
	t.Helper()
	run := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(e.bin, "edgebox"), args...)
		cmd.Env = append(os.Environ(), "EDGEBOX_CONFIG="+e.cliConf)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if e.cliConf == "" {
		e.cliConf = filepath.Join(t.TempDir(), "edgebox.json")
		blk, _ := pem.Decode(e.caPEM)
		sum := sha256.Sum256(blk.Bytes)
		if out, err := run("login", e.url, "--token", e.token, "--ca-sha256", hex.EncodeToString(sum[:])); err != nil {
			t.Fatalf("edgebox login: %v: %s", err, out)
		}
	}
	return run(args...)
}
func (e *Binaries) URL() string { return e.url }

// CAPEM is the console's CA certificate.
func (e *Binaries) CAPEM() []byte { return e.caPEM }

// AdminToken is the admin's API token.
func (e *Binaries) AdminToken() string { return e.token }

// AdminPassword is the admin user's password, printed at first start.
func (e *Binaries) AdminPassword() string { return e.pw }

var adminPasswordRE = regexp.MustCompile(`(?m)^\s+password:\s+(\S+)`)

// CLIWith runs the edgebox CLI with env added to its environment (its own
// EDGEBOX_CONFIG, say, to act as another user) and returns its combined
// output.
func (e *Binaries) CLIWith(t testing.TB, env []string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(e.bin, "edgebox"), args...)
	cmd.Env = append(append(os.Environ(), "EDGEBOX_TOKEN=", "EDGEBOX_TENANT="), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (e *Binaries) Token(t testing.TB, req api.TokenRequest) string {
	return createToken(t, e.admin, req)
}

// RestartConsole kills the console with SIGKILL, as a crash would, and
// starts it again.
func (e *Binaries) RestartConsole(t testing.TB) {
	t.Helper()
	e.stopConsole(t, syscall.SIGKILL)
	e.startConsole(t)
}

func (e *Binaries) Enroll(t testing.TB, token, name string) (Box, error) {
	return enrollBinary(t, e.bin, token, name)
}

// EnrollBinary enrolls a box with the agent binary, with any console the
// token names: its agent runs as a process of its own (StartAgentArgs,
// StartAgentIn).
func EnrollBinary(t testing.TB, token, name string) (Box, error) {
	return enrollBinary(t, BuildBinaries(t), token, name)
}

func enrollBinary(t testing.TB, bin, token, name string) (Box, error) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "edgebox-agent"), "enroll", "--data", dir, "--name", name, token).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s", bytes.TrimSpace(out))
	}
	s := string(out)
	i := strings.Index(s, "(box ")
	if i < 0 {
		return nil, fmt.Errorf("no box ID in %q", s)
	}
	id := strings.Fields(s[i+len("(box "):])[0]
	id = strings.TrimSuffix(id, ")")
	return &binaryBox{bin: bin, dir: dir, id: id}, nil
}

type binaryBox struct {
	bin, dir, id string
	mu           sync.Mutex
	cmd          *exec.Cmd
	logs         *syncBuffer
}

func (b *binaryBox) ID() string      { return b.id }
func (b *binaryBox) DataDir() string { return b.dir }

func (b *binaryBox) Start(t testing.TB) { b.StartArgs(t) }

// StartArgs starts the agent with more flags for 'edgebox-agent run'.
func (b *binaryBox) StartArgs(t testing.TB, args ...string) {
	t.Helper()
	b.start(t, exec.Command(filepath.Join(b.bin, "edgebox-agent"), append([]string{"run", "--data", b.dir}, args...)...))
}

// start starts cmd as the box's agent, which Stop stops.
func (b *binaryBox) start(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	logs := &syncBuffer{b: new(bytes.Buffer)}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	b.cmd, b.logs = cmd, logs
	b.mu.Unlock()
	t.Cleanup(func() { b.Stop(t) })
}

func (b *binaryBox) Stop(t testing.TB) {
	b.mu.Lock()
	cmd := b.cmd
	b.cmd = nil
	b.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Errorf("agent %s did not stop on SIGTERM", b.id)
	}
	if t.Failed() {
		t.Logf("agent %s log:\n%s", b.id, b.logs.String())
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// StartAgentArgs starts a box enrolled by Binaries with more flags for
// 'edgebox-agent run'.
func StartAgentArgs(t testing.TB, b Box, args ...string) { b.(*binaryBox).StartArgs(t, args...) }

// StartAgentIn starts a box enrolled as a binary in the network namespace
// netns ('ip netns exec', which becomes the agent), with more flags for
// 'edgebox-agent run'.
func StartAgentIn(t testing.TB, b Box, netns string, args ...string) {
	t.Helper()
	bb := b.(*binaryBox)
	bb.start(t, exec.Command("ip", append([]string{"netns", "exec", netns, filepath.Join(bb.bin, "edgebox-agent"), "run", "--data", bb.dir}, args...)...))
}

// KillAgent kills a binary box's agent with SIGKILL, as a crash or a
// power cut would, and waits for it to be gone.
func KillAgent(t testing.TB, b Box) {
	bb := b.(*binaryBox)
	bb.mu.Lock()
	cmd := bb.cmd
	bb.cmd = nil
	bb.mu.Unlock()
	if cmd != nil {
		cmd.Process.Kill()
		cmd.Wait()
	}
}
