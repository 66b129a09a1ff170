package replicas

import (
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestTheReplicaPortHoldsStrangersToBounds: connections that have not
// shown a replica certificate are held to a few in all and from one
// address, those over are closed at once, and a replica's connection,
// once through its handshake, takes no stranger's place and is not
// refused for theirs.
func TestTheReplicaPortHoldsStrangersToBounds(t *testing.T) {
	t.Parallel()
	ca := authority(t)
	cert, err := ca.ReplicaCert("r-guard", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := ListenerTLS(cert, ca.Pool())
	guarded := Guard(ln, cfg, GuardConfig{Handshakes: 4, PerAddr: 2, Metrics: reg})
	srv := &http.Server{TLSConfig: cfg, ReadHeaderTimeout: time.Minute, ErrorLog: log.New(t.Output(), "", 0),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("replica")) })}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(guarded) }()
	t.Cleanup(func() { srv.Close(); <-done })
	addr := ln.Addr().String()

	// dial connects from local address from (127.0.0.x) and says nothing.
	dial := func(from string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// closed reports whether the port closed c: a read ends at once
	// instead of waiting.
	closed := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		return !errors.Is(err, os.ErrDeadlineExceeded)
	}
	refused := func() float64 {
		t.Helper()
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == "edgebox_console_replica_port_refused_total" {
				return f.GetMetric()[0].GetCounter().GetValue()
			}
		}
		t.Fatal("no edgebox_console_replica_port_refused_total")
		return 0
	}

	a1, a2 := dial("127.0.0.2"), dial("127.0.0.2")
	if a3 := dial("127.0.0.2"); !closed(a3) {
		t.Fatal("a third stranger's connection from one address was held; want it closed at once")
	}
	if closed(a1) || closed(a2) {
		t.Fatal("a stranger's first two connections were closed")
	}
	b1, b2 := dial("127.0.0.3"), dial("127.0.0.3")
	if c1 := dial("127.0.0.4"); !closed(c1) {
		t.Fatal("a fifth connection in its handshake was held; want it closed at once")
	}
	if closed(b1) || closed(b2) {
		t.Fatal("a second stranger's connections were closed")
	}
	if got := refused(); got != 2 {
		t.Fatalf("refused %v connections, want 2", got)
	}

	// A place freed is taken again.
	b2.Close()
	var c2 net.Conn
	waitFor(t, "a freed place to be taken", func() bool {
		c2 = dial("127.0.0.4")
		return !closed(c2)
	})

	// A replica gets in once the strangers are gone, and its connection,
	// kept open, takes no place of theirs.
	for _, c := range []net.Conn{a1, a2, b1, c2} {
		c.Close()
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS(cert, ca.Pool())}}
	waitFor(t, "a replica to be served", func() bool {
		resp, err := client.Get("https://" + addr + "/")
		if err != nil {
			return false
		}
		// Read to its end, the connection stays open in the client's pool.
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	// The strangers' closes reach the server in their own time; the
	// replica's connection, open still, must hold no place meanwhile.
	g := guarded.(*guard)
	waitFor(t, "the strangers' places to be free", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.pending == 0 && len(g.byAddr) == 0
	})
	before := refused()
	held := []net.Conn{dial("127.0.0.2"), dial("127.0.0.2"), dial("127.0.0.3"), dial("127.0.0.3")}
	for i, c := range held {
		if closed(c) {
			t.Fatalf("stranger's connection %d closed: the replica's took a place", i+1)
		}
	}
	if refused() != before {
		t.Fatal("connections refused while the strangers were within bounds")
	}

	// A box's certificate is no replica's: its connection stays a
	// stranger's, and is closed at once when the strangers' places are
	// full.
	box := boxCert(t, ca, "bx-guard")
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
		&tls.Config{Certificates: []tls.Certificate{box}, RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
	if err == nil {
		conn.Close()
		t.Fatal("a box's certificate got through a full replica port")
	}
	if refused() != before+1 {
		t.Fatalf("refused %v, want %v", refused(), before+1)
	}
}
