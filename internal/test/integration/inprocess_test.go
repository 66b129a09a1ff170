package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/tunnel"
)

// These scenarios need to reach inside the console or move its clock, so
// they run in process only.

func TestExpiredTokenRefused(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	now := time.Now()
	h := testenv.NewInProcess(t, testenv.Options{Console: func(c *console.Config) {
		c.Clock = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	}})
	tok := h.Token(t, api.TokenRequest{Region: "east", Site: "a", TTL: "1h"})
	mu.Lock()
	now = now.Add(61 * time.Minute)
	mu.Unlock()
	_, err := h.Enroll(t, tok, "late")
	wantErr(t, "expired token", err, "this enrollment token expired at")
}

func TestGRPCBothWaysThroughRealParts(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "a"}), "rpc-box")
	if err != nil {
		t.Fatal(err)
	}
	box.Start(t)
	// Box → console: Hello reported the facts (checked by the API).
	testenv.WaitFor(t, 10*time.Second, "hello", func() bool { return testenv.BoxState(t, h, box.ID()).AgentVersion == "test" })
	// Console → box: Ping through the agent's gRPC server.
	resp, err := h.Console().PingAgent(ctx(t), box.ID(), []byte("are you there"))
	if err != nil {
		t.Fatalf("console→box ping: %v", err)
	}
	if string(resp.Payload) != "are you there" || resp.AgentTimeUnixNano == 0 {
		t.Fatalf("ping answer %+v", resp)
	}
}

func TestCertificateRenewedOverTheTunnel(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{Console: func(c *console.Config) { c.BoxCertTTL = 6 * time.Second }})
	box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "a"}), "renewer")
	if err != nil {
		t.Fatal(err)
	}
	box.Start(t)
	a := testenv.AgentOf(box)
	first := a.Status().CertNotAfter
	testenv.WaitFor(t, 15*time.Second, "renewal", func() bool { return a.Status().CertNotAfter.After(first) })
	renewedAt := time.Now()
	if lead := first.Sub(renewedAt); lead < time.Second {
		t.Errorf("renewed only %v before expiry; want about a third of the lifetime", lead)
	}
	// The old certificate expires; the box must still get in with the new one.
	time.Sleep(time.Until(first) + 500*time.Millisecond)
	h.Console().Tunnel().Drop(box.ID())
	testenv.WaitFor(t, 10*time.Second, "reconnect with the renewed certificate", func() bool {
		_, ok := h.Console().Tunnel().Session(box.ID())
		return ok
	})
	entries, _ := h.Admin().Audit(ctx(t), 100, box.ID())
	renewals := 0
	for _, e := range entries {
		if e.Action == "box.renew" {
			renewals++
		}
	}
	if renewals == 0 {
		t.Fatal("no renewal in the audit log")
	}
}

func TestBoxCertificateFromAnotherCARefused(t *testing.T) {
	t.Parallel()
	a := testenv.NewInProcess(t, testenv.Options{})
	b := testenv.NewInProcess(t, testenv.Options{})
	box, err := a.Enroll(t, a.Token(t, api.TokenRequest{Region: "east", Site: "a"}), "stranger")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(box.DataDir()+"/cert.pem", box.DataDir()+"/key.pem")
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b.CAPEM())
	u, _ := url.Parse(b.URL())
	var logs strings.Builder
	c, err := tunnel.NewClient(tunnel.ClientConfig{Config: tunnel.DefaultConfig(), Addr: u.Host,
		TLS:     &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: "127.0.0.1"},
		Proxy:   func(*url.URL) (*url.URL, error) { return nil, nil },
		Backoff: tunnel.Backoff{Min: 50 * time.Millisecond, Max: 100 * time.Millisecond},
	}, slog.New(slog.NewTextHandler(&lockedWriter{w: &logs}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	_, err = c.Open(ctx, tunnel.KindRPC, nil)
	<-done
	if err == nil {
		t.Fatal("opened a stream to console B with console A's certificate")
	}
	if len(b.Console().Tunnel().Sessions()) != 0 {
		t.Fatal("console B accepted a box certificate signed by console A")
	}
	if !strings.Contains(logs.String(), "certificate") {
		t.Fatalf("the box was not told its certificate was refused; it logged:\n%s", logs.String())
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestPublicPortSurvivesGarbageAndSlowClients(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{Console: func(c *console.Config) { c.HandshakeTimeout = time.Second }})
	box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "a"}), "bystander")
	if err != nil {
		t.Fatal(err)
	}
	box.Start(t)
	testenv.WaitFor(t, 10*time.Second, "online", func() bool { return testenv.BoxState(t, h, box.ID()).Online })
	sess, _ := h.Console().Tunnel().Session(box.ID())
	addr := strings.TrimPrefix(h.URL(), "https://")

	var conns []net.Conn
	for i := range 60 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		switch i % 3 {
		case 0: // garbage
			c.Write(bytes.Repeat([]byte("GET / HTTP/1.1\r\n"), 64))
		case 1: // oversized: a megabyte of noise
			go c.Write(bytes.Repeat([]byte{0x16, 0x03, 0x01, 0xff, 0xff}, 200_000))
		case 2: // slowloris: one byte, then nothing
			c.Write([]byte{0x16})
		}
	}
	// Meanwhile operators and boxes are served.
	for range 5 {
		if _, err := h.Admin().Boxes(ctx(t)); err != nil {
			t.Fatalf("API during attack: %v", err)
		}
	}
	if _, err := h.Console().PingAgent(ctx(t), box.ID(), nil); err != nil {
		t.Fatalf("box during attack: %v", err)
	}
	// Every bad connection is closed within the handshake timeout.
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		_, err := io.Copy(io.Discard, c)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("bad connection %d (kind %d) still open after 3 s", i, i%3)
		}
		c.Close()
	}
	if cur, _ := h.Console().Tunnel().Session(box.ID()); cur != sess {
		t.Fatal("the good box's session was disturbed")
	}
	// A slow HTTP client that completes TLS but never finishes its headers.
	tc, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	tc.Write([]byte("GET /api/v1/boxes HTTP/1.1\r\nHost: x\r\n"))
	tc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, tc); err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("slow HTTP client kept its connection past the header timeout")
		}
	}
}

