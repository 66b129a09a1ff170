package qemu_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/qemu"
	"github.com/edgebox/edgebox/internal/test/vmtest"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// BenchmarkStartNetwork is what a VM's network adds to its start: Start
// of a VM held before its guest runs (-S), on each network, the same
// run. It reports start-ms (Start alone) and remove-ms (Remove, which
// detaches a bridged VM).
//
//	go test -run XXX -bench StartNetwork -benchtime 20x ./agent/runtime/qemu/
func BenchmarkStartNetwork(b *testing.B) {
	vmtest.RequireNet(b)
	for _, mode := range []string{"none", "user", "bridge"} {
		b.Run(mode, func(b *testing.B) {
			var cfg qemu.Config
			if mode == "bridge" {
				cfg.Network = newBridgeNet(b).Network
			}
			ref, pull := guestRegistry(b)
			dir, err := os.MkdirTemp("", "q")
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { os.RemoveAll(dir) })
			cfg.StateDir, cfg.Accel, cfg.ExtraArgs = dir, "tcg", []string{"-S"}
			d, err := qemu.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			pull(d)
			ctx := context.Background()
			var start, remove time.Duration
			b.ResetTimer()
			for i := range b.N {
				name := fmt.Sprintf("bench%d", i)
				if err := d.Create(ctx, runtime.NewSpec(name, &edgeboxv1.Workload{Runtime: "qemu", Image: ref, Network: mode})); err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				if err := d.Start(ctx, name); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := d.Remove(ctx, name); err != nil {
					b.Fatal(err)
				}
				start, remove = start+t1.Sub(t0), remove+time.Since(t1)
			}
			b.ReportMetric(float64(start.Milliseconds())/float64(b.N), "start-ms")
			b.ReportMetric(float64(remove.Milliseconds())/float64(b.N), "remove-ms")
		})
	}
}
