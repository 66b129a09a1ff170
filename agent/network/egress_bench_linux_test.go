package network

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"
)

// BenchmarkEgressApply is what a policy adds to a workload's start: one
// Apply of a policy with 8 prefixes, and one Refused, on a box (a
// namespace of its own) where `others` workloads already have policies.
func BenchmarkEgressApply(b *testing.B) {
	needPlugins(b)
	for _, others := range []int{0, 100} {
		b.Run(fmt.Sprintf("others=%d", others), func(b *testing.B) {
			ctx := context.Background()
			box := newNetns(b, b.TempDir(), "bench")
			p, err := NewPolicies(EgressConfig{Chain: "EDGEBOX-EGRESS", Bridge: "edgebox0", Period: time.Hour, ResolveTimeout: time.Second},
				slog.New(slog.DiscardHandler))
			if err != nil {
				b.Fatal(err)
			}
			var e Egress
			for i := range 8 {
				e.Prefixes = append(e.Prefixes, netip.MustParsePrefix(fmt.Sprintf("192.0.2.%d/32", i+1)))
			}
			src := func(i int) Source {
				return Source{netip.AddrFrom4([4]byte{10, 234, byte(i / 250), byte(i%250 + 2)}), fmt.Sprintf("veth%d", i)}
			}
			err = InNetns(box, func() error {
				for i := range others {
					if err := p.Apply(ctx, fmt.Sprintf("other-%d", i), src(i), e); err != nil {
						return err
					}
				}
				var apply, refused time.Duration
				for b.Loop() {
					t0 := time.Now()
					if err := p.Apply(ctx, "bench", src(others), e); err != nil {
						return err
					}
					t1 := time.Now()
					if _, err := p.Refused(ctx, "bench"); err != nil {
						return err
					}
					apply += t1.Sub(t0)
					refused += time.Since(t1)
				}
				b.ReportMetric(float64(apply.Microseconds())/1000/float64(b.N), "apply-ms/op")
				b.ReportMetric(float64(refused.Microseconds())/1000/float64(b.N), "refused-ms/op")
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkEgressThroughput sends from a workload through the bridge and
// NAT to a server in the "internet" namespace with no policy, then under
// a policy that allows the server among 64 prefixes, with 100 other
// workloads' policies on the box, in the same run: compare the two MB/s
// figures.
func BenchmarkEgressThroughput(b *testing.B) {
	n := newTestNet(b)
	inet, _, server := peer(b, "ebb", n.seq)
	var l net.Listener
	if err := InNetns(inet, func() (err error) { l, err = net.Listen("tcp", server.String()+":9000"); return err }); err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.Copy(io.Discard, c)
			c.Close()
		}
	}()
	b.Cleanup(func() { l.Close(); <-done })
	ctx := context.Background()
	id := "bench-" + n.cfg.Bridge
	ns, err := CreateNetns(n.cfg.NetnsDir, id)
	if err != nil {
		b.Fatal(err)
	}
	res, err := n.Attach(ctx, id, ns, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { n.Detach(ctx, id, ns, nil); RemoveNetns(ns) })
	p, err := NewPolicies(EgressConfig{Chain: "EBB" + n.cfg.Bridge[3:], Bridge: n.cfg.Bridge, Period: time.Hour, ResolveTimeout: time.Second}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Sweep(ctx, func(string) bool { return false }) })

	chunk := make([]byte, 1<<20)
	send := func(b *testing.B) {
		var c net.Conn
		if err := InNetns(ns, func() (err error) {
			c, err = net.DialTimeout("tcp", server.String()+":9000", 10*time.Second)
			return err
		}); err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		b.SetBytes(int64(len(chunk)))
		b.ResetTimer()
		for range b.N {
			if _, err := c.Write(chunk); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("no-policy", send)
	var e Egress
	for i := range 63 {
		e.Prefixes = append(e.Prefixes, netip.MustParsePrefix(fmt.Sprintf("192.0.2.%d/32", i+1)))
	}
	e.Prefixes = append(e.Prefixes, netip.PrefixFrom(server, 32))
	for i := range 100 {
		other := Source{Addr: netip.AddrFrom4([4]byte{10, 236, byte(i), 2})}
		if err := p.Apply(ctx, fmt.Sprintf("other-%d", i), other, e); err != nil {
			b.Fatal(err)
		}
	}
	if err := p.Apply(ctx, id, Source{res.IP, res.HostInterface}, e); err != nil {
		b.Fatal(err)
	}
	b.Run("policy", send)
}
