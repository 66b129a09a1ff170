package integration

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/tunnel"
)

// idleHolders is an attacker that tries to keep n TCP connections open to
// addr, spread over the source addresses in from, without ever sending a
// byte. A connection the console closes is opened again 2–3 s later, so
// the pressure never lets up: against a console that keeps 4,096 of them,
// about 2,400 new connections a second, five times the rate that locked
// the console out in the field.
type idleHolders struct {
	dials  atomic.Int64 // connections established, in all
	open   atomic.Int64 // connections open now, as this side sees them
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func holdIdle(addr string, from []net.IP, n int) *idleHolders {
	ctx, cancel := context.WithCancel(context.Background())
	h := &idleHolders{cancel: cancel}
	for i := range n {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: from[i%len(from)]}, Timeout: 5 * time.Second}
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			buf := make([]byte, 1)
			for ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", addr)
				if err == nil {
					h.dials.Add(1)
					h.open.Add(1)
					stop := context.AfterFunc(ctx, func() { c.Close() })
					c.Read(buf) // until the console closes it
					stop()
					c.Close()
					h.open.Add(-1)
				}
				select {
				case <-ctx.Done():
				case <-time.After(2*time.Second + rand.N(time.Second)):
				}
			}
		}()
	}
	return h
}

func (h *idleHolders) stop() { h.cancel(); h.wg.Wait() }

// The attacker runs in a process of its own, as it would: this test
// binary again, running TestIdleHolderProcess with these set.
const (
	holderAddrEnv = "EDGEBOX_TEST_IDLE_ADDR"
	holderNEnv    = "EDGEBOX_TEST_IDLE_N"
)

// TestIdleHolderProcess is not a test: it is the attacker's process for
// TestIdleConnectionsDoNotLockOut, and does nothing unless started by it.
// It holds the connections until its standard input closes, printing
// "dials N open M" once a second.
func TestIdleHolderProcess(t *testing.T) {
	addr := os.Getenv(holderAddrEnv)
	if addr == "" {
		return
	}
	n, _ := strconv.Atoi(os.Getenv(holderNEnv))
	var from []net.IP
	for i := 1; i <= 20; i++ {
		from = append(from, net.IPv4(127, 0, 0, byte(i)))
	}
	h := holdIdle(addr, from, n)
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(done) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-done:
			h.stop()
			os.Exit(0)
		case <-tick.C:
			fmt.Printf("dials %d open %d\n", h.dials.Load(), h.open.Load())
		}
	}
}

// attacker is the holder process seen from the test.
type attacker struct {
	cmd   *exec.Cmd
	stdin io.Closer
	dials atomic.Int64
	open  atomic.Int64
	done  chan struct{}
}

func startAttacker(t *testing.T, addr string, n int) *attacker {
	cmd := exec.Command(os.Args[0], "-test.run=^TestIdleHolderProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), holderAddrEnv+"="+addr, holderNEnv+"="+strconv.Itoa(n))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a := &attacker{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var d, o int64
			if _, err := fmt.Sscanf(sc.Text(), "dials %d open %d", &d, &o); err == nil {
				a.dials.Store(d)
				a.open.Store(o)
			}
		}
	}()
	t.Cleanup(a.stop)
	return a
}

func (a *attacker) stop() {
	a.stdin.Close()
	<-a.done
	a.cmd.Wait()
}

