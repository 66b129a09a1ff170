package replicas

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/edgebox/edgebox/console/pki"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/internal/test/etcdtest"
	"github.com/edgebox/edgebox/tunnel"
	"github.com/edgebox/edgebox/tunnel/forwarding"
)

// boxes stands in for one replica's tunnel server: the boxes connected to
// it. A stream opened to one is a loopback TCP connection, whose far end
// the test holds as the box; the box first writes greet, as a key's box
// answers a usbip stream at once.
type boxes struct {
	t      *testing.T
	greet  []byte
	opened chan opened

	mu     sync.Mutex
	online map[string]bool
}

// opened is one stream a box was asked to open.
type opened struct {
	box  string
	kind tunnel.Kind
	meta map[string]string
	end  net.Conn // the box's end
}

func (b *boxes) connect(box string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.online[box] = true
}

func (b *boxes) Open(ctx context.Context, box string, kind tunnel.Kind, meta map[string]string) (net.Conn, error) {
	b.mu.Lock()
	on := b.online[box]
	b.mu.Unlock()
	if !on {
		return nil, fmt.Errorf("%w: %s", tunnel.ErrOffline, box)
	}
	near, far, err := tcpPair(b.t)
	if err != nil {
		return nil, err
	}
	if len(b.greet) > 0 {
		far.Write(b.greet)
	}
	b.opened <- opened{box: box, kind: kind, meta: meta, end: far}
	return near, nil
}

// next is the next stream opened to one of b's boxes.
func (b *boxes) next(t *testing.T) opened {
	t.Helper()
	select {
	case o := <-b.opened:
		return o
	case <-time.After(10 * time.Second):
		t.Fatal("no stream was opened to the box")
		return opened{}
	}
}

// none fails the test when a stream was opened to one of b's boxes.
func (b *boxes) none(t *testing.T) {
	t.Helper()
	select {
	case o := <-b.opened:
		t.Fatalf("a %s stream was opened to box %s, and should not have been", o.kind, o.box)
	default:
	}
}

