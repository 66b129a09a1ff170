// Package pull is the box's way to registries: requests for the console's
// registry travel through the tunnel's "registry" streams, so a box behind
// a firewall that lets nothing in still pulls, authenticated by its
// certificate; other registries are reached directly, through the box's
// proxy.
package pull

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"time"
)

// Open opens one tunnel stream to the console's registry.
type Open func(ctx context.Context) (net.Conn, error)

// NewClient returns the HTTP client a box pulls with. consoleHosts are the
// names images give the console's registry (host:port, and the bare host
// when the port is 443); open dials the tunnel; proxy is the box's
// outbound proxy for other registries (nil: from the environment).
func NewClient(consoleHosts []string, open Open, proxy func(*http.Request) (*url.URL, error)) *http.Client {
	if proxy == nil {
		proxy = http.ProxyFromEnvironment
	}
	direct := http.DefaultTransport.(*http.Transport).Clone()
	direct.Proxy = proxy
	tunneled := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return open(ctx) },
		// Each layer is one stream; a few stay open for the next pull.
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
		ForceAttemptHTTP2:     false,
	}
	console := map[string]bool{}
	for _, h := range consoleHosts {
		console[h] = true
	}
	return &http.Client{Transport: &router{console: console, tunneled: tunneled, direct: direct}}
}

// router sends the console's requests through the tunnel, the rest direct.
type router struct {
	console  map[string]bool
	tunneled *http.Transport
	direct   http.RoundTripper
}

func (rt *router) RoundTrip(req *http.Request) (*http.Response, error) {
	if !rt.console[req.URL.Host] {
		return rt.direct.RoundTrip(req)
	}
	// The tunnel is the encryption and the authentication: plain HTTP
	// inside it, whatever scheme the resolver chose.
	r := req.Clone(req.Context())
	r.URL.Scheme = "http"
	return rt.tunneled.RoundTrip(r)
}
