package tunnel

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"

	"github.com/edgebox/edgebox/internal/test/toxic"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// echo serves l by echoing every stream back, prefixed with the peer name.
func echo(t testing.TB, l net.Listener) {
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintf(c, "%s:", c.RemoteAddr().(Addr).Peer)
				io.Copy(c, c)
			}()
		}
	}()
}

func roundTrip(t testing.TB, c net.Conn, msg string) string {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	c.(interface{ CloseWrite() error }).CloseWrite()
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return string(b)
}

func TestStreamsOfEveryKindBothWays(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	cli := startTestClient(t, p, "box-1", srv.addr, nil)
	kinds := []Kind{KindRPC, KindRegistry, KindForward, KindUSBIP, KindVNC}
	for _, k := range kinds {
		echo(t, srv.Listen(k))
		echo(t, cli.Listen(k))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	waitFor(t, 5*time.Second, "session", func() bool { _, ok := srv.Session("box-1"); return ok })
	for _, k := range kinds {
		up, err := cli.Open(ctx, k, map[string]string{"target": "127.0.0.1:22"})
		if err != nil {
			t.Fatalf("box opens %s: %v", k, err)
		}
		if got := roundTrip(t, up, "up-"+string(k)); got != "box-1:up-"+string(k) {
			t.Errorf("box→console %s: got %q", k, got)
		}
		down, err := srv.Open(ctx, "box-1", k, nil)
		if err != nil {
			t.Fatalf("console opens %s: %v", k, err)
		}
		if got := roundTrip(t, down, "down-"+string(k)); got != "console:down-"+string(k) {
			t.Errorf("console→box %s: got %q", k, got)
		}
	}
}

func TestOpenRefusedWithoutListener(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	cli := startTestClient(t, p, "box-1", srv.addr, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := cli.Open(ctx, KindVNC, nil)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), `no service for stream kind "vnc"`) {
		t.Fatalf("got %v, want a refusal naming the kind", err)
	}
	if _, err := srv.Open(ctx, "box-2", KindRPC, nil); !errors.Is(err, ErrOffline) {
		t.Fatalf("open to unknown box: got %v, want ErrOffline", err)
	}
}

type agentSvc struct {
	edgeboxv1.UnimplementedAgentServiceServer
}

func (agentSvc) Ping(ctx context.Context, r *edgeboxv1.PingRequest) (*edgeboxv1.PingResponse, error) {
	return &edgeboxv1.PingResponse{Payload: r.Payload}, nil
}

type consoleSvc struct {
	edgeboxv1.UnimplementedConsoleServiceServer
}

func (consoleSvc) Hello(ctx context.Context, r *edgeboxv1.HelloRequest) (*edgeboxv1.HelloResponse, error) {
	p, _ := peer.FromContext(ctx)
	return &edgeboxv1.HelloResponse{BoxId: p.Addr.(Addr).Peer, Name: r.Info.Hostname}, nil
}

func TestGRPCBothDirections(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	cli := startTestClient(t, p, "box-7", srv.addr, nil)

	cs := grpc.NewServer()
	edgeboxv1.RegisterConsoleServiceServer(cs, consoleSvc{})
	go cs.Serve(srv.Listen(KindRPC))
	defer cs.Stop()
	as := grpc.NewServer()
	edgeboxv1.RegisterAgentServiceServer(as, agentSvc{})
	go as.Serve(cli.Listen(KindRPC))
	defer as.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	up, err := grpc.NewClient("passthrough:///console",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return cli.Open(ctx, KindRPC, nil) }))
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	hr, err := edgeboxv1.NewConsoleServiceClient(up).Hello(ctx, &edgeboxv1.HelloRequest{Info: &edgeboxv1.BoxInfo{Hostname: "h"}})
	if err != nil {
		t.Fatalf("box→console Hello: %v", err)
	}
	if hr.BoxId != "box-7" {
		t.Errorf("console saw box %q, want the certificate's box-7", hr.BoxId)
	}

	down, err := grpc.NewClient("passthrough:///box-7",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return srv.Open(ctx, "box-7", KindRPC, nil) }))
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	pr, err := edgeboxv1.NewAgentServiceClient(down).Ping(ctx, &edgeboxv1.PingRequest{Payload: []byte("hi")})
	if err != nil {
		t.Fatalf("console→box Ping: %v", err)
	}
	if string(pr.Payload) != "hi" {
		t.Errorf("payload %q", pr.Payload)
	}
}

