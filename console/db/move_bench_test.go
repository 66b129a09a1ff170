package db

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/fleet"
)

// BenchmarkMoveToStore measures the first start of an upgraded console:
// how long moving an older console's records onto the store takes.
//
//	go test -run '^$' -bench MoveToStore -benchtime 1x ./console/db/
func BenchmarkMoveToStore(b *testing.B) {
	for _, size := range []struct{ boxes, entries int }{{2000, 100_000}} {
		b.Run(fmt.Sprintf("%d boxes, %d audit entries", size.boxes, size.entries), func(b *testing.B) {
			at := time.Date(2026, 2, 1, 10, 0, 0, 0, time.UTC)
			var o oldConsole
			for i := range size.boxes {
				o.boxes = append(o.boxes, fleet.Box{ID: fmt.Sprintf("bx-%06d", i), TenantID: "default", Name: fmt.Sprint(i),
					Region: "east", Site: "a", State: fleet.StateApproved, EnrolledAt: at})
			}
			for i := range size.entries {
				o.audit = append(o.audit, audit.Entry{Seq: uint64(i + 1), Time: at.Add(time.Duration(i) * time.Second),
					TenantID: "default", Actor: "admin", Action: "box.label", Target: "bx-000001", Result: "ok", Detail: "bank=icbc"})
			}
			var took time.Duration
			for range b.N {
				b.StopTimer()
				bdb, st := open(b, o)
				b.StartTimer()
				start := time.Now()
				if err := MoveToStore(context.Background(), bdb, st); err != nil {
					b.Fatal(err)
				}
				took += time.Since(start)
			}
			b.ReportMetric(took.Seconds()/float64(b.N), "s/move")
			b.ReportMetric(float64(size.boxes+size.entries)*float64(b.N)/took.Seconds(), "records/s")
		})
	}
}
