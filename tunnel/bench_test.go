package tunnel

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/edgebox/edgebox/internal/test/toxic"
)

// sink reads exactly n bytes from each accepted conn, then answers one
// byte, so the sender knows everything arrived.
func sink(l net.Listener, n int64) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			// 32 KiB reads, like the writes; io.Discard alone would read 8 KiB.
			buf := make([]byte, 32<<10)
			if _, err := io.CopyBuffer(struct{ io.Writer }{io.Discard}, io.LimitReader(c, n), buf); err == nil {
				c.Write([]byte{1})
			}
		}()
	}
}

// send writes n bytes in 32 KiB writes and waits for the sink's answer.
func send(b *testing.B, c net.Conn, n int64) time.Duration {
	buf := make([]byte, writeSize)
	start := time.Now()
	for sent := int64(0); sent < n; sent += int64(len(buf)) {
		if _, err := c.Write(buf[:min(int64(len(buf)), n-sent)]); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// rawTLS serves a TLS 1.3 sink with the same certificates the tunnel uses.
func rawTLS(b *testing.B, p *testPKI, n int64) string {
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{MinVersion: tls.VersionTLS13,
		Certificates: []tls.Certificate{p.server}, ClientCAs: p.pool, ClientAuth: tls.RequireAndVerifyClientCert})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go sink(ln, n)
	return ln.Addr().String()
}

var writeSize = 32 << 10

func mbps(n int64, d time.Duration) float64 { return float64(n) * 8 / d.Seconds() / 1e6 }

// BenchmarkThroughput compares one tunnel stream with raw TLS 1.3 on
// loopback, in the same run, for 32 KiB writes (the figure we hold
// ourselves to) and 256 KiB writes (fewer yamux frames).
func BenchmarkThroughput(b *testing.B) {
	for _, size := range []int{32 << 10, 256 << 10} {
		b.Run(fmt.Sprintf("write-%dKiB", size>>10), func(b *testing.B) {
			writeSize = size
			defer func() { writeSize = 32 << 10 }()
			throughput(b)
		})
	}
}

func throughput(b *testing.B) {
	const n = 256 << 20
	p := newTestPKI(b)
	rawAddr := rawTLS(b, p, n)
	srv := startTestServer(b, p, DefaultConfig(), "")
	go sink(srv.Listen(KindForward), n)
	cli := startTestClient(b, p, "bench", srv.addr, nil)
	cert := p.leaf(b, "bench", 2)
	var rawTotal, tunTotal time.Duration
	b.SetBytes(n)
	b.ResetTimer()
	for range b.N {
		rc, err := tls.Dial("tcp", rawAddr, &tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{cert}, ServerName: "127.0.0.1"})
		if err != nil {
			b.Fatal(err)
		}
		rawTotal += send(b, rc, n)
		rc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		tc, err := cli.Open(ctx, KindForward, nil)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		tunTotal += send(b, tc, n)
		tc.Close()
	}
	raw, tun := mbps(int64(b.N)*n, rawTotal), mbps(int64(b.N)*n, tunTotal)
	b.ReportMetric(raw, "rawTLS-Mbit/s")
	b.ReportMetric(tun, "tunnel-Mbit/s")
	b.ReportMetric(tun/raw, "tunnel/raw")
}

// BenchmarkLink measures one stream over emulated long fat links (toxiproxy
// latency + bandwidth in this process) with the shipped 4 MiB stream window
// and with yamux's 256 KiB default, against raw TLS over the same link.
func BenchmarkLink(b *testing.B) {
	links := []struct {
		name      string
		kbps      int64 // toxiproxy bandwidth, KB/s
		latencyMs int   // each way
		bytes     int64
	}{
		{"4G-20Mbit-80ms", 2500, 40, 12 << 20},
		{"100Mbit-100ms", 12500, 50, 40 << 20},
	}
	for _, l := range links {
		for _, window := range []uint32{256 << 10, DefaultConfig().StreamWindow} {
			b.Run(fmt.Sprintf("%s/window-%dKiB", l.name, window>>10), func(b *testing.B) {
				p := newTestPKI(b)
				cfg := DefaultConfig()
				cfg.StreamWindow = window
				srv := startTestServer(b, p, cfg, "")
				go sink(srv.Listen(KindForward), l.bytes)
				px := toxic.New(b, srv.addr)
				shape(b, px, l.kbps, l.latencyMs)
				cli := startTestClient(b, p, "bench", px.Addr(), func(c *ClientConfig) { c.Config = cfg })
				rawAddr := rawTLS(b, p, l.bytes)
				rawPx := toxic.New(b, rawAddr)
				shape(b, rawPx, l.kbps, l.latencyMs)
				cert := p.leaf(b, "bench", 2)
				linkMbps := float64(l.kbps) * 1000 * 8 / 1e6
				var tunTotal, rawTotal time.Duration
				b.SetBytes(l.bytes)
				b.ResetTimer()
				for range b.N {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					tc, err := cli.Open(ctx, KindForward, nil)
					cancel()
					if err != nil {
						b.Fatal(err)
					}
					tunTotal += send(b, tc, l.bytes)
					tc.Close()
					rc, err := tls.Dial("tcp", rawPx.Addr(), &tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{cert}, ServerName: "127.0.0.1"})
					if err != nil {
						b.Fatal(err)
					}
					rawTotal += send(b, rc, l.bytes)
					rc.Close()
				}
				tun, raw := mbps(int64(b.N)*l.bytes, tunTotal), mbps(int64(b.N)*l.bytes, rawTotal)
				b.ReportMetric(tun, "tunnel-Mbit/s")
				b.ReportMetric(raw, "rawTLS-Mbit/s")
				b.ReportMetric(tun/linkMbps, "of-link")
				b.ReportMetric(tun/raw, "tunnel/raw")
			})
		}
	}
}

func shape(b *testing.B, px *toxic.Proxy, kbps int64, latencyMs int) {
	for _, dir := range []string{"upstream", "downstream"} {
		if err := px.Add("lat-"+dir, "latency", dir, fmt.Sprintf(`"latency":%d`, latencyMs)); err != nil {
			b.Fatal(err)
		}
		if err := px.Add("bw-"+dir, "bandwidth", dir, fmt.Sprintf(`"rate":%d`, kbps)); err != nil {
			b.Fatal(err)
		}
	}
}