func TestThousandSimultaneousStreams(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	cli := startTestClient(t, p, "box-1", srv.addr, nil)
	l := srv.Listen(KindForward)
	echo(t, l)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 1000
	conns := make([]net.Conn, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := cli.Open(ctx, KindForward, nil)
			if err != nil {
				errs <- err
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("open: %v", err)
	}
	sess, _ := srv.Session("box-1")
	if got := sess.NumStreams(); got != n {
		t.Errorf("console sees %d streams, want %d open at once", got, n)
	}
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := fmt.Sprintf("stream-%d", i)
			if got := roundTrip(t, c, msg); got != "box-1:"+msg {
				t.Errorf("stream %d: got %q", i, got)
			}
		}()
	}
	wg.Wait()
}

func TestAFullListenerWaitsThenSaysBusy(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	cfg := DefaultConfig()
	cfg.ListenBacklog = 2
	cfg.ListenWait = 500 * time.Millisecond
	srv := startTestServer(t, p, cfg, "")
	l := srv.Listen(KindForward)
	cli := startTestClient(t, p, "box-1", srv.addr, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range cfg.ListenBacklog {
		if _, err := cli.Open(ctx, KindForward, nil); err != nil {
			t.Fatalf("open within the backlog: %v", err)
		}
	}
	start := time.Now()
	_, err := cli.Open(ctx, KindForward, nil)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("open past a backlog nobody takes from: %v, want refused as busy", err)
	}
	if waited := time.Since(start); waited < cfg.ListenWait {
		t.Errorf("refused after %v, before the listener had %v to make room", waited, cfg.ListenWait)
	}
	// A server that takes a stream while another waits admits it.
	opened := make(chan error, 1)
	go func() {
		c, err := cli.Open(ctx, KindForward, nil)
		if err == nil {
			c.Close()
		}
		opened <- err
	}()
	time.Sleep(cfg.ListenWait / 5)
	if _, err := l.Accept(); err != nil {
		t.Fatal(err)
	}
	if err := <-opened; err != nil {
		t.Fatalf("open that waited while the server took a stream: %v", err)
	}
}

// connectProxy starts a CONNECT proxy with basic auth.
func connectProxy(t testing.TB, user, pass string) (addr string, used *atomic.Int32) {
	p := toxic.NewConnectProxy(t, user, pass)
	return p.Addr, &p.Used
}