// TestIdleConnectionsDoNotLockOut holds 10,000 idle connections from 20
// source addresses, from a process of its own, (the boxes' and operators' own 127.0.0.1 among them)
// while 50 boxes restart with the agent's real backoff and an operator
// calls the API on fresh connections, as the CLI does: every box must be
// back within 10 s and the API's p99 must stay within 1 s.
func TestIdleConnectionsDoNotLockOut(t *testing.T) {
	// Not parallel: 10,000 connections are a fifth of this process's
	// open-file budget on each side.
	const (
		boxes = 50
		idle  = 10_000
	)
	h := testenv.NewInProcess(t, testenv.Options{})
	tok := h.Token(t, api.TokenRequest{Region: "east", Site: "a", Uses: boxes})
	realBackoff := func(c *agent.Config) { c.Backoff = tunnel.Backoff{Min: time.Second, Max: time.Minute} }
	var fleet []testenv.Box
	for i := range boxes {
		b, err := h.Enroll(t, tok, fmt.Sprintf("box-%02d", i))
		if err != nil {
			t.Fatal(err)
		}
		testenv.StartAgent(t, b, realBackoff)
		fleet = append(fleet, b)
	}
	allOnline := func(want bool) func() bool {
		return func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			bs, err := h.Admin().Boxes(ctx)
			if err != nil {
				return false
			}
			n := 0
			for _, b := range bs {
				if b.Online == want {
					n++
				}
			}
			return n == boxes
		}
	}
	testenv.WaitFor(t, time.Minute, "the fleet online before the attack", allOnline(true))

	addr := strings.TrimPrefix(h.URL(), "https://")
	attack := startAttacker(t, addr, idle)
	testenv.WaitFor(t, time.Minute, "every idle holder to connect once", func() bool { return attack.dials.Load() >= idle })
	t.Logf("attack running: %d connections made, %d open as the attacker sees them", attack.dials.Load(), attack.open.Load())

	// The operator: fresh connections for every call, as separate CLI
	// runs make them.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(h.CAPEM())
	op := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13},
		DisableKeepAlives: true, ForceAttemptHTTP2: true,
	}}
	call := func(path string) (string, error) {
		req, _ := http.NewRequest(http.MethodGet, h.URL()+path, nil)
		req.Header.Set("Authorization", "Bearer "+h.AdminToken())
		resp, err := op.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s: %s", resp.Status, body)
		}
		return string(body), err
	}
	var (
		mu       sync.Mutex
		lat      []time.Duration
		failures []error
	)
	probeCtx, stopProbe := context.WithCancel(context.Background())
	var probes sync.WaitGroup
	t.Cleanup(func() { stopProbe(); probes.Wait() })
	for w := range 4 {
		probes.Add(1)
		go func() {
			defer probes.Done()
			for probeCtx.Err() == nil {
				t0 := time.Now()
				_, err := call("/api/v1/boxes/" + fleet[w].ID())
				d := time.Since(t0)
				mu.Lock()
				if err != nil {
					failures = append(failures, err)
					d = time.Hour // a failed call is the worst latency
				}
				lat = append(lat, d)
				mu.Unlock()
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}

	// Every box restarts: its session ends, and it dials again.
	for _, b := range fleet {
		b.Stop(t)
	}
	testenv.WaitFor(t, 30*time.Second, "the fleet offline", allOnline(false))
	start := time.Now()
	for _, b := range fleet {
		testenv.StartAgent(t, b, realBackoff)
	}
	testenv.WaitFor(t, 10*time.Second-time.Since(start), "all 50 boxes back online within 10 s under the attack", allOnline(true))
	t.Logf("all %d boxes back online in %v", boxes, time.Since(start).Round(time.Millisecond))
	// Keep calling for a while after the boxes are back.
	for time.Since(start) < 10*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	stopProbe()
	probes.Wait()

	mu.Lock()
	defer mu.Unlock()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) < 20 {
		t.Fatalf("only %d API calls were made in 10 s", len(lat))
	}
	p99 := lat[len(lat)*99/100]
	t.Logf("API over fresh connections during the attack: %d calls, %d failed, p50 %v p99 %v",
		len(lat), len(failures), lat[len(lat)/2].Round(time.Millisecond), p99.Round(time.Millisecond))
	if p99 > time.Second {
		t.Errorf("API p99 %v during the attack, want ≤ 1 s; failures: %v", p99, failures[:min(len(failures), 5)])
	}

	// The console said what it shed.
	metrics, err := call("/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if shed := sumMetric(metrics, "edgebox_port_shed_total"); shed < 1000 {
		t.Errorf("edgebox_port_shed_total = %v during an attack of %d idle connections, want it counting them", shed, idle)
	}
}

// sumMetric adds up every sample of a metric in Prometheus text format.
func sumMetric(text, name string) float64 {
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		var v float64
		if i := strings.LastIndexByte(rest, ' '); i >= 0 {
			fmt.Sscan(rest[i+1:], &v)
		}
		sum += v
	}
	return sum
}
