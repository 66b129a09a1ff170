package sitepeer

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"runtime"
	"testing"
	"time"

	"github.com/edgebox/edgebox/enroll"
)

// ca issues box certificates as the console's does: client
// authentication only, the box in a URI SAN.
type ca struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCA(t testing.TB) *ca {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &ca{cert: cert, key: key, pool: pool}
}

func (c *ca) box(t testing.TB, id string) *tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	u, _ := url.Parse(enroll.BoxURIPrefix + id)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: id},
		URIs: []*url.URL{u}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

const period = 200 * time.Millisecond

// box is one prober running on its own loopback address.
type box struct {
	id, addr string
	p        *Prober
	stop     context.CancelFunc
	done     chan error
}

func startBox(t *testing.T, c *ca, id, ip string, port int) *box {
	t.Helper()
	return startBoxPeriod(t, c, id, ip, port, period, nil)
}

// startBoxPeriod is startBox with a period, and wrap around each
// association's UDP connection when set.
func startBoxPeriod(t testing.TB, c *ca, id, ip string, port int, period time.Duration, wrap func(net.Conn) net.Conn) *box {
	t.Helper()
	cert := c.box(t, id)
	addr := fmt.Sprintf("%s:%d", ip, port)
	p := New(Config{Self: id, Cert: func() *tls.Certificate { return cert }, CA: c.pool, Listen: []string{addr}, Period: period})
	p.wrap = wrap
	ctx, cancel := context.WithCancel(context.Background())
	b := &box{id: id, addr: addr, p: p, stop: cancel, done: make(chan error, 1)}
	go func() { b.done <- p.Run(ctx) }()
	t.Cleanup(b.halt)
	return b
}

func (b *box) halt() {
	if b.stop == nil {
		return
	}
	b.stop()
	b.stop = nil
	<-b.done
}