func TestThroughConnectProxyWithBasicAuth(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	echo(t, srv.Listen(KindRPC))
	paddr, used := connectProxy(t, "edge", "s3cret")
	cli := startTestClient(t, p, "box-1", srv.addr, func(c *ClientConfig) {
		c.Proxy = func(*url.URL) (*url.URL, error) { return url.Parse("http://edge:s3cret@" + paddr) }
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cli.Open(ctx, KindRPC, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := roundTrip(t, c, "via proxy"); got != "box-1:via proxy" {
		t.Fatalf("got %q", got)
	}
	if used.Load() == 0 {
		t.Fatal("the proxy carried no connection")
	}
}

func TestThroughHTTPSProxy(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	echo(t, srv.Listen(KindRPC))
	proxy := toxic.NewTLSConnectProxy(t, "edge", "s3cret", p.leaf(t, "proxy", x509.ExtKeyUsageServerAuth))
	for _, c := range []struct {
		name  string
		roots *x509.CertPool
		want  string
	}{
		{"trusted", p.pool, ""},
		{"untrusted", x509.NewCertPool(), "TLS handshake with proxy"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cli := startTestClient(t, p, "box-1", srv.addr, func(cfg *ClientConfig) {
				cfg.Proxy = func(*url.URL) (*url.URL, error) { return url.Parse("https://edge:s3cret@" + proxy.Addr) }
				cfg.ProxyRoots = c.roots
			})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if c.want != "" {
				_, err := cli.dial(ctx, true)
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("dial through a proxy with an unknown certificate: %v, want %q", err, c.want)
				}
				return
			}
			conn, err := cli.Open(ctx, KindRPC, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := roundTrip(t, conn, "via https proxy"); got != "box-1:via https proxy" {
				t.Fatalf("got %q", got)
			}
		})
	}
	if proxy.Used.Load() == 0 {
		t.Fatal("the proxy carried no connection")
	}
}

// TestBusyConsoleSaysWhenToComeBack turns a box away twice with a wait of
// 300 ms: the box comes back after that wait each time, not after its own
// backoff (here pinned to 30 s), and the session then comes up.
func TestBusyConsoleSaysWhenToComeBack(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	echo(t, srv.Listen(KindRPC))
	var mu sync.Mutex
	var asked []time.Time
	admit := func(string) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, time.Now())
		if len(asked) <= 2 {
			return 300 * time.Millisecond
		}
		return 0
	}
	srv.admit.Store(&admit)
	cli := startTestClient(t, p, "box-1", srv.addr, func(c *ClientConfig) {
		c.Backoff = Backoff{Min: 30 * time.Second, Max: 30 * time.Second, Rand: func(n int64) int64 { return n - 1 }}
	})
	waitFor(t, 10*time.Second, "a session after two busy answers", func() bool { _, ok := srv.Session("box-1"); return ok })
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 3 {
		t.Fatalf("admission asked %d times, want 3", len(asked))
	}
	for i := 1; i < len(asked); i++ {
		if gap := asked[i].Sub(asked[i-1]); gap < 300*time.Millisecond {
			t.Fatalf("dial %d came %v after a busy answer that said 300ms", i+1, gap)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cli.Open(ctx, KindRPC, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := roundTrip(t, c, "admitted"); got != "box-1:admitted" {
		t.Fatalf("got %q", got)
	}
}

func TestReconnectAfterConsoleRestart(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	addr := srv.addr
	cli := startTestClient(t, p, "box-1", addr, nil)
	waitFor(t, 5*time.Second, "first session", func() bool { return cli.Session() != nil })
	srv.stop()
	waitFor(t, 5*time.Second, "session to end", func() bool { return cli.Session() == nil })

	srv2 := startTestServer(t, p, DefaultConfig(), addr)
	echo(t, srv2.Listen(KindRPC))
	waitFor(t, 10*time.Second, "reconnect", func() bool { _, ok := srv2.Session("box-1"); return ok })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := cli.Open(ctx, KindRPC, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := roundTrip(t, c, "again"); got != "box-1:again" {
		t.Fatalf("got %q", got)
	}
}

func TestSessionResumesTLS(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	cli := startTestClient(t, p, "box-1", srv.addr, nil)
	waitFor(t, 5*time.Second, "session", func() bool { _, ok := srv.Session("box-1"); return ok })
	var resumed atomic.Bool
	cli.addrs[0].tls.VerifyConnection = func(cs tls.ConnectionState) error {
		if cs.DidResume {
			resumed.Store(true)
		}
		return nil
	}
	srv.Drop("box-1")
	waitFor(t, 10*time.Second, "TLS resumption on redial", resumed.Load)
}

func TestNewSessionReplacesOld(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	events := make(chan SessionEvent, 16)
	srv.events.Store(&events)
	held := make(chan net.Conn, 1)
	l := srv.Listen(KindForward)
	go func() {
		c, err := l.Accept()
		if err == nil {
			held <- c
		}
	}()
	a := startTestClient(t, p, "box-1", srv.addr, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := a.Open(ctx, KindForward, nil)
	if err != nil {
		t.Fatal(err)
	}
	consoleSide := <-held
	oldSess, _ := srv.Session("box-1")
	// A second agent with the same identity (the box after a reboot).
	startTestClient(t, p, "box-1", srv.addr, nil)
	waitFor(t, 5*time.Second, "replacement", func() bool { s, _ := srv.Session("box-1"); return s != nil && s != oldSess })
	select {
	case <-oldSess.Done():
	case <-time.After(time.Second):
		t.Fatal("old session still up")
	}
	consoleSide.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := consoleSide.Read(make([]byte, 1)); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stream of replaced session still open: %v", err)
	}
	st.Close()
	// The old session's end says it was replaced: the box did not leave.
	for {
		select {
		case ev := <-events:
			if ev.Up {
				continue
			}
			if ev.Session != oldSess || !ev.Replaced {
				t.Fatalf("first session end: %+v, want the old session, replaced", ev)
			}
			return
		case <-time.After(5 * time.Second):
			t.Fatal("no session end reported")
		}
	}
}

func TestRevokedBoxIsToldAndDroppedAtOnce(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	events := make(chan SessionEvent, 16)
	srv.events.Store(&events)
	cli := startTestClient(t, p, "box-9", srv.addr, nil)
	// The box may hold its session before the console has recorded it.
	waitFor(t, 5*time.Second, "session", func() bool { _, ok := srv.Session("box-9"); return ok && cli.Session() != nil })
	srv.revoked.Store("box-9", true)
	start := time.Now()
	srv.Drop("box-9")
	waitFor(t, time.Second, "box to see its session end", func() bool { return cli.Session() == nil })
	t.Logf("dropped in %v", time.Since(start))
	// Its only session ended: not replaced.
	for ev := range events {
		if !ev.Up {
			if ev.Replaced {
				t.Fatalf("the end of a box's only session says replaced: %+v", ev)
			}
			break
		}
	}
	// It redials and is refused with a reason.
	_, err := cli.dial(context.Background(), false)
	if err == nil || !strings.Contains(err.Error(), "box box-9 is revoked") {
		t.Fatalf("redial: got %v, want the console's refusal", err)
	}
}

func TestOtherCARefused(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	other := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	// A box whose certificate another CA signed, but who trusts our console.
	cert := other.leaf(t, "box-x", 2 /* client auth */)
	c, err := NewClient(ClientConfig{Config: DefaultConfig(), Addr: srv.addr,
		TLS:   &tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{cert}},
		Proxy: func(*url.URL) (*url.URL, error) { return nil, nil }}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.dial(context.Background(), false); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("got %v, want a certificate error", err)
	}
	if len(srv.Sessions()) != 0 {
		t.Fatal("a session came up")
	}
}

func TestHalfOpenLinkRedialledWithin30s(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	px := toxic.New(t, srv.addr)
	cli := startTestClient(t, p, "box-1", px.Addr(), func(c *ClientConfig) {
		c.Backoff = Backoff{Min: time.Second, Max: time.Minute}
	})
	waitFor(t, 10*time.Second, "session", func() bool { return cli.Session() != nil })
	first := cli.Session()
	// Blackhole the link in both directions without closing it: neither TCP
	// side learns anything.
	if err := px.Add("down", "timeout", "downstream", `"timeout":0`); err != nil {
		t.Fatal(err)
	}
	if err := px.Add("up", "timeout", "upstream", `"timeout":0`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, 30*time.Second, "the box to notice the dead link", func() bool {
		select {
		case <-first.Done():
			return true
		default:
			return false
		}
	})
	noticed := time.Since(start)
	px.Remove("down")
	px.Remove("up")
	waitFor(t, 30*time.Second-noticed, "a new session", func() bool { s := cli.Session(); return s != nil && s != first })
	t.Logf("half-open link noticed after %v, redialled after %v", noticed.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

func TestGarbageAndSlowStreamsDoNotHurtOthers(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	cfg := DefaultConfig()
	cfg.OpenTimeout = 300 * time.Millisecond
	cfg.ListenWait = 100 * time.Millisecond
	srv := startTestServer(t, p, cfg, "")
	echo(t, srv.Listen(KindRPC))
	cli := startTestClient(t, p, "box-1", srv.addr, func(c *ClientConfig) { c.Config = cfg })
	waitFor(t, 5*time.Second, "session", func() bool { return cli.Session() != nil })
	sess := cli.Session()
	// Raw yamux streams that never send a valid header.
	var raws []net.Conn
	for i := range 20 {
		st, err := sess.ys.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			st.Write(bytes.Repeat([]byte{0xff}, 100)) // garbage
		} // odd ones stay silent (slow)
		raws = append(raws, st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := cli.Open(ctx, KindRPC, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := roundTrip(t, c, "fine"); got != "box-1:fine" {
		t.Fatalf("got %q", got)
	}
	for _, r := range raws {
		r.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := r.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("bad stream not closed by the console: %v", err)
		}
	}
}

func TestBusySessionIsRenewedOnceQuiet(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	cfg := DefaultConfig()
	cfg.PingInterval = 50 * time.Millisecond // renewal is checked at each ping
	srv := startTestServer(t, p, cfg, "")
	echo(t, srv.Listen(KindForward))
	syncs := srv.Listen(KindSync)
	cli := startTestClient(t, p, "box-1", srv.addr, func(c *ClientConfig) {
		c.Config = cfg
		c.Renew = Renewal{After: 256 << 10, Idle: 300 * time.Millisecond, Cuts: []Kind{KindSync}}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waitFor(t, 5*time.Second, "session", func() bool { _, ok := srv.Session("box-1"); return ok && cli.Session() != nil })
	first := cli.Session()

	// move sends n bytes through an echo stream and reads them back; with
	// keep, the stream stays open.
	move := func(n int, keep bool) net.Conn {
		t.Helper()
		c, err := cli.Open(ctx, KindForward, nil)
		if err != nil {
			t.Fatal(err)
		}
		go c.Write(bytes.Repeat([]byte{'x'}, n))
		if _, err := io.ReadFull(c, make([]byte, len("box-1:")+n)); err != nil {
			t.Fatal(err)
		}
		if !keep {
			c.Close()
		}
		return c
	}
	stays := func(what string, s *Session) {
		t.Helper()
		time.Sleep(time.Second)
		if cli.Session() != s {
			t.Fatalf("%s: the session was renewed", what)
		}
	}

	// A session that carried little stays, whatever its streams.
	move(64<<10, false)
	stays("after 64 KiB", first)

	// A stream that renewal must not cut holds the session, however much
	// it carried.
	held := move(512<<10, true)
	stays("with a forward stream open", first)

	// Closed, and with only a Sync stream left, the quiet session is
	// replaced: the console drops the old one and its Sync stream.
	up, err := cli.Open(ctx, KindSync, nil)
	if err != nil {
		t.Fatal(err)
	}
	down, err := syncs.Accept()
	if err != nil {
		t.Fatal(err)
	}
	held.Close()
	waitFor(t, 5*time.Second, "renewal", func() bool { return cli.Session() != first && cli.Session() != nil })
	select {
	case <-first.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the old session is still up on the box")
	}
	waitFor(t, 5*time.Second, "the console on the new session", func() bool {
		s, ok := srv.Session("box-1")
		return ok && s.Started().After(first.Started())
	})
	for _, c := range []net.Conn{up, down} {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the Sync stream of the old session is still open: %v", err)
		}
	}

	// The new session works, and is not renewed again without cause.
	second := cli.Session()
	move(1024, false)
	stays("a fresh session", second)
}
