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
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
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

// helperProcess starts this test binary again, running only the test
// named, with env added; the helper stops when its standard input closes
// and reports on its standard output.
func helperProcess(t *testing.T, test string, env ...string) (*exec.Cmd, io.WriteCloser, io.ReadCloser) {
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
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
	return cmd, stdin, out
}

func startAttacker(t *testing.T, addr string, n int) *attacker {
	cmd, stdin, out := helperProcess(t, "TestIdleHolderProcess", holderAddrEnv+"="+addr, holderNEnv+"="+strconv.Itoa(n))
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

// The operator's process: this test binary again, running
// TestOperatorProcess with these set.
const (
	operatorURLEnv   = "EDGEBOX_TEST_OPERATOR_URL"
	operatorTokenEnv = "EDGEBOX_TEST_OPERATOR_TOKEN"
	operatorCAEnv    = "EDGEBOX_TEST_OPERATOR_CA"
	operatorPathsEnv = "EDGEBOX_TEST_OPERATOR_PATHS"
)

// TestOperatorProcess is not a test: it is the operator's process for
// TestIdleConnectionsDoNotLockOut, and does nothing unless started by it.
// One worker a path calls the API on a fresh connection every 50 ms until
// its standard input closes, printing a line a call:
// "call BEGUN_UNIX_NANO TOOK_NANOS PHASES|ERROR".
func TestOperatorProcess(t *testing.T) {
	url := os.Getenv(operatorURLEnv)
	if url == "" {
		return
	}
	ca, err := os.ReadFile(os.Getenv(operatorCAEnv))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	var out sync.Mutex
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(done) }()
	var wg sync.WaitGroup
	for _, path := range strings.Split(os.Getenv(operatorPathsEnv), ",") {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				t0 := time.Now()
				var phases string
				_, err := operatorCall(url, os.Getenv(operatorTokenEnv), ca, path, &phases)
				took := time.Since(t0)
				out.Lock()
				if err != nil {
					fmt.Printf("call %d %d |%s\n", t0.UnixNano(), took, strings.ReplaceAll(err.Error(), "\n", " "))
				} else {
					fmt.Printf("call %d %d %s|\n", t0.UnixNano(), took, phases)
				}
				out.Unlock()
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	os.Exit(0)
}

// operatorCall GETs path with token on a fresh connection; phases, when
// given, says when the TCP connect, the TLS handshake and the answer's
// first byte were done.
func operatorCall(base, token string, ca []byte, path string, phases *string) (string, error) {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	op := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13},
		DisableKeepAlives: true, ForceAttemptHTTP2: true,
	}}
	defer op.CloseIdleConnections()
	t0 := time.Now()
	var mu sync.Mutex
	var conn, hs, first time.Duration
	at := func(d *time.Duration) { mu.Lock(); *d = time.Since(t0); mu.Unlock() }
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		ConnectDone:          func(string, string, error) { at(&conn) },
		TLSHandshakeDone:     func(tls.ConnectionState, error) { at(&hs) },
		GotFirstResponseByte: func() { at(&first) },
	})
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := op.Do(req)
	if phases != nil {
		mu.Lock()
		*phases = fmt.Sprintf("connected %v, TLS done %v, first byte %v", conn.Round(time.Millisecond), hs.Round(time.Millisecond), first.Round(time.Millisecond))
		mu.Unlock()
	}
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

// operatorCallSeen is one call of the operator's process.
type operatorCallSeen struct {
	begun       time.Time
	took        time.Duration
	phases, err string
}

// operator is the operator's process seen from the test.
type operator struct {
	cmd   *exec.Cmd
	stdin io.Closer
	mu    sync.Mutex
	calls []operatorCallSeen
	done  chan struct{}
}

