package sitepeer

import (
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// counted counts the datagrams and bytes a connection writes.
type counted struct {
	net.Conn
	datagrams, bytes *atomic.Int64
}

func (c counted) Write(p []byte) (int, error) {
	c.datagrams.Add(1)
	c.bytes.Add(int64(len(p)))
	return c.Conn.Write(p)
}

// BenchmarkProbeBandwidth is what a box of a site of 10 sends its peers:
// the handshakes of its associations once, then each period a heartbeat
// to each of the 9 others. Reported per box: bytes a period in UDP
// payloads, and the kbit/s at the default 10 s period with UDP and IPv4
// headers (28 bytes a datagram) counted.
func BenchmarkProbeBandwidth(b *testing.B) {
	const n, period = 10, 500 * time.Millisecond
	c := newCA(b)
	var datagrams, bytes atomic.Int64
	wrap := func(conn net.Conn) net.Conn { return counted{conn, &datagrams, &bytes} }
	port := freePort(b)
	var all []*box
	for i := range n {
		x := startBoxPeriod(b, c, "bx-"+string(rune('a'+i)), "127.0.0.1"+string(rune('0'+i)), port, period, wrap)
		all = append(all, x)
	}
	for _, x := range all {
		x.p.SetPeers(site(all...))
	}
	heardAll := func() bool {
		for _, x := range all {
			for _, s := range x.p.Seen() {
				if !s.Alive {
					return false
				}
			}
		}
		return true
	}
	deadline := time.Now().Add(20 * time.Second)
	for !heardAll() {
		if time.Now().After(deadline) {
			b.Fatal("the site did not hear itself within 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	hsDatagrams, hsBytes := datagrams.Load(), bytes.Load()
	b.ResetTimer()
	periods := max(b.N, 10)
	datagrams.Store(0)
	bytes.Store(0)
	start := time.Now()
	time.Sleep(time.Duration(periods) * period)
	took := float64(time.Since(start)) / float64(period) // periods that passed
	perBoxBytes := float64(bytes.Load()) / n / took
	perBoxDatagrams := float64(datagrams.Load()) / n / took
	b.ReportMetric(float64(hsBytes)/n, "handshake_B/box")
	b.ReportMetric(float64(hsDatagrams)/n, "handshake_datagrams/box")
	b.ReportMetric(perBoxBytes, "B/box/period")
	b.ReportMetric(perBoxDatagrams, "datagrams/box/period")
	b.ReportMetric((perBoxBytes+28*perBoxDatagrams)*8/10/1000, "kbit/s/box@10s")
}