// tcpPair is a connected pair of loopback TCP connections, closed when
// the test ends.
func tcpPair(t *testing.T) (net.Conn, net.Conn, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	b := <-accepted
	if err != nil || b == nil {
		return nil, nil, fmt.Errorf("a loopback pair: %v", err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b, nil
}

// node is one replica of a test: its Set, its Streams behind a replica
// listener on loopback, and the boxes connected to it.
type node struct {
	set     *Set
	streams *Streams
	boxes   *boxes
	cert    *pki.ReplicaCert
}

func startNode(t *testing.T, endpoint string, ca *pki.Authority, id string, tweak func(*StreamsConfig)) *node {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	set, err := Start(context.Background(), Config{Client: client(t, endpoint), Prefix: "/edgebox/", TTL: 2 * time.Second,
		Self: Replica{ID: id, Name: "console " + id, URL: "https://" + ln.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	n := &node{set: set, boxes: &boxes{t: t, opened: make(chan opened, 16), online: map[string]bool{}}}
	if n.cert, err = ca.ReplicaCert(id, []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	cfg := StreamsConfig{Set: set, Local: n.boxes, Cert: n.cert, Roots: ca.Pool(),
		Log: slog.New(slog.NewTextHandler(t.Output(), nil)).With("replica", id)}
	if tweak != nil {
		tweak(&cfg)
	}
	if n.streams, err = NewStreams(cfg); err != nil {
		t.Fatal(err)
	}
	serve(t, ln, ListenerTLS(n.cert, ca.Pool()), ServeReplicas(n.streams.Mount(http.NotFoundHandler())))
	t.Cleanup(func() { n.streams.Close() })
	return n
}

// serve serves h on ln with TLS cfg until the test ends.
func serve(t *testing.T, ln net.Listener, cfg *tls.Config, h http.Handler) {
	srv := &http.Server{Handler: h, TLSConfig: cfg, ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.New(t.Output(), "", 0)}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(tls.NewListener(ln, cfg)) }()
	t.Cleanup(func() { srv.Close(); <-done })
}

// hold makes n hold box, connected, as every node sees it.
func hold(t *testing.T, n *node, box string, others ...*node) {
	t.Helper()
	n.boxes.connect(box)
	n.set.Hold(box, time.Now())
	for _, o := range others {
		waitFor(t, o.set.Self().ID+" to see "+n.set.Self().ID+" hold "+box, func() bool {
			h, ok := o.set.Holder(box)
			return ok && h.ID == n.set.Self().ID
		})
	}
}

// authority is a console CA for a test.
func authority(t *testing.T) *pki.Authority {
	t.Helper()
	a, _, err := pki.Open(t.TempDir(), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// boxCert is a box's certificate of ca: the CA's, and no replica's.
func boxCert(t *testing.T, ca *pki.Authority, box string) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr, _ := x509.ParseCertificateRequest(der)
	certPEM, _, err := ca.SignBox(csr, box, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(certPEM)
	return tls.Certificate{Certificate: [][]byte{b.Bytes}, PrivateKey: key}
}

// readN reads n bytes from c within 10 s.
func readN(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("reading %d bytes: %v", n, err)
	}
	return b
}

// ends waits up to 10 s for c's reads to end, reading what comes, and
// fails the test if they do not.
func ends(t *testing.T, what string, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: still open 10 s on", what)
	}
}

// carried is how many streams n carries for other replicas now.
func carried(n *node) int64 { return n.streams.carried.Load() }

func TestStreamsBetweenReplicas(t *testing.T) {
	ep := etcdtest.Start(t)
	ca := authority(t)
	a := startNode(t, ep, ca, "a", func(c *StreamsConfig) { c.HalfClosed = 2 * time.Second })
	b := startNode(t, ep, ca, "b", nil)
	a.boxes.greet = []byte{0} // a key's box answers "connected" at once
	waitFor(t, "both replicas known to both", func() bool { return len(a.set.Replicas()) == 2 && len(b.set.Replicas()) == 2 })
	hold(t, a, "bx-key", b)
	usbip := func(key string) map[string]string { return map[string]string{forwarding.MetaKey: key} }

	t.Run("bytes flow both ways through the replica that holds the box", func(t *testing.T) {
		conn, err := b.streams.Open(ctx(t), "bx-key", tunnel.KindUSBIP, usbip("k-1"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		box := a.boxes.next(t)
		if box.box != "bx-key" || box.kind != tunnel.KindUSBIP || box.meta[forwarding.MetaKey] != "k-1" || len(box.meta) != 1 {
			t.Fatalf("the box was asked for %+v", box)
		}
		b.boxes.none(t)
		if got := readN(t, conn, 1); got[0] != 0 {
			t.Fatalf("the box's first byte came as %x", got)
		}
		// A megabyte each way at once: neither direction waits on the other.
		up, down := bytes.Repeat([]byte("to the key "), 100_000), bytes.Repeat([]byte("from the key "), 80_000)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); conn.Write(up) }()
		go func() { defer wg.Done(); box.end.Write(down) }()
		gotUp, gotDown := readN(t, box.end, len(up)), readN(t, conn, len(down))
		wg.Wait()
		if !bytes.Equal(gotUp, up) || !bytes.Equal(gotDown, down) {
			t.Fatal("the bytes that came through are not those sent")
		}
		if carried(a) != 1 || carried(b) != 0 {
			t.Fatalf("streams carried: a %d, b %d; want 1, 0", carried(a), carried(b))
		}

		// A half-close goes through: the box reads the end and still answers.
		if err := conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		ends(t, "the box's end after the caller's half-close", box.end)
		box.end.Write([]byte("last words"))
		if got := readN(t, conn, len("last words")); string(got) != "last words" {
			t.Fatalf("after the half-close the caller read %q", got)
		}
		box.end.Close()
		ends(t, "the caller's end after the box closed", conn)
		waitFor(t, "a to carry no stream", func() bool { return carried(a) == 0 })
	})

	t.Run("a box connected here is opened here", func(t *testing.T) {
		conn, err := a.streams.Open(ctx(t), "bx-key", tunnel.KindUSBIP, usbip("k-1"))
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
		a.boxes.next(t).end.Close()
		// Even when the claims still say another replica has it.
		hold(t, a, "bx-moved", b)
		b.boxes.connect("bx-moved")
		conn, err = b.streams.Open(ctx(t), "bx-moved", tunnel.KindUSBIP, usbip("k-2"))
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
		b.boxes.next(t).end.Close()
		a.boxes.none(t)
		if carried(a) != 0 {
			t.Fatalf("a carried a stream to a box b has")
		}
	})

	a.set.Hold("bx-gone", time.Now()) // claimed by a, but not connected there
	waitFor(t, "b to see a hold bx-gone", func() bool { _, ok := b.set.Holder("bx-gone"); return ok })
	t.Run("refused", func(t *testing.T) {
		tests := []struct {
			name    string
			box     string
			kind    tunnel.Kind
			meta    map[string]string
			kinds   []error // the error is of each
			message string
		}{
			{"a box held nowhere", "bx-nowhere", tunnel.KindUSBIP, usbip("k-1"), []error{tunnel.ErrOffline}, "bx-nowhere"},
			{"a box no longer where the claims say", "bx-gone", tunnel.KindUSBIP, usbip("k-1"),
				[]error{tunnel.ErrOffline, errdefs.ErrUnavailable}, "console replica console a: box bx-gone is not connected to this console replica"},
			{"a kind not carried", "bx-key", tunnel.KindForward, map[string]string{forwarding.MetaTarget: "10.0.0.1:22"},
				[]error{errdefs.ErrPermission}, "forward streams are not carried between console replicas"},
			{"metadata not carried", "bx-key", tunnel.KindUSBIP, map[string]string{forwarding.MetaKey: "k-1", forwarding.MetaTarget: "10.0.0.1:22"},
				[]error{errdefs.ErrInvalid}, `may not carry "target"`},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				conn, err := b.streams.Open(ctx(t), tt.box, tt.kind, tt.meta)
				if err == nil {
					conn.Close()
					t.Fatal("opened")
				}
				for _, k := range tt.kinds {
					if !errors.Is(err, k) {
						t.Errorf("%v: not %v", err, k)
					}
				}
				if !strings.Contains(err.Error(), tt.message) {
					t.Errorf("%q does not say %q", err, tt.message)
				}
			})
		}
		a.boxes.none(t)
	})

	t.Run("the replica that holds the box refuses what it does not carry", func(t *testing.T) {
		to, _ := b.set.Holder("bx-key")
		tests := []struct {
			name string
			box  string
			kind tunnel.Kind
			meta map[string]string
			want error
		}{
			{"a kind not carried", "bx-key", tunnel.KindForward, map[string]string{forwarding.MetaTarget: "10.0.0.1:22"}, errdefs.ErrPermission},
			{"metadata not carried", "bx-key", tunnel.KindUSBIP, map[string]string{"path": "/dev/bus/usb/001/002"}, errdefs.ErrInvalid},
			{"a box not there", "bx-elsewhere", tunnel.KindUSBIP, usbip("k-1"), tunnel.ErrOffline},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				// Past the asking side's own checks, straight to a.
				conn, err := b.streams.open(ctx(t), to, tt.box, tt.kind, tt.meta)
				if err == nil {
					conn.Close()
					t.Fatal("opened")
				}
				if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), "console replica console a: ") {
					t.Fatalf("%v: want %v, from console a", err, tt.want)
				}
			})
		}
		a.boxes.none(t)
	})

	t.Run("requests that are not streams are refused", func(t *testing.T) {
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: clientTLS(b.cert, ca.Pool())}}
		defer hc.CloseIdleConnections()
		to, _ := b.set.Holder("bx-key")
		enc := func(h tunnel.Header) string {
			b, err := h.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			return base64.RawURLEncoding.EncodeToString(b)
		}
		good := enc(tunnel.Header{Kind: tunnel.KindUSBIP, Meta: usbip("k-1")})
		tests := []struct {
			name    string
			method  string
			headers map[string]string
			want    int
		}{
			{"no upgrade", "GET", map[string]string{boxHeader: "bx-key", streamHeader: good}, http.StatusBadRequest},
			{"a POST", "POST", map[string]string{"Connection": "Upgrade", "Upgrade": streamProto, boxHeader: "bx-key", streamHeader: good}, http.StatusBadRequest},
			{"no box", "GET", map[string]string{"Connection": "Upgrade", "Upgrade": streamProto, streamHeader: good}, http.StatusBadRequest},
			{"a box ID with a slash", "GET", map[string]string{"Connection": "Upgrade", "Upgrade": streamProto, boxHeader: "bx/key", streamHeader: good}, http.StatusBadRequest},
			{"no kind", "GET", map[string]string{"Connection": "Upgrade", "Upgrade": streamProto, boxHeader: "bx-key"}, http.StatusBadRequest},
			{"a kind in plain text", "GET", map[string]string{"Connection": "Upgrade", "Upgrade": streamProto, boxHeader: "bx-key", streamHeader: "usbip"}, http.StatusBadRequest},
			{"a kind not carried", "GET", map[string]string{"Connection": "Upgrade", "Upgrade": streamProto, boxHeader: "bx-key",
				streamHeader: enc(tunnel.Header{Kind: tunnel.KindRPC})}, http.StatusForbidden},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				req, _ := http.NewRequestWithContext(ctx(t), tt.method, to.URL+StreamPath, nil)
				for k, v := range tt.headers {
					req.Header.Set(k, v)
				}
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tt.want || !strings.Contains(string(body), `"error"`) {
					t.Fatalf("answered %d %s; want %d with an error", resp.StatusCode, body, tt.want)
				}
			})
		}
		a.boxes.none(t)
	})

	t.Run("callers without a replica certificate are refused", func(t *testing.T) {
		to, _ := b.set.Holder("bx-key")
		// A handler on a listener that asks for a certificate but does not
		// verify it: the stream endpoint checks on its own.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lax := ListenerTLS(a.cert, ca.Pool())
		lax.ClientAuth, lax.VerifyPeerCertificate = tls.RequireAnyClientCert, nil
		serve(t, ln, lax, a.streams.Mount(http.NotFoundHandler()))
		laxURL := Replica{ID: "a", Name: "console a, lax", URL: "https://" + ln.Addr().String()}

		box := boxCert(t, ca, "bx-intruder")
		tests := []struct {
			name string
			to   Replica
			cert *tls.Certificate
			want error
		}{
			{"no certificate", to, nil, errdefs.ErrUnavailable},
			{"a box's certificate", to, &box, errdefs.ErrUnavailable},
			{"a box's certificate, the listener letting it through", laxURL, &box, errdefs.ErrPermission},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				intruder, err := NewStreams(StreamsConfig{Set: b.set, Local: b.boxes, Cert: b.cert, Roots: ca.Pool()})
				if err != nil {
					t.Fatal(err)
				}
				defer intruder.Close()
				intruder.client.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
					if tt.cert == nil {
						return &tls.Certificate{}, nil
					}
					return tt.cert, nil
				}
				conn, err := intruder.open(ctx(t), tt.to, "bx-key", tunnel.KindUSBIP, usbip("k-1"))
				if err == nil {
					conn.Close()
					t.Fatal("opened")
				}
				if !errors.Is(err, tt.want) {
					t.Fatalf("%v: not %v", err, tt.want)
				}
				t.Logf("refused: %v", err)
			})
		}
		a.boxes.none(t)
	})

	t.Run("closing one end closes the other", func(t *testing.T) {
		t.Run("the caller", func(t *testing.T) {
			conn, err := b.streams.Open(ctx(t), "bx-key", tunnel.KindUSBIP, usbip("k-1"))
			if err != nil {
				t.Fatal(err)
			}
			box := a.boxes.next(t)
			conn.Close()
			ends(t, "the box's end after the caller closed", box.end)
			waitFor(t, "a to carry no stream", func() bool { return carried(a) == 0 })
		})
		t.Run("the box", func(t *testing.T) {
			conn, err := b.streams.Open(ctx(t), "bx-key", tunnel.KindUSBIP, usbip("k-1"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			a.boxes.next(t).end.Close()
			ends(t, "the caller's end after the box closed", conn)
			waitFor(t, "a to carry no stream", func() bool { return carried(a) == 0 })
		})
		t.Run("a half-close never answered", func(t *testing.T) {
			conn, err := b.streams.Open(ctx(t), "bx-key", tunnel.KindUSBIP, usbip("k-1"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			box := a.boxes.next(t)
			defer box.end.Close()
			conn.(interface{ CloseWrite() error }).CloseWrite()
			began := time.Now()
			ends(t, "the caller's end, its half-close never answered", conn) // a's HalfClosed: 2 s
			t.Logf("cut %v after the half-close", time.Since(began).Round(time.Millisecond))
			waitFor(t, "a to carry no stream", func() bool { return carried(a) == 0 })
		})
	})

	t.Run("a replica stopping cuts the streams it carries", func(t *testing.T) {
		c := startNode(t, ep, ca, "c", nil)
		hold(t, c, "bx-c", b)
		conn, err := b.streams.Open(ctx(t), "bx-c", tunnel.KindUSBIP, usbip("k-3"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		box := c.boxes.next(t)
		closed := make(chan struct{})
		go func() { c.streams.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not return within 10 s")
		}
		ends(t, "the caller's end", conn)
		ends(t, "the box's end", box.end)
		if carried(c) != 0 {
			t.Fatalf("c carries %d streams after Close", carried(c))
		}
		if _, err := b.streams.Open(ctx(t), "bx-c", tunnel.KindUSBIP, usbip("k-3")); !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("a stream through a stopped replica's streams: %v", err)
		}
	})

	t.Run("a replica that does not answer", func(t *testing.T) {
		// It takes connections and says nothing.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var held []net.Conn
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				held = append(held, c)
				mu.Unlock()
			}
		}()
		t.Cleanup(func() {
			ln.Close()
			mu.Lock()
			defer mu.Unlock()
			for _, c := range held {
				c.Close()
			}
		})
		silent, err := Start(context.Background(), Config{Client: client(t, ep), Prefix: "/edgebox/", TTL: 2 * time.Second,
			Self: Replica{ID: "silent", Name: "console silent", URL: "https://" + ln.Addr().String()}})
		if err != nil {
			t.Fatal(err)
		}
		defer silent.Close()
		silent.Hold("bx-silent", time.Now())
		waitFor(t, "b to see the silent replica hold bx-silent", func() bool { _, ok := b.set.Holder("bx-silent"); return ok })

		quick, err := NewStreams(StreamsConfig{Set: b.set, Local: b.boxes, Cert: b.cert, Roots: ca.Pool(), OpenTimeout: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer quick.Close()
		short, cancel := context.WithTimeout(ctx(t), 300*time.Millisecond)
		defer cancel()
		tests := []struct {
			name   string
			s      *Streams
			ctx    context.Context
			within time.Duration
		}{
			{"the caller's deadline", b.streams, short, 3 * time.Second},
			{"the open timeout", quick, ctx(t), 3 * time.Second},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				began := time.Now()
				_, err := tt.s.Open(tt.ctx, "bx-silent", tunnel.KindUSBIP, usbip("k-1"))
				if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "did not answer") {
					t.Fatalf("%v: want unavailable, did not answer", err)
				}
				if took := time.Since(began); took > tt.within {
					t.Fatalf("gave up after %v; want within %v", took, tt.within)
				}
			})
		}
	})
}

// ctx is a context for one call of a test.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// streamRequests are stream requests as a replica listener reads them:
// the box and the encoded header, and whether they are good.
var streamRequests = []struct {
	name string
	box  string
	enc  string
	ok   bool
}{
	{"a key", "bx-abc123", encoded(tunnel.Header{Kind: tunnel.KindUSBIP, Meta: map[string]string{"key": "k-1"}}), true},
	{"no metadata", "bx-abc123", encoded(tunnel.Header{Kind: tunnel.KindVNC}), true},
	{"no box", "", encoded(tunnel.Header{Kind: tunnel.KindUSBIP}), false},
	{"a box ID with a space", "bx abc", encoded(tunnel.Header{Kind: tunnel.KindUSBIP}), false},
	{"a box ID too long", strings.Repeat("b", MaxBoxID+1), encoded(tunnel.Header{Kind: tunnel.KindUSBIP}), false},
	{"no header", "bx-1", "", false},
	{"not base64", "bx-1", "usbip!", false},
	{"padded base64", "bx-1", base64.URLEncoding.EncodeToString([]byte{1, 3, 'v', 'n', 'c', 0, 0}), false},
	{"bytes after the header", "bx-1", encoded(tunnel.Header{Kind: tunnel.KindUSBIP}) + "AA", false},
	{"a header too long", "bx-1", strings.Repeat("A", maxStreamHeader+4), false},
	{"a header of another version", "bx-1", base64.RawURLEncoding.EncodeToString([]byte{2, 5, 'u', 's', 'b', 'i', 'p', 0, 0}), false},
	{"a kind in capitals", "bx-1", base64.RawURLEncoding.EncodeToString([]byte{1, 5, 'U', 'S', 'B', 'I', 'P', 0, 0}), false},
	{"truncated metadata", "bx-1", base64.RawURLEncoding.EncodeToString([]byte{1, 5, 'u', 's', 'b', 'i', 'p', 0, 4, 3, 'k', 'e', 'y'}), false},
	{"the most metadata", "bx-1", encoded(tunnel.Header{Kind: tunnel.KindUSBIP, Meta: map[string]string{"k": strings.Repeat("v", tunnel.MaxMetaLen-4)}}), true},
}

func encoded(h tunnel.Header) string {
	b, err := h.MarshalBinary()
	if err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func TestParseStreamRequest(t *testing.T) {
	t.Parallel()
	for _, tt := range streamRequests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseStreamRequest(tt.box, tt.enc)
			if (err == nil) != tt.ok {
				t.Fatalf("parsed: %v; want ok %v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("%v: not invalid", err)
			}
		})
	}
}