func TestHTTP2AndMetrics(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "a"}), "metered")
	if err != nil {
		t.Fatal(err)
	}
	box.Start(t)
	testenv.WaitFor(t, 10*time.Second, "online", func() bool { return testenv.BoxState(t, h, box.ID()).Online })
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(h.CAPEM())
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	req, _ := http.NewRequest(http.MethodGet, h.URL()+"/metrics", nil)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("metrics without a token: %s", resp.Status)
	}
	if resp.ProtoMajor != 2 {
		t.Fatalf("API spoke %s, want HTTP/2", resp.Proto)
	}
	// With the admin token. The box's session was admitted and, once its
	// Sync stream caught up, left admission's books.
	tok := h.AdminToken()
	req.Header.Set("Authorization", "Bearer "+tok)
	var body []byte
	testenv.WaitFor(t, 10*time.Second, "the box's session caught up", func() bool {
		resp, err = hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		return strings.Contains(string(body), `edgebox_admission_sessions_total{result="caught_up"} 1`)
	})
	for _, want := range []string{"edgebox_tunnel_sessions 1", `edgebox_tunnel_handshakes_total{result="ok"}`, "edgebox_tunnel_ping_rtt_seconds",
		`edgebox_admission_sessions_total{result="admitted"} 1`, "edgebox_admission_in_flight 0", "edgebox_admission_limit 256",
		`edgebox_boxes{region="east",state="online"} 1`, "edgebox_remote_sessions 0", `edgebox_api_request_seconds_count{code="4xx",method="GET",route="/metrics"} 1`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// The box told its vitals as it came online.
	testenv.WaitFor(t, 10*time.Second, "the box's vitals", func() bool {
		v := testenv.BoxState(t, h, box.ID()).Vitals
		return v != nil && v.MemoryTotalBytes > 0 && v.UptimeSeconds > 0 && v.DiskTotalBytes > 0
	})
	// What Prometheus reads, it parses.
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("the console's /metrics does not parse: %v", err)
	}
	if len(families) < 20 {
		t.Fatalf("the console's /metrics has %d families", len(families))
	}
	// Every metric the shipped Grafana dashboard graphs is one the
	// console serves.
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "grafana", "edgebox-console.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil || len(dash.Panels) == 0 {
		t.Fatalf("docs/grafana/edgebox-console.json: %d panels, %v", len(dash.Panels), err)
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			names := regexp.MustCompile(`edgebox_[a-z_]+`).FindAllString(tg.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q graphs no edgebox metric: %s", p.Title, tg.Expr)
			}
			for _, n := range names {
				base := n
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					base = strings.TrimSuffix(base, suffix)
				}
				if families[n] == nil && families[base] == nil {
					t.Errorf("panel %q graphs %s, which the console does not serve", p.Title, n)
				}
			}
		}
	}
}

// consoleMetrics returns the console's /metrics text.
func consoleMetrics(t *testing.T, h *testenv.InProcess) string {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(h.CAPEM())
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodGet, h.URL()+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+h.AdminToken())
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// TestBoxesResumeTLSAcrossARestart: the session ticket keys outlive the
// console, so a box redialling a restarted console resumes its TLS session
// (no certificate to verify, nothing to sign) instead of a full handshake.
func TestBoxesResumeTLSAcrossARestart(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "a"}), "resumer")
	if err != nil {
		t.Fatal(err)
	}
	box.Start(t)
	testenv.WaitFor(t, 10*time.Second, "online", func() bool { return testenv.BoxState(t, h, box.ID()).Online })
	if m := consoleMetrics(t, h); !strings.Contains(m, `edgebox_port_tls_handshakes_total{pool="box",resumed="no"} 1`) {
		t.Fatalf("the first session was not one full handshake:\n%s", grepLines(m, "tls_handshakes"))
	}
	h.RestartConsole(t)
	testenv.WaitFor(t, 30*time.Second, "online after the restart", func() bool { return testenv.BoxState(t, h, box.ID()).Online })
	if m := consoleMetrics(t, h); !strings.Contains(m, `edgebox_port_tls_handshakes_total{pool="box",resumed="yes"} 1`) ||
		strings.Contains(m, `edgebox_port_tls_handshakes_total{pool="box",resumed="no"}`) {
		t.Fatalf("the box did not resume its session after the restart:\n%s", grepLines(m, "tls_handshakes"))
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
