//go:build linux

package containerd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/internal/test/ctrdtest"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// BenchmarkStartWithNetwork measures what the network adds to a
// container's start: Create then Start of the same container on network
// none (runc's loopback, as without CNI) and bridge (namespace, CNI
// attach with a published port, resolv.conf and hosts), alternated in
// one run on one containerd. It reports each as ms/op and their
// difference as added-ms/op. Remove is outside the timing.
//
//	go test -run '^$' -bench BenchmarkStartWithNetwork -benchtime 20x ./agent/runtime/containerd/
func BenchmarkStartWithNetwork(b *testing.B) {
	sock := ctrdtest.Start(b)
	state := b.TempDir()
	n := newTestNetwork(b, filepath.Join(state, "network"), b.TempDir())
	resolv := filepath.Join(b.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 192.0.2.53\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	d := netDriver(b, sock, n, filepath.Join(state, "containerd"), resolv, ctrdtest.BusyboxImage(b))
	ctx := context.Background()
	port := 34000 + randByte()*10
	modes := []struct {
		network string
		ports   []*edgeboxv1.PortMapping
	}{
		{"none", nil},
		{"bridge", []*edgeboxv1.PortMapping{{Port: 80, HostPort: uint32(port)}}},
	}
	start := func(i int, network string, ports []*edgeboxv1.PortMapping) time.Duration {
		name := fmt.Sprintf("bench-%s-%d", network, i+1)
		w := &edgeboxv1.Workload{Runtime: "containerd", Image: ctrdtest.Image, Network: network, Ports: ports}
		t0 := time.Now()
		if err := d.Create(ctx, runtime.NewSpec(name, w)); err != nil {
			b.Fatal(err)
		}
		if err := d.Start(ctx, name); err != nil {
			b.Fatal(err)
		}
		took := time.Since(t0)
		b.StopTimer()
		if err := d.Remove(ctx, name); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		return took
	}
	// One of each first: the image's root filesystem is unpacked, the
	// bridge made.
	for _, m := range modes {
		start(-1, m.network, m.ports)
	}
	var took [2]time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		for j, m := range modes {
			took[j] += start(i, m.network, m.ports)
		}
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(b.N) / 1e6 }
	b.ReportMetric(ms(took[0]), "loopback-ms/op")
	b.ReportMetric(ms(took[1]), "bridge-ms/op")
	b.ReportMetric(ms(took[1]-took[0]), "added-ms/op")
}
