package testenv

import (
	"context"
	"crypto/tls"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
)

func createToken(t testing.TB, c *api.Client, req api.TokenRequest) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tok, err := c.CreateToken(ctx, req)
	if err != nil {
		t.Fatalf("create token: %v", err)
	}
	return tok.Text
}

// FreeAddr returns a loopback address with a port that was free a moment
// ago, for programs that must be told their address before they listen.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// RestartableAddr is a free loopback address for a listener a test stops
// and starts again on the same address. FreeAddr's ports come from the
// range outgoing connections take theirs from, so one of the test's own
// connections may hold the port by the restart ("address already in
// use"); this address is on a loopback IP of its own (127.88.x.y), where
// outgoing connections, which leave from 127.0.0.1, never bind.
func RestartableAddr(t testing.TB) string {
	t.Helper()
	for range 16 {
		ip := net.IPv4(127, 88, byte(1+rand.IntN(254)), byte(1+rand.IntN(254)))
		l, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
		if err != nil {
			continue
		}
		defer l.Close()
		return l.Addr().String()
	}
	t.Fatal("no free address on 127.88.0.0/16")
	return ""
}

// FetchCA reads the console CA without verifying; tests then pin it.
func FetchCA(t testing.TB, url string) []byte {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := hc.Get(url + "/api/v1/ca")
	if err != nil {
		t.Fatalf("fetch CA: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
