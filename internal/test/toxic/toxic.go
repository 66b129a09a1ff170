// Package toxic runs a toxiproxy proxy in process so tests can put a bad
// network (latency, bandwidth limits, resets, blackholes) between a box
// and its console. Only loopback addresses are ever used.
package toxic

import (
	"context"
	"fmt"
	"strings"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Proxy forwards a loopback port to an upstream address through toxics.
type Proxy struct {
	p    *toxiproxy.Proxy
	addr string // where it listens, read once: Heal rewrites the proxy's own
}

// New starts a proxy to upstream on a free loopback port; it stops when the
// test ends.
func New(t testing.TB, upstream string) *Proxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, t.Name(), "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("toxiproxy: %v", err)
	}
	t.Cleanup(p.Stop)
	return &Proxy{p: p, addr: p.Listen}
}

// Addr is where clients connect.
func (p *Proxy) Addr() string { return p.addr }

// Add adds a toxic: kind is a toxiproxy toxic type ("latency",
// "bandwidth", "timeout", "reset_peer", "slicer", "limit_data"), stream
// "upstream" or "downstream", attributes as JSON object members, for
// example `"latency": 40`.
func (p *Proxy) Add(name, kind, stream, attributes string) error {
	body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":{%s}}`, name, kind, stream, attributes)
	_, err := p.p.Toxics.AddToxicJson(strings.NewReader(body))
	return err
}

// Remove removes a toxic by name.
func (p *Proxy) Remove(name string) error {
	return p.p.Toxics.RemoveToxic(context.Background(), name)
}

// Cut drops every connection through the proxy and takes no new one
// until Heal: the link is down.
func (p *Proxy) Cut() { p.p.Stop() }

// Heal takes connections again, on the same address.
func (p *Proxy) Heal() error { return p.p.Start() }