func FuzzParseStreamRequest(f *testing.F) {
	for _, tt := range streamRequests {
		f.Add(tt.box, tt.enc)
	}
	f.Fuzz(func(t *testing.T, box, enc string) {
		h, err := parseStreamRequest(box, enc)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("%v: not invalid", err)
			}
			return
		}
		// What is read is what the asking side would have sent.
		again, err := parseStreamRequest(box, encoded(h))
		if err != nil || again.Kind != h.Kind || len(again.Meta) != len(h.Meta) {
			t.Fatalf("%+v read back as %+v, %v", h, again, err)
		}
		for k, v := range h.Meta {
			if again.Meta[k] != v {
				t.Fatalf("metadata %q: %q read back as %q", k, v, again.Meta[k])
			}
		}
	})
}

// answers are answers a replica may give a stream request, but 101.
var answers = []struct {
	name string
	code int
	body string
	kind error
}{
	{"not here", http.StatusNotFound, `{"error":"box bx-1 is not connected to this console replica"}`, tunnel.ErrOffline},
	{"refused kind", http.StatusForbidden, `{"error":"forward streams are not carried between console replicas"}`, errdefs.ErrPermission},
	{"bad request", http.StatusBadRequest, `{"error":"a box ID must be 1 to 128 characters"}`, errdefs.ErrInvalid},
	{"box did not open", http.StatusBadGateway, `{"error":"opening a usbip stream to box bx-1: EOF"}`, errdefs.ErrUnavailable},
	{"busy", http.StatusServiceUnavailable, `{"error":"try again later"}`, errdefs.ErrUnavailable},
	{"not JSON", http.StatusInternalServerError, "<html>oops</html>", errdefs.ErrUnavailable},
	{"a teapot", http.StatusTeapot, "", errdefs.ErrUnavailable},
	{"control characters", http.StatusForbidden, `{"error":"a\u0000b\nc\u001b[31m"}`, errdefs.ErrPermission},
	{"a long reason", http.StatusNotFound, `{"error":"` + strings.Repeat("é", 600) + `"}`, tunnel.ErrOffline},
}

