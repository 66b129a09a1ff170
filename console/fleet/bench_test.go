package fleet

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/console/store/storetest"
)

// BenchmarkReconnect measures what a fleet reconnecting costs the fleet's
// records: every box reports its facts at once (64 at a time, as the
// console's accept limit and the agents' backoff spread them), then the
// presence flush writes every box's last-seen time. Reported per box.
//
//	go test -run '^$' -bench Reconnect -benchtime 5x ./console/fleet/
func BenchmarkReconnect(b *testing.B) {
	for _, n := range []int{2000} {
		b.Run(fmt.Sprint(n, " boxes"), func(b *testing.B) {
			ctx := context.Background()
			s := storetest.Bolt(b)
			ids := make([]string, n)
			for i := range ids {
				ids[i] = fmt.Sprintf("bx-%06d", i)
			}
			for i := 0; i < n; i += maxTxnOps {
				var t store.Txn
				for _, id := range ids[i:min(n, i+maxTxnOps)] {
					t.Then = append(t.Then, jsonOp(BoxKey(id), Box{ID: id, TenantID: DefaultTenant, Name: id,
						Region: "east", Site: "a", State: StateApproved, EnrolledAt: time.Now(), CertNotAfter: time.Now()}))
				}
				if _, err := s.Txn(ctx, t); err != nil {
					b.Fatal(err)
				}
			}
			f, err := New(ctx, s, nil)
			if err != nil {
				b.Fatal(err)
			}
			facts := Facts{Hostname: "h", OS: "linux", Arch: "amd64", OSVersion: "12", AgentVersion: "1.0", Capability: 3, CPUs: 4, MemoryBytes: 8 << 30}
			var reports, flushes time.Duration
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				sem := make(chan struct{}, 64)
				var wg sync.WaitGroup
				for _, id := range ids {
					wg.Add(1)
					sem <- struct{}{}
					go func() {
						defer wg.Done()
						defer func() { <-sem }()
						if _, err := f.ReportFacts(ctx, id, facts, time.Now()); err != nil {
							b.Error(err)
						}
					}()
				}
				wg.Wait()
				reports += time.Since(start)
				start = time.Now()
				seen := make(map[string]time.Time, n)
				for _, id := range ids {
					seen[id] = time.Now()
				}
				if err := f.RecordSeen(ctx, seen); err != nil {
					b.Fatal(err)
				}
				flushes += time.Since(start)
			}
			b.ReportMetric(float64(reports.Microseconds())/float64(b.N*n), "report-µs/box")
			b.ReportMetric(float64(flushes.Microseconds())/float64(b.N*n), "seen-µs/box")
		})
	}
}
