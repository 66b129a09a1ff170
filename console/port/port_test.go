package port

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	boxgate "github.com/edgebox/edgebox/console/admission"
	"github.com/edgebox/edgebox/console/pki"
	"github.com/edgebox/edgebox/tunnel"
)

// testPort is a public port on loopback with a real CA, a tunnel server
// behind it and an HTTP handler that answers "ok".
type testPort struct {
	addr string
	port *Port
	reg  *prometheus.Registry
	ca   *pki.Authority
	logs *syncBuffer
	gate *boxgate.Controller
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
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

func startTestPort(t *testing.T, adjust func(*Config)) *testPort {
	t.Helper()
	return startGatedPort(t, adjust, boxgate.DefaultConfig())
}

// startGatedPort starts a port whose box sessions the admission
// controller of acfg lets in, before their handshake and at the tunnel.
func startGatedPort(t *testing.T, adjust func(*Config), acfg boxgate.Config) *testPort {
	t.Helper()
	cfg := DefaultConfig()
	if adjust != nil {
		adjust(&cfg)
	}
	ca, _, err := pki.Open(t.TempDir(), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(logs, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelInfo}))
	reg := prometheus.NewRegistry()
	gate, err := boxgate.New(acfg, reg, log)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := tunnel.NewServer(tunnel.ServerConfig{Config: tunnel.DefaultConfig(), Identify: func(cs tls.ConnectionState) (string, error) {
		return pki.BoxID(cs.PeerCertificates[0])
	}, Admit: gate.Admit}, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(ln, ca, srv, gate, cfg, reg, log)
	if err != nil {
		t.Fatal(err)
	}
	p.logEvery = 100 * time.Millisecond
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := p.Run(ctx); err != nil {
			t.Errorf("port: %v", err)
		}
	}()
	go func() { defer wg.Done(); hs.Serve(p.HTTP()) }()
	t.Cleanup(func() {
		cancel()
		hs.Close()
		srv.Close()
		wg.Wait()
	})
	return &testPort{addr: ln.Addr().String(), port: p, reg: reg, ca: ca, logs: logs, gate: gate}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// dialFrom opens a TCP connection to addr from the loopback address ip.
func dialFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// clientHello is the first TLS record of a real client offering alpn.
func clientHello(t *testing.T, alpn string) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go tls.Client(a, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{alpn}, MinVersion: tls.VersionTLS13}).Handshake()
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(b, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

// stallAfterHello sends a ClientHello offering alpn from ip and then
// nothing: the handshake holds its slot until HandshakeTimeout.
func (tp *testPort) stallAfterHello(t *testing.T, ip, alpn string) net.Conn {
	t.Helper()
	c := dialFrom(t, ip, tp.addr)
	if _, err := c.Write(clientHello(t, alpn)); err != nil {
		t.Fatal(err)
	}
	return c
}

// get makes one API call on a fresh connection from ip.
func (tp *testPort) get(ip string) error {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: d.DialContext, DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: tp.ca.Pool(), ServerName: "127.0.0.1"},
	}}
	resp, err := hc.Get("https://" + tp.addr + "/")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if string(body) != "ok" {
		return fmt.Errorf("answer %q", body)
	}
	return nil
}

// box opens a tunnel session from ip with a certificate the CA signed,
// and reports whether the console greeted it.
func (tp *testPort) box(t *testing.T, ip string) error {
	t.Helper()
	return tp.boxAs(t, ip, "bx-porttest")
}

