// Package haproxytest runs Debian's HAProxy in TCP mode in front of
// console replicas, as docs/ha.md deploys it: TLS passes through to the
// replicas untouched, so a box's certificate reaches the console it
// lands on.
package haproxytest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Proxy is a running HAProxy.
type Proxy struct {
	// Addr is where it listens, HOST:PORT.
	Addr string
	cmd  *exec.Cmd
	out  *bytes.Buffer
	once sync.Once
}

// Config is the configuration Start writes: the one in docs/ha.md, on
// addr and with the test's backends.
func Config(addr string, backends []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global
	maxconn 4000

defaults
	mode tcp
	timeout connect 3s
	timeout client 1h
	timeout server 1h
	timeout tunnel 1h

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
	cfg := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(Config(addr, backends)), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-c", "-f", cfg).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
	p := &Proxy{Addr: addr, out: &bytes.Buffer{}}
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

func (p *Proxy) stop() {
	p.once.Do(func() {
		p.cmd.Process.Kill()
		p.cmd.Wait()
	})
}
