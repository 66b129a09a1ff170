package boxsync

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/store/storetest"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

func TestLagCountsFromTheOldestUnacknowledgedChange(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	tests := []struct {
		name     string
		moves    []uint64 // revision i+1 known at second i+1 unless listed
		acks     []uint64
		now      int
		wantRevs uint64
		wantAge  time.Duration
	}{
		{"caught up", []uint64{1, 2}, []uint64{2}, 60, 0, 0},
		{"one behind", []uint64{1}, nil, 60, 1, 59 * time.Second},
		{"acknowledged part way", []uint64{1, 2, 3}, []uint64{1}, 60, 2, 58 * time.Second},
		{"an old ack changes nothing", []uint64{1, 2, 3}, []uint64{2, 1}, 60, 1, 57 * time.Second},
		{"an ack past what was seen", []uint64{1}, []uint64{4}, 60, 0, 0},
		// Past maxPending, the last kept time stands for the revisions
		// after it: the box reads as older than it is, never newer.
		{"many behind", []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, []uint64{9}, 60, 3, 52 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var l lag
			for _, rev := range tt.moves {
				l.moved(rev, at(int(rev)))
			}
			for _, rev := range tt.acks {
				l.ack(rev)
			}
			revs, age := l.behind(at(tt.now))
			if revs != tt.wantRevs || age != tt.wantAge {
				t.Errorf("behind %d revisions for %s, want %d for %s", revs, age, tt.wantRevs, tt.wantAge)
			}
		})
	}
}

// lagMetrics is what one scrape of a Server's Metrics says.
type lagMetrics struct {
	revisions, seconds *dto.Histogram
	max                float64
}

func scrapeLag(t *testing.T, reg *prometheus.Registry) lagMetrics {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var m lagMetrics
	for _, mf := range mfs {
		if len(mf.GetMetric()) != 1 {
			t.Fatalf("%s has %d series, want 1", mf.GetName(), len(mf.GetMetric()))
		}
		switch x := mf.GetMetric()[0]; mf.GetName() {
		case "edgebox_sync_lag_revisions":
			m.revisions = x.GetHistogram()
		case "edgebox_sync_lag_seconds":
			m.seconds = x.GetHistogram()
		case "edgebox_sync_lag_max_seconds":
			m.max = x.GetGauge().GetValue()
		}
	}
	if m.revisions == nil || m.seconds == nil {
		t.Fatalf("the scrape lacks the lag histograms: %v", mfs)
	}
	return m
}

// bucket is the cumulative count of h's bucket le.
func bucket(t *testing.T, h *dto.Histogram, le float64) uint64 {
	t.Helper()
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() == le {
			return b.GetCumulativeCount()
		}
	}
	t.Fatalf("no bucket le=%g", le)
	return 0
}

// TestSyncLagMetrics: the connected boxes' lag follows the desired state
// as the store commits it (the hub's watch) and the boxes' acks, on the
// server's clock; a box with no stream open is not counted.
func TestSyncLagMetrics(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	approved := func(context.Context, string) (bool, error) { return true, nil }
	s := New(Config{Desired: desired.New(storetest.Bolt(t)), Approved: approved, Now: clock,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s.Metrics())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The hub follows the desired state, as Run has it.
	w := s.hub.watch(ctx)
	hubDone := make(chan struct{})
	go func() { defer close(hubDone); s.hub.run(ctx, w) }()
	defer func() { cancel(); <-hubDone }()

	m := scrapeLag(t, reg)
	if m.revisions.GetSampleCount() != 0 || m.max != 0 {
		t.Fatalf("no box connected: %d counted, oldest %gs", m.revisions.GetSampleCount(), m.max)
	}
	// b1 and b2 open their streams with nothing stored, and nothing to
	// catch up: their streams begin without a write.
	for _, box := range []string{"b1", "b2"} {
		sc := &syncConn{box: box}
		s.mu.Lock()
		s.boxes[box] = sc
		s.mu.Unlock()
		if err := s.begin(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	waitLag := func(what string, ok func(lagMetrics) bool) lagMetrics {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			m := scrapeLag(t, reg)
			if ok(m) {
				return m
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d boxes counted, %g revisions behind, oldest %gs", what,
					m.revisions.GetSampleCount(), m.revisions.GetSampleSum(), m.max)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	put := func(box, name string) {
		t.Helper()
		if _, err := s.desired.Put(ctx, box, workloadObj(name)); err != nil {
			t.Fatal(err)
		}
	}
	put("b1", "w1") // revision 1
	waitLag("b1's first change", func(m lagMetrics) bool { return m.revisions.GetSampleSum() == 1 })
	advance(10 * time.Second)
	put("b1", "w2") // revision 2, ten seconds later
	put("b3", "w1") // b3 has no stream open
	waitLag("b1's second change", func(m lagMetrics) bool { return m.revisions.GetSampleSum() == 2 })
	advance(20 * time.Second)

	m = scrapeLag(t, reg)
	if got := m.revisions.GetSampleCount(); got != 2 {
		t.Errorf("%d boxes counted, want b1 and b2", got)
	}
	if got := bucket(t, m.revisions, 0); got != 1 {
		t.Errorf("%d boxes caught up, want b2 alone", got)
	}
	if got := bucket(t, m.revisions, 1); got != 1 {
		t.Errorf("%d boxes at most one revision behind, want b2 alone", got)
	}
	if got := bucket(t, m.seconds, 30); got != 2 || bucket(t, m.seconds, 15) != 1 {
		t.Errorf("%d boxes within 30s and %d within 15s, want 2 and 1", got, bucket(t, m.seconds, 15))
	}
	if m.max != 30 || m.seconds.GetSampleSum() != 30 {
		t.Errorf("oldest unacknowledged change %gs (sum %gs), want 30s: b1's first change", m.max, m.seconds.GetSampleSum())
	}

	// b1 acknowledges its first change: its oldest is the second, 20s old.
	ack := func(rev uint64) {
		t.Helper()
		if err := s.handleUp(ctx, "b1", &edgeboxv1.SyncUp{Msg: &edgeboxv1.SyncUp_Ack{Ack: &edgeboxv1.SyncAck{Revision: rev}}}); err != nil {
			t.Fatal(err)
		}
	}
	ack(1)
	if m = scrapeLag(t, reg); m.max != 20 || m.revisions.GetSampleSum() != 1 {
		t.Errorf("after b1's first ack: %g revisions behind, oldest %gs; want 1 and 20s", m.revisions.GetSampleSum(), m.max)
	}
	ack(2)
	if m = scrapeLag(t, reg); m.max != 0 || m.revisions.GetSampleSum() != 0 || bucket(t, m.revisions, 0) != 2 {
		t.Errorf("after b1's last ack: %g revisions behind, oldest %gs; want both boxes caught up", m.revisions.GetSampleSum(), m.max)
	}
}

// BenchmarkSyncLagScrape is one scrape of the lag metrics of 10,000
// connected boxes, a third of them behind.
func BenchmarkSyncLagScrape(b *testing.B) {
	s, _ := newSyncer(b)
	now := time.Now()
	for i := range 10000 {
		sc := &syncConn{box: fmt.Sprintf("b%d", i)}
		sc.lag.moved(uint64(i%3), now)
		s.boxes[sc.box] = sc
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Metrics())
	b.ResetTimer()
	for range b.N {
		if _, err := reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}
