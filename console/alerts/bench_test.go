package alerts

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/keys"
	"github.com/edgebox/edgebox/console/rollout"
	"github.com/edgebox/edgebox/console/sitehealth"
	"github.com/edgebox/edgebox/console/store/storetest"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// BenchmarkEvaluate is one round of a tenant of 10,000 boxes
// (EDGEBOX_BENCH_BOXES) with every rule but the keys', each box's
// workload statuses read from the store as the console reads them: 1 %
// of the boxes offline, 1 % with a workload failing. It reports the
// round's time; the console runs one a tenant every 30 s.
func BenchmarkEvaluate(b *testing.B) {
	n := 10_000
	if v, err := strconv.Atoi(os.Getenv("EDGEBOX_BENCH_BOXES")); err == nil && v >= 100 {
		n = v / 100 * 100
	}
	ctx := context.Background()
	st := storetest.Bolt(b)
	ds := desired.New(st)
	boxes := make([]fleet.Box, n)
	for i := range boxes {
		id := fmt.Sprintf("bx-%06d", i)
		boxes[i] = fleet.Box{ID: id, TenantID: "bank1", Name: fmt.Sprintf("teller-%05d", i), Region: "east",
			Site: fmt.Sprintf("branch-%d", i/5), State: fleet.StateApproved, CertNotAfter: time.Now().Add(90 * 24 * time.Hour)}
		s := &edgeboxv1.ObjectStatus{Kind: edgeboxv1.KindWorkload, Name: "robot", Phase: edgeboxv1.PhaseRunning, Release: "1"}
		if i%100 == 1 {
			s.Health = edgeboxv1.Unhealthy
		}
		if err := ds.ReportStatus(ctx, id, &edgeboxv1.SyncStatus{Objects: []*edgeboxv1.ObjectStatus{s}, Full: true}); err != nil {
			b.Fatal(err)
		}
	}
	s, err := New(Config{Store: st, Tenants: func(context.Context) ([]string, error) { return []string{"bank1"}, nil },
		Facts: Facts{
			Boxes: func(context.Context, string) ([]fleet.Box, error) { return boxes, nil },
			Health: func(_ context.Context, b fleet.Box) (sitehealth.State, string) {
				if strings.HasSuffix(b.ID, "00") {
					return sitehealth.DisconnectedRunning, "4 of the 5 boxes of its site hear it"
				}
				return sitehealth.Online, ""
			},
			Keys:     func(context.Context, string) ([]keys.Key, error) { return nil, nil },
			Statuses: ds.Statuses,
			Rollouts: func(context.Context, string) ([]rollout.Rollout, error) { return nil, nil },
		},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.SetRules(ctx, admin, Rules{Rules: []Rule{{Kind: BoxOffline}, {Kind: BoxDown}, {Kind: WorkloadUnhealthy},
		{Kind: CertExpiry}, {Kind: RolloutStopped}}}); err != nil {
		b.Fatal(err)
	}
	if err := s.Evaluate(ctx); err != nil { // opens the incidents
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if err := s.Evaluate(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	open, err := s.Open(ctx, "bank1")
	if err != nil || len(open) != 2*n/100 {
		b.Fatalf("%d incidents open (%v), want %d", len(open), err, 2*n/100)
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/round")
}