func startOperator(t *testing.T, url, token, caFile string, paths []string) *operator {
	cmd, stdin, out := helperProcess(t, "TestOperatorProcess", operatorURLEnv+"="+url, operatorTokenEnv+"="+token,
		operatorCAEnv+"="+caFile, operatorPathsEnv+"="+strings.Join(paths, ","))
	o := &operator{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			rest, ok := strings.CutPrefix(sc.Text(), "call ")
			if !ok {
				continue
			}
			var begun, took int64
			if _, err := fmt.Sscanf(rest, "%d %d", &begun, &took); err != nil {
				continue
			}
			c := operatorCallSeen{begun: time.Unix(0, begun), took: time.Duration(took)}
			if i := strings.IndexByte(rest, '|'); i >= 0 {
				f := strings.SplitN(rest, " ", 3)
				if len(f) == 3 {
					c.phases, _, _ = strings.Cut(f[2], "|")
				}
				c.err = rest[i+1:]
				if c.err != "" {
					c.took = time.Hour // a failed call is the worst latency
				}
			}
			o.mu.Lock()
			o.calls = append(o.calls, c)
			o.mu.Unlock()
		}
	}()
	t.Cleanup(func() { o.stop() })
	return o
}

// stop ends the operator's process and returns its calls.
func (o *operator) stop() []operatorCallSeen {
	o.stdin.Close()
	<-o.done
	o.cmd.Wait()
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.calls
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
	// The console is its binary, in a process of its own as it is in a
	// data centre; the boxes' agents run in this process.
	h := testenv.NewBinaries(t)
	tok := h.Token(t, api.TokenRequest{Region: "east", Site: "a", Uses: boxes})
	realBackoff := func(c *agent.Config) { c.Backoff = tunnel.Backoff{Min: time.Second, Max: time.Minute} }
	var fleet []testenv.Box
	for i := range boxes {
		b, err := testenv.EnrollInProcess(t, tok, fmt.Sprintf("box-%02d", i))
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

	// The operator, in a process of its own as the CLI is: fresh
	// connections for every call, as separate CLI runs make them. In
	// this process its calls would wait for the CPU behind the fifty
	// agents, which on a real fleet run elsewhere.
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, h.CAPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	var paths []string
	for w := range 4 {
		paths = append(paths, "/api/v1/boxes/"+fleet[w].ID())
	}
	operator := startOperator(t, h.URL(), h.AdminToken(), caFile, paths)

	// Every box restarts: its session ends, and it dials again.
	for _, b := range fleet {
		b.Stop(t)
	}
	testenv.WaitFor(t, 30*time.Second, "the fleet offline", allOnline(false))
	start := time.Now()
	t.Logf("the boxes start again at %s", start.Format("15:04:05.000"))
	for _, b := range fleet {
		testenv.StartAgent(t, b, realBackoff)
	}
	testenv.WaitFor(t, 10*time.Second-time.Since(start), "all 50 boxes back online within 10 s under the attack", allOnline(true))
	t.Logf("all %d boxes back online in %v", boxes, time.Since(start).Round(time.Millisecond))
	// Keep calling for a while after the boxes are back.
	for time.Since(start) < 10*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	calls := operator.stop()
	sort.Slice(calls, func(i, j int) bool { return calls[i].took < calls[j].took })
	if len(calls) < 20 {
		t.Fatalf("only %d API calls were made in 10 s", len(calls))
	}
	var failures []string
	for _, c := range calls {
		if c.err != "" {
			failures = append(failures, c.err)
		}
	}
	p99 := calls[len(calls)*99/100].took
	t.Logf("API over fresh connections during the attack: %d calls, %d failed, p50 %v p99 %v",
		len(calls), len(failures), calls[len(calls)/2].took.Round(time.Millisecond), p99.Round(time.Millisecond))
	for _, c := range calls[max(0, len(calls)-3):] {
		t.Logf("a slowest call: %v, begun %s: %s%s", c.took.Round(time.Millisecond), c.begun.Format("15:04:05.000"), c.phases, c.err)
	}
	if p99 > time.Second {
		t.Errorf("API p99 %v during the attack, want ≤ 1 s; failures: %v", p99, failures[:min(len(failures), 5)])
	}

	// The console said what it shed.
	metrics, err := operatorCall(h.URL(), h.AdminToken(), h.CAPEM(), "/metrics", nil)
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
