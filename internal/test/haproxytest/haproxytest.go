// Package haproxytest runs Debian's HAProxy in TCP mode in front of
// console replicas, as docs/ha.md deploys it: TLS passes through to the
// replicas untouched, so a box's certificate reaches the console it
// lands on.
package haproxytest

import (
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Proxy is a running HAProxy.
type Proxy struct {
	// Addr is where it listens, HOST:PORT.
	Addr     string
	backends []string
	sock     string // the stats socket, for the servers' states
	cmd      *exec.Cmd
	out      *bytes.Buffer
	once     sync.Once
}

// Config is the configuration Start writes: the one in docs/ha.md, on
// addr and with the test's backends.
func Config(addr string, backends []string) string { return config(addr, backends, "") }

// config is Config with, when sock is not empty, a stats socket there
// that the test asks the servers' states.
func config(addr string, backends []string, sock string) string {
	var b strings.Builder
	b.WriteString("global\n\tmaxconn 4000\n")
	if sock != "" {
		fmt.Fprintf(&b, "\tstats socket %s mode 600 level user\n", sock)
	}
	fmt.Fprintf(&b, `
defaults
	mode tcp
	timeout connect 3s
	timeout client 1h
	timeout server 1h
	timeout tunnel 1h
	retries 3
	option redispatch

frontend consoles
	bind %s
	default_backend replicas

backend replicas
	balance leastconn
	option tcp-check
	default-server inter 1s fall 2 rise 2 on-marked-down shutdown-sessions
`, addr)
	for i, be := range backends {
		fmt.Fprintf(&b, "\tserver replica%d %s check\n", i+1, be)
	}
	return b.String()
}

// Start runs HAProxy in front of backends until the test ends.
func Start(t testing.TB, backends []string) *Proxy {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Fatal("haproxy is not installed: scripts/test-deps.sh installs it")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	// A Unix socket's path is short (108 bytes): a test's TempDir may be
	// too long for it.
	sockDir, err := os.MkdirTemp("", "haproxy-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "stats.sock")
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(config(addr, backends, sock)), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-c", "-f", cfg).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
	p := &Proxy{Addr: addr, backends: slices.Clone(backends), sock: sock, out: &bytes.Buffer{}}
	p.cmd = exec.Command(bin, "-db", "-f", cfg)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.stop)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return p
		}
		if time.Now().After(deadline) {
			p.stop()
			t.Fatalf("haproxy did not listen on %s: %v\n%s", addr, err, p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Status is HAProxy's state of the server at backend, one of the
// addresses Start was given: "UP" when HAProxy sends it connections,
// "DOWN" when its checks failed, "UP 1/2" or "DOWN 1/2" on the way from
// one to the other.
func (p *Proxy) Status(backend string) (string, error) { return p.stat(backend, "status") }

// Downs is how many times HAProxy has marked the server at backend down
// since it started (each cut the sessions it carried).
func (p *Proxy) Downs(backend string) (int, error) {
	v, err := p.stat(backend, "chkdown")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(v)
}

// stat is column of HAProxy's "show stat" for the server at backend.
func (p *Proxy) stat(backend, column string) (string, error) {
	i := slices.Index(p.backends, backend)
	if i < 0 {
		return "", fmt.Errorf("haproxytest: %s is not a backend", backend)
	}
	name := fmt.Sprintf("replica%d", i+1)
	c, err := net.DialTimeout("unix", p.sock, 5*time.Second)
	if err != nil {
		return "", fmt.Errorf("haproxytest: stats socket: %w", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "show stat\n"); err != nil {
		return "", fmt.Errorf("haproxytest: show stat: %w", err)
	}
	r := csv.NewReader(c)
	r.FieldsPerRecord = -1
	rows, err := r.ReadAll()
	if err != nil {
		return "", fmt.Errorf("haproxytest: show stat: %w", err)
	}
	if len(rows) == 0 {
		return "", errors.New("haproxytest: show stat answered nothing")
	}
	col := slices.Index(rows[0], column)
	if col < 0 {
		return "", fmt.Errorf("haproxytest: show stat has no %s column: %q", column, rows[0])
	}
	for _, row := range rows[1:] {
		if len(row) > col && row[0] == "replicas" && row[1] == name {
			return row[col], nil
		}
	}
	return "", fmt.Errorf("haproxytest: show stat does not list %s", name)
}

func (p *Proxy) stop() {
	p.once.Do(func() {
		p.cmd.Process.Kill()
		p.cmd.Wait()
	})
}
