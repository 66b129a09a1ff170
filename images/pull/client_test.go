package pull

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestConsoleRequestsGoThroughTheTunnel: requests for the console's
// registry are carried as plain HTTP over what open dials, whatever the
// scheme; requests for other hosts never touch the tunnel.
func TestConsoleRequestsGoThroughTheTunnel(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, r.Host+" "+r.URL.Path)
	}))
	defer srv.Close()
	var opened atomic.Int64
	open := func(ctx context.Context) (net.Conn, error) {
		opened.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Listener.Addr().String())
	}
	hc := NewClient([]string{"console.example:8443", "console.example"}, open, nil)
	for _, u := range []string{"https://console.example:8443/v2/", "https://console.example/v2/x"} {
		resp, err := hc.Get(u)
		if err != nil {
			t.Fatalf("GET %s: %v", u, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.HasPrefix(string(body), "console.example") {
			t.Errorf("GET %s reached the server as %q", u, body)
		}
	}
	if opened.Load() == 0 || hits.Load() != 2 {
		t.Fatalf("tunnel opened %d times, server hit %d times", opened.Load(), hits.Load())
	}
	before := opened.Load()
	// Another registry goes direct: here, straight to the test server.
	resp, err := hc.Get(srv.URL + "/v2/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if opened.Load() != before {
		t.Error("a request for another registry went through the tunnel")
	}
}