func freePort(t testing.TB) int {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

func site(boxes ...*box) []Peer {
	var out []Peer
	for _, b := range boxes {
		out = append(out, Peer{ID: b.id, Addrs: []string{b.addr}})
	}
	return out
}

func hears(b *box, peer string) bool {
	for _, s := range b.p.Seen() {
		if s.BoxId == peer {
			return s.Alive
		}
	}
	return false
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestASiteHearsItself: three boxes hear each other; one that stops is
// no longer heard after three periods; started again (a new process, no
// state) it is heard again, and hears the others, without waiting out a
// back-off.
func TestASiteHearsItself(t *testing.T) {
	c := newCA(t)
	port := freePort(t)
	a, b, d := startBox(t, c, "bx-a", "127.0.0.1", port), startBox(t, c, "bx-b", "127.0.0.2", port), startBox(t, c, "bx-c", "127.0.0.3", port)
	all := site(a, b, d)
	for _, x := range []*box{a, b, d} {
		x.p.SetPeers(all)
	}
	waitFor(t, 5*time.Second, "every box hearing the other two", func() bool {
		return hears(a, "bx-b") && hears(a, "bx-c") && hears(b, "bx-a") && hears(b, "bx-c") && hears(d, "bx-a") && hears(d, "bx-b")
	})

	b.halt()
	stopped := time.Now()
	waitFor(t, 10*period, "the others no longer hearing the stopped box", func() bool { return !hears(a, "bx-b") && !hears(d, "bx-b") })
	if took := time.Since(stopped); took < 2*period {
		t.Fatalf("the stopped box was given up after %v, before its three periods", took)
	}
	if !hears(a, "bx-c") || !hears(d, "bx-a") {
		t.Fatal("the boxes still running stopped hearing each other")
	}

	b = startBox(t, c, "bx-b", "127.0.0.2", port)
	b.p.SetPeers(all)
	back := time.Now()
	waitFor(t, 5*time.Second, "the restarted box heard, and hearing the others", func() bool {
		return hears(a, "bx-b") && hears(d, "bx-b") && hears(b, "bx-a") && hears(b, "bx-c")
	})
	t.Logf("a restarted box was heard both ways again after %v (period %v)", time.Since(back).Round(time.Millisecond), period)
}

// TestStrangersAreRefused: a box of the same CA that is not listed, a
// listed box's name on a certificate from another CA, and a listed box
// dialling from an address that is not its own are never heard; a
// peer dropped from the list stops being heard.
func TestStrangersAreRefused(t *testing.T) {
	c := newCA(t)
	port := freePort(t)
	a := startBox(t, c, "bx-a", "127.0.0.1", port)
	stranger := startBox(t, c, "bx-x", "127.0.0.4", port)      // same CA, not listed by a
	forger := startBox(t, newCA(t), "bx-b", "127.0.0.2", port) // bx-b's name, another CA
	moved := startBox(t, c, "bx-c", "127.0.0.5", port)         // listed at 127.0.0.3
	a.p.SetPeers([]Peer{{ID: "bx-b", Addrs: []string{forger.addr}}, {ID: "bx-c", Addrs: []string{fmt.Sprintf("127.0.0.3:%d", port)}}})
	stranger.p.SetPeers(site(a))
	forger.p.SetPeers(site(a))
	moved.p.SetPeers(site(a))
	time.Sleep(10 * period)
	for _, s := range a.p.Seen() {
		if s.LastHeardUnixNano != 0 {
			t.Errorf("bx-a heard %s", s.BoxId)
		}
	}
	dropped := a.p.Dropped()
	if dropped["not a peer's address"] == 0 {
		t.Errorf("nothing turned away for its address: %v", dropped)
	}
	if hears(forger, "bx-a") {
		t.Error("bx-a answered as itself to a box of another CA")
	}

	// A listed peer, heard, then dropped from the list.
	b := startBox(t, c, "bx-b", "127.0.0.6", port)
	a.p.SetPeers(site(b))
	b.p.SetPeers(site(a))
	waitFor(t, 5*time.Second, "bx-a hearing a listed bx-b", func() bool { return hears(a, "bx-b") })
	a.p.SetPeers(nil)
	if s := a.p.Seen(); len(s) != 0 {
		t.Fatalf("a peer dropped from the list is still seen: %v", s)
	}
	waitFor(t, 10*period, "bx-b no longer hearing bx-a, which stopped answering it", func() bool { return !hears(b, "bx-a") })
}

// TestAFloodOfHandshakesHarmsNoPeer: 20,000 ClientHello-like datagrams
// from an address no peer has, and as many from a peer's address that
// never finish the cookie exchange; after it two boxes hear each other
// again, and the flood leaves no goroutines and no memory behind.
func TestAFloodOfHandshakesHarmsNoPeer(t *testing.T) {
	c := newCA(t)
	port := freePort(t)
	a, b := startBox(t, c, "bx-a", "127.0.0.1", port), startBox(t, c, "bx-b", "127.0.0.2", port)
	a.p.SetPeers(site(b))
	b.p.SetPeers(site(a))
	waitFor(t, 5*time.Second, "the two boxes hearing each other", func() bool { return hears(a, "bx-b") && hears(b, "bx-a") })
	before := runtime.NumGoroutine()
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	heapBefore := heap()
	// A DTLS 1.2 record header of a handshake, and a ClientHello's start.
	hello := []byte{22, 0xfe, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	for _, from := range []string{"127.0.0.9", "127.0.0.2"} {
		var socks []*net.UDPConn
		for range 200 {
			s, err := net.DialUDP("udp", &net.UDPAddr{IP: net.ParseIP(from)}, &net.UDPAddr{IP: net.ParseIP("127.0.0.1"), Port: port})
			if err != nil {
				t.Fatal(err)
			}
			socks = append(socks, s)
		}
		for i := range 20_000 {
			socks[i%len(socks)].Write(hello)
		}
		for _, s := range socks {
			s.Close()
		}
	}
	// The flood may have cost bx-b's heartbeats to bx-a (the socket's
	// buffer overflows) and so its association, and bx-b's new handshake
	// shares the bounded slots with the flood's from bx-b's own address,
	// which hold theirs for a handshake timeout: within that and a few
	// periods, the two hear each other again.
	waitFor(t, handshakeTimeout+10*period, "the two boxes hearing each other after the flood", func() bool {
		return hears(a, "bx-b") && hears(b, "bx-a")
	})
	waitFor(t, 2*handshakeTimeout, "the flood's goroutines gone", func() bool { return runtime.NumGoroutine() <= before+10 })
	// What the flood made is gone with it: 40,000 datagrams from 400
	// addresses leave the heap within a few MiB of where it was.
	if grew := int64(heap()) - int64(heapBefore); grew > 8<<20 {
		t.Errorf("the heap grew by %d KiB over the flood", grew>>10)
	} else {
		t.Logf("the heap grew by %d KiB over the flood", grew>>10)
	}
	t.Logf("turned away: %v", a.p.Dropped())
}