func TestAnswerError(t *testing.T) {
	t.Parallel()
	for _, tt := range answers {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := answerError(tt.code, []byte(tt.body), "console a")
			if !errors.Is(err, tt.kind) {
				t.Fatalf("%v: not %v", err, tt.kind)
			}
			checkAnswerError(t, err)
		})
	}
}

func checkAnswerError(t *testing.T, err error) {
	t.Helper()
	msg := err.Error()
	if errdefs.Kind(err) == nil || len(msg) > maxReason+200 || !strings.HasPrefix(msg, "console replica console a: ") {
		t.Fatalf("%q (%v): not a bounded error of the vocabulary, naming the replica", msg, errdefs.Kind(err))
	}
	if strings.ContainsFunc(msg, func(r rune) bool { return r < 0x20 || r == 0x7f }) || !utf8.ValidString(msg) {
		t.Fatalf("%q: a control character, or not UTF-8", msg)
	}
}

func FuzzAnswerError(f *testing.F) {
	for _, tt := range answers {
		f.Add(tt.code, []byte(tt.body))
	}
	f.Fuzz(func(t *testing.T, code int, body []byte) {
		if code == http.StatusSwitchingProtocols {
			return
		}
		checkAnswerError(t, answerError(code, body, "console a"))
	})
}