// boxAs is box with the box's ID.
func (tp *testPort) boxAs(t *testing.T, ip, id string) error {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "box"}}, key)
	csr, _ := x509.ParseCertificateRequest(der)
	pemCert, _, err := tp.ca.SignBox(csr, id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(pemCert, pemKey(t, key))
	if err != nil {
		t.Fatal(err)
	}
	raw := dialFrom(t, ip, tp.addr)
	c := tls.Client(raw, &tls.Config{RootCAs: tp.ca.Pool(), ServerName: "127.0.0.1", NextProtos: []string{tunnel.ALPN},
		Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := c.Handshake(); err != nil {
		return err
	}
	// The console verifies the certificate after the client's last
	// flight; its greeting says it did.
	if _, err := c.Read(make([]byte, 1)); err != nil {
		return fmt.Errorf("no greeting: %w", err)
	}
	return nil
}

func pemKey(t *testing.T, key *ecdsa.PrivateKey) []byte {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

func (tp *testPort) waitCounts(t *testing.T, what string, ok func(admissionCounts) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok(tp.port.adm.counts()) {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: books %+v", what, tp.port.adm.counts())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// closedByConsole reports whether the console closed c within d.
func closedByConsole(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

func TestPortIdleConnectionsHoldNoHandshakeSlot(t *testing.T) {
	t.Parallel()
	tp := startTestPort(t, func(c *Config) {
		c.MaxHandshakes, c.MaxBoxHandshakes = 2, 2
		c.HelloTimeout = time.Minute
	})
	for range 50 {
		dialFrom(t, "127.0.0.2", tp.addr)
	}
	tp.waitCounts(t, "50 idle connections", func(c admissionCounts) bool { return c.idle == 50 })
	for i := range 5 {
		if err := tp.get("127.0.0.1"); err != nil {
			t.Fatalf("API call %d beside 50 idle connections: %v", i, err)
		}
	}
	if err := tp.box(t, "127.0.0.3"); err != nil {
		t.Fatalf("box beside 50 idle connections: %v", err)
	}
}

func TestPortHandshakePools(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		stallALPN  string // what the stalled clients offer, filling their pool
		wantReason string // what another such client is refused for
	}{
		{"anonymous clients cannot take boxes' slots", "h2", shedHandshakes},
		{"boxes cannot take operators' slots", tunnel.ALPN, shedBoxHandshakes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tp := startTestPort(t, func(c *Config) { c.MaxHandshakes, c.MaxBoxHandshakes = 3, 3 })
			for range 3 {
				tp.stallAfterHello(t, "127.0.0.2", tc.stallALPN)
			}
			tp.waitCounts(t, "a full pool", func(c admissionCounts) bool { return c.handshakes == 3 || c.boxHandshakes == 3 })
			refused := tp.stallAfterHello(t, "127.0.0.3", tc.stallALPN)
			if tc.stallALPN == tunnel.ALPN {
				// A box is told to come back, not failed.
				refused.SetReadDeadline(time.Now().Add(5 * time.Second))
				answer := make([]byte, len("\x00edgebox-busy")+4)
				if _, err := io.ReadFull(refused, answer); err != nil || !bytes.HasPrefix(answer, []byte("\x00edgebox-busy")) {
					t.Fatalf("a box past a full pool: answer %q (%v), want the busy answer", answer, err)
				}
			}
			if !closedByConsole(refused, 5*time.Second) {
				t.Fatal("a ClientHello past a full pool was not refused")
			}
			if got := shedMetric(t, tp.reg, tc.wantReason); got != 1 {
				t.Fatalf("shed %s = %v, want 1", tc.wantReason, got)
			}
			if err := tp.get("127.0.0.4"); (err != nil) != (tc.stallALPN == "h2") {
				t.Fatalf("API call with the %s pool full: %v", tc.stallALPN, err)
			}
			if err := tp.box(t, "127.0.0.5"); (err != nil) != (tc.stallALPN == tunnel.ALPN) {
				t.Fatalf("box with the %s pool full: %v", tc.stallALPN, err)
			}
		})
	}
}

func TestPortPerAddressLimits(t *testing.T) {
	t.Parallel()
	tp := startTestPort(t, func(c *Config) {
		c.MaxConnsPerAddr, c.MaxHandshakesPerAddr = 10, 2
		c.HelloTimeout = time.Minute
	})
	// 30 idle connections from one address: it keeps 10, the last it
	// accepted (several goroutines accept, so not always the last
	// dialled).
	var idle []net.Conn
	for range 30 {
		idle = append(idle, dialFrom(t, "127.0.0.2", tp.addr))
	}
	tp.waitCounts(t, "10 idle connections", func(c admissionCounts) bool { return c.idle == 10 })
	closed := make(chan bool, len(idle))
	for _, c := range idle {
		go func() { closed <- closedByConsole(c, 3*time.Second) }()
	}
	n := 0
	for range idle {
		if <-closed {
			n++
		}
	}
	if n != 20 {
		t.Fatalf("the console closed %d of 30 idle connections from one address, want 20", n)
	}
	if got := shedMetric(t, tp.reg, shedIdleAddr); got != 20 {
		t.Fatalf("shed %s = %v, want 20", shedIdleAddr, got)
	}
	// A box behind the same address still gets in: its connection
	// pushes out an idle one.
	if err := tp.box(t, "127.0.0.2"); err != nil {
		t.Fatalf("box from the crowded address: %v", err)
	}

	// Two handshakes in progress from one address; a third is refused,
	// another address's is not.
	tp.stallAfterHello(t, "127.0.0.6", "h2")
	tp.stallAfterHello(t, "127.0.0.6", tunnel.ALPN)
	tp.waitCounts(t, "two handshakes", func(c admissionCounts) bool { return c.handshakes+c.boxHandshakes == 2 })
	if !closedByConsole(tp.stallAfterHello(t, "127.0.0.6", "h2"), 5*time.Second) {
		t.Fatal("a third handshake from one address was not refused")
	}
	if got := shedMetric(t, tp.reg, shedAddrHandshakes); got != 1 {
		t.Fatalf("shed %s = %v, want 1", shedAddrHandshakes, got)
	}
	if err := tp.get("127.0.0.7"); err != nil {
		t.Fatalf("API call from another address: %v", err)
	}
}

func TestPortHelloTimeout(t *testing.T) {
	t.Parallel()
	tp := startTestPort(t, func(c *Config) {
		c.HelloTimeout = 300 * time.Millisecond
		c.HandshakeTimeout = 20 * time.Second
	})
	silent := dialFrom(t, "127.0.0.2", tp.addr)
	stalled := tp.stallAfterHello(t, "127.0.0.2", "h2")
	if !closedByConsole(silent, 10*time.Second) {
		t.Fatal("a connection that never spoke outlived HelloTimeout")
	}
	// The one whose ClientHello came in has the whole HandshakeTimeout.
	if closedByConsole(stalled, time.Second) {
		t.Fatal("a connection that sent its ClientHello was cut at HelloTimeout")
	}
	if got := shedMetric(t, tp.reg, shedHelloTimeout); got != 1 {
		t.Fatalf("shed %s = %v, want 1", shedHelloTimeout, got)
	}
}

func TestPortLogsSheddingWithRates(t *testing.T) {
	t.Parallel()
	tp := startTestPort(t, func(c *Config) { c.MaxConnsPerAddr = 1; c.HelloTimeout = time.Minute })
	start := time.Now()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 5 * time.Second}
	for range 200 {
		// A busy host may reset a connection the port sheds before the
		// connect returns: that is a shed one too.
		c, err := d.Dial("tcp", tp.addr)
		if errors.Is(err, syscall.ECONNRESET) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(tp.logs.String(), "idle_evicted_addr=") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(start)
	logs := tp.logs.String()
	lines := strings.Count(logs, `msg="public port shedding connections"`)
	if lines == 0 {
		t.Fatalf("199 connections shed and nothing logged:\n%s", logs)
	}
	// One line per interval, not one per connection.
	if max := int(elapsed/tp.port.logEvery) + 2; lines > max {
		t.Fatalf("%d shedding lines in %v, want at most %d", lines, elapsed, max)
	}
	for _, want := range []string{"level=WARN", "per_second=", "top=", "127.0.0.2="} {
		if !strings.Contains(logs, want) {
			t.Errorf("the shedding line lacks %q:\n%s", want, logs)
		}
	}
}

// TestAcceptRetryable: the port's accept loop survives what a busy host
// gives it and stops on a listener that is gone.
func TestAcceptRetryable(t *testing.T) {
	t.Parallel()
	op := func(err error) error {
		return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", err)}
	}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"out of file descriptors", op(syscall.EMFILE), true},
		{"system out of file descriptors", op(syscall.ENFILE), true},
		{"connection aborted", op(syscall.ECONNABORTED), true},
		{"no buffer space", op(syscall.ENOBUFS), true},
		{"timeout", op(os.ErrDeadlineExceeded), true},
		{"closed", op(net.ErrClosed), false},
		{"bad descriptor", op(syscall.EBADF), false},
		{"invalid", op(syscall.EINVAL), false},
		{"another error", errors.New("the listener broke"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := acceptRetryable(tt.err); got != tt.want {
				t.Errorf("acceptRetryable(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

// TestPortGateTurnsBoxesAwayBeforeTheHandshake fills the gate with one box
// session that has not caught up: the next box is told when to come back
// before any crypto, an operator still gets in, a box whose handshake
// fails gives its place back, and once the first box caught up the next
// one gets in.
func TestPortGateTurnsBoxesAwayBeforeTheHandshake(t *testing.T) {
	acfg := boxgate.DefaultConfig()
	acfg.Initial, acfg.Min, acfg.Max = 1, 1, 1
	acfg.QueueWait = 0 // no box waits for a place
	tp := startGatedPort(t, nil, acfg)
	if err := tp.box(t, "127.0.0.2"); err != nil {
		t.Fatalf("the first box: %v", err)
	}
	if s := tp.gate.State(); s.InFlight != 1 || s.Handshakes != 0 {
		t.Fatalf("after the first box: %+v", s)
	}

	c := tp.stallAfterHello(t, "127.0.0.3", tunnel.ALPN)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	answer := make([]byte, len("\x00edgebox-busy")+4)
	if _, err := io.ReadFull(c, answer); err != nil {
		t.Fatalf("no answer before TLS: %v", err)
	}
	if !bytes.HasPrefix(answer, []byte("\x00edgebox-busy")) || binary.BigEndian.Uint32(answer[len(answer)-4:]) == 0 {
		t.Fatalf("answer %q, want the busy answer with a wait", answer)
	}
	// Nothing after it: the alert of the handshake it failed is not sent.
	if rest, err := io.ReadAll(c); len(rest) != 0 || err != nil {
		t.Fatalf("after the busy answer: %q (%v), want the connection closed", rest, err)
	}
	if err := tp.get("127.0.0.3"); err != nil {
		t.Fatalf("an operator while boxes are turned away: %v", err)
	}

	tp.gate.CaughtUp("bx-porttest")
	// A handshake that starts and fails gives its place back.
	stalled := tp.stallAfterHello(t, "127.0.0.4", tunnel.ALPN)
	waitGate(t, tp.gate, "a place held for the stalled handshake", func(s boxgate.State) bool { return s.Handshakes == 1 })
	stalled.Close()
	waitGate(t, tp.gate, "the place given back", func(s boxgate.State) bool { return s.Handshakes == 0 })
	if err := tp.box(t, "127.0.0.5"); err != nil {
		t.Fatalf("a box once there was room: %v", err)
	}
}

// TestPortQueuesABoxUntilAPlaceFrees: with the gate full, a box's
// ClientHello waits for the next place instead of being turned away, past
// the handshake timeout, and the box gets in on its first dial once the
// session ahead of it caught up.
func TestPortQueuesABoxUntilAPlaceFrees(t *testing.T) {
	acfg := boxgate.DefaultConfig()
	acfg.Initial, acfg.Min, acfg.Max = 1, 1, 1
	const timeout = 500 * time.Millisecond
	tp := startGatedPort(t, func(c *Config) { c.HandshakeTimeout, c.HelloTimeout = timeout, timeout }, acfg)
	if err := tp.boxAs(t, "127.0.0.2", "bx-first"); err != nil {
		t.Fatalf("the first box: %v", err)
	}
	second := make(chan error, 1)
	go func() { second <- tp.boxAs(t, "127.0.0.3", "bx-second") }()
	waitGate(t, tp.gate, "the second box in the queue", func(s boxgate.State) bool { return s.Queued == 1 })
	if err := tp.get("127.0.0.3"); err != nil {
		t.Fatalf("an operator while a box waits: %v", err)
	}
	// A box in the queue keeps its connection past the handshake
	// timeout: it waits as long as boxes wait for their handshake.
	time.Sleep(2 * timeout)
	tp.gate.CaughtUp("bx-first")
	if err := <-second; err != nil {
		t.Fatalf("the queued box, once the first caught up: %v", err)
	}
	if s := tp.gate.State(); s.InFlight != 1 || s.Queued != 0 || s.Handshakes != 0 {
		t.Fatalf("after the queued box came in: %+v", s)
	}
}

func waitGate(t *testing.T, g *boxgate.Controller, what string, ok func(boxgate.State) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok(g.State()) {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %+v", what, g.State())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPortBoxHandshakesComputeAFewAtATime holds every CPU slot: a box's
// handshake waits at its ClientHello, is not refused, and goes on once a
// slot is free, giving it back after its flight; a box that waits past
// cpuWait is told to come back soon instead, and its place goes back.
func TestPortBoxHandshakesComputeAFewAtATime(t *testing.T) {
	tp := startTestPort(t, nil)
	slots := cap(tp.port.cpu)
	for range slots {
		tp.port.cpu <- struct{}{}
	}
	done := make(chan error, 1)
	go func() { done <- tp.box(t, "127.0.0.2") }()
	select {
	case err := <-done:
		t.Fatalf("a box handshake went on with every slot held: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	<-tp.port.cpu
	if err := <-done; err != nil {
		t.Fatalf("the box once a slot was free: %v", err)
	}
	if n := len(tp.port.cpu); n != slots-1 {
		t.Fatalf("%d slots held after the handshake, want the %d the test holds", n, slots-1)
	}

	// No failed handshake for a box kept waiting: it would lose its
	// session ticket, and its next handshake would be a full one.
	tp.port.cpu <- struct{}{}
	c := tp.stallAfterHello(t, "127.0.0.3", tunnel.ALPN)
	c.SetReadDeadline(time.Now().Add(cpuWait + 5*time.Second))
	answer := make([]byte, len("\x00edgebox-busy")+4)
	if _, err := io.ReadFull(c, answer); err != nil {
		t.Fatalf("no answer before TLS to a box kept waiting: %v", err)
	}
	wait := time.Duration(binary.BigEndian.Uint32(answer[len(answer)-4:])) * time.Millisecond
	if !bytes.HasPrefix(answer, []byte("\x00edgebox-busy")) || wait < cpuWait/2 || wait > 3*cpuWait/2 {
		t.Fatalf("answer %q (come back in %v), want the busy answer with a short wait", answer, wait)
	}
	waitGate(t, tp.gate, "the place given back", func(s boxgate.State) bool { return s.Handshakes == 0 })
}
