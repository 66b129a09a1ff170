package network

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// BenchmarkAttachDetach is what networking adds to a container's start
// (attach-ms/op: namespace and Attach) and removal (detach-ms/op: Detach
// and the namespace's removal), with one published port.
func BenchmarkAttachDetach(b *testing.B) {
	n := newTestNet(b)
	ctx := context.Background()
	ports := []Port{{HostPort: 24000 + int(n.seq), ContainerPort: 80}}
	var attach, detach time.Duration
	b.ResetTimer()
	for i := range b.N {
		id := fmt.Sprintf("bench-%d", i)
		t0 := time.Now()
		ns, err := CreateNetns(n.cfg.NetnsDir, id)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := n.Attach(ctx, id, ns, ports); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := n.Detach(ctx, id, ns, ports); err != nil {
			b.Fatal(err)
		}
		if err := RemoveNetns(ns); err != nil {
			b.Fatal(err)
		}
		attach += t1.Sub(t0)
		detach += time.Since(t1)
	}
	b.ReportMetric(float64(attach.Milliseconds())/float64(b.N), "attach-ms/op")
	b.ReportMetric(float64(detach.Milliseconds())/float64(b.N), "detach-ms/op")
}

// BenchmarkThroughput sends to a server in the "internet" namespace from
// the box itself (host) and from a workload through the bridge and NAT
// (workload), in the same run: compare the two MB/s figures.
func BenchmarkThroughput(b *testing.B) {
	n := newTestNet(b)
	inet, _, server := peer(b, "ebi", n.seq)
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
	id := "bench-" + n.cfg.Bridge
	ns, err := CreateNetns(n.cfg.NetnsDir, id)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := n.Attach(context.Background(), id, ns, nil); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { n.Detach(context.Background(), id, ns, nil); RemoveNetns(ns) })

	chunk := make([]byte, 1<<20)
	send := func(b *testing.B, dial func() (net.Conn, error)) {
		c, err := dial()
		if err != nil {
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
	addr := server.String() + ":9000"
	b.Run("host", func(b *testing.B) {
		send(b, func() (net.Conn, error) { return net.DialTimeout("tcp", addr, 10*time.Second) })
	})
	b.Run("workload", func(b *testing.B) {
		send(b, func() (conn net.Conn, err error) {
			err = InNetns(ns, func() error { conn, err = net.DialTimeout("tcp", addr, 10*time.Second); return err })
			return conn, err
		})
	})
}
