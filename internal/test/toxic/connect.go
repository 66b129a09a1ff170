package toxic

import (
	"bufio"
	"crypto/tls"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
)

// ConnectProxy is a minimal HTTP CONNECT proxy with basic auth on a free
// loopback port, for the proxy-only sites boxes sit in. Used counts the
// tunnels it opened. It stops when the test ends.
type ConnectProxy struct {
	Addr string
	Used atomic.Int32
	// via, when set, is where every tunnel goes, whatever its CONNECT
	// names.
	via string
}

// NewConnectProxy starts a proxy that wants user and pass.
func NewConnectProxy(t testing.TB, user, pass string) *ConnectProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return startConnectProxy(t, ln, user, pass, "")
}

// NewConnectProxyVia starts a proxy that wants user and pass and sends
// every tunnel to via (a toxiproxy), whatever host its CONNECT names: a
// box that reaches its console only through the proxy reaches it only
// through via, with the console's name and certificate unchanged.
func NewConnectProxyVia(t testing.TB, user, pass, via string) *ConnectProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return startConnectProxy(t, ln, user, pass, via)
}

// NewConnectProxyAt starts a proxy that wants user and pass, listening
// on addr (an address of the test's namespace that a box in a network
// namespace reaches).
func NewConnectProxyAt(t testing.TB, addr, user, pass string) *ConnectProxy {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return startConnectProxy(t, ln, user, pass, "")
}

// NewTLSConnectProxy starts a proxy that clients reach over TLS (an
// https:// proxy), presenting cert.
func NewTLSConnectProxy(t testing.TB, user, pass string, cert tls.Certificate) *ConnectProxy {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	return startConnectProxy(t, ln, user, pass, "")
}

func startConnectProxy(t testing.TB, ln net.Listener, user, pass, via string) *ConnectProxy {
	p := &ConnectProxy{Addr: ln.Addr().String(), via: via}
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	track := func(c net.Conn, on bool) {
		mu.Lock()
		defer mu.Unlock()
		if on {
			conns[c] = true
		} else {
			delete(conns, c)
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c, true)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { c.Close(); track(c, false) }()
				p.serve(c, want, track)
			}()
		}
	}()
	return p
}

func (p *ConnectProxy) serve(c net.Conn, want string, track func(net.Conn, bool)) {
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil || req.Method != http.MethodConnect {
		return
	}
	if req.Header.Get("Proxy-Authorization") != want {
		io.WriteString(c, "HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")
		return
	}
	to := req.Host
	if p.via != "" {
		to = p.via
	}
	up, err := net.Dial("tcp", to)
	if err != nil {
		io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
		return
	}
	track(up, true)
	defer func() { up.Close(); track(up, false) }()
	p.Used.Add(1)
	io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
	done := make(chan struct{})
	go func() { io.Copy(up, br); up.Close(); close(done) }()
	io.Copy(c, up)
	c.Close()
	<-done
}
