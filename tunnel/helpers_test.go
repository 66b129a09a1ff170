package tunnel

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testPKI is a CA with a console certificate for 127.0.0.1 and a way to
// make box certificates whose CommonName is the box ID.
type testPKI struct {
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	pool   *x509.CertPool
	server tls.Certificate
}

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &testPKI{ca: ca, caKey: key, pool: x509.NewCertPool()}
	p.pool.AddCert(ca)
	p.server = p.leaf(t, "console", x509.ExtKeyUsageServerAuth)
	return p
}

func (p *testPKI) leaf(t testing.TB, cn string, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	c, err := p.makeLeaf(cn, usage)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (p *testPKI) makeLeaf(cn string, usage x509.ExtKeyUsage) (tls.Certificate, error) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature,
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// testServer is a tunnel Server behind a real TLS listener on loopback.
type testServer struct {
	*Server
	ln      net.Listener
	addr    string
	revoked sync.Map
	// admit, when set, is the server's admission (ServerConfig.Admit).
	admit atomic.Pointer[func(string) time.Duration]
	// events records every session event, when set.
	events atomic.Pointer[chan SessionEvent]
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) { w.t.Log(string(b)); return len(b), nil }

func startTestServer(t testing.TB, p *testPKI, cfg Config, addr string) *testServer {
	t.Helper()
	ts := &testServer{}
	srv, err := NewServer(ServerConfig{Config: cfg, Identify: func(cs tls.ConnectionState) (string, error) {
		if len(cs.PeerCertificates) == 0 {
			return "", errors.New("no client certificate")
		}
		id := cs.PeerCertificates[0].Subject.CommonName
		if _, bad := ts.revoked.Load(id); bad {
			return "", errors.New("box " + id + " is revoked")
		}
		return id, nil
	}, OnSession: func(ev SessionEvent) {
		if ch := ts.events.Load(); ch != nil {
			select { // OnSession must not block
			case *ch <- ev:
			default:
			}
		}
	}, Admit: func(_ context.Context, id string) time.Duration {
		if f := ts.admit.Load(); f != nil {
			return (*f)(id)
		}
		return 0
	}}, testLogger(t), NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	ts.Server = srv
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ts.ln = ln
	ts.addr = ln.Addr().String()
	tcfg := &tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{p.server},
		ClientCAs: p.pool, ClientAuth: tls.RequireAndVerifyClientCert, NextProtos: []string{ALPN},
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts.cancel = cancel
	ts.wg.Add(1)
	go func() {
		defer ts.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ts.wg.Add(1)
			go func() {
				defer ts.wg.Done()
				tc := tls.Server(CorkConn(c), tcfg)
				hctx, hc := context.WithTimeout(ctx, 5*time.Second)
				defer hc()
				if err := tc.HandshakeContext(hctx); err != nil {
					c.Close()
					return
				}
				srv.ServeConn(ctx, tc)
			}()
		}
	}()
	t.Cleanup(ts.stop)
	return ts
}

func (ts *testServer) stop() {
	ts.ln.Close()
	ts.cancel()
	ts.Server.Close()
	ts.wg.Wait()
}

// startTestClient runs a Client for box id until the test ends; each of
// before is called on it before it runs (to set OnSession, which Run reads).
func startTestClient(t testing.TB, p *testPKI, id, addr string, mod func(*ClientConfig), before ...func(*Client)) *Client {
	t.Helper()
	cert := p.leaf(t, id, x509.ExtKeyUsageClientAuth)
	cfg := ClientConfig{
		Config: DefaultConfig(), Addr: addr,
		TLS:     &tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{cert}},
		Proxy:   func(*url.URL) (*url.URL, error) { return nil, nil },
		Backoff: Backoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond},
	}
	if mod != nil {
		mod(&cfg)
	}
	c, err := NewClient(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range before {
		f(c)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const time1s = time.Second

func durationSeconds(n int) time.Duration { return time.Duration(n) * time.Second }
