package boxsync

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// maxPending bounds the times a stream keeps of revisions its box has not
// acknowledged yet. Past it, the newest time stands for every revision
// after it too, so a box that falls far behind reads as older, never as
// newer, than it is.
const maxPending = 8

// lag is how far one connected box is behind its desired state, as the
// server saw it: the box's revision (from the hub's watch and from each
// catch-up's read) and the revision it acknowledged. It has a mutex of its
// own, so a scrape never waits for a push to a slow box.
type lag struct {
	mu    sync.Mutex // guards the fields below
	head  uint64     // the box's revision, as far as the server knows
	acked uint64     // the revision the box acknowledged last
	// pending are the revisions after acked, each with when the server
	// first knew of it, oldest first; the revisions between two entries
	// count from the later one's time.
	pending []seenRev
}

type seenRev struct {
	rev uint64
	at  time.Time
}

// moved records that the box's revision is rev, known at now.
func (l *lag) moved(rev uint64, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rev <= l.head {
		return
	}
	l.head = rev
	if rev <= l.acked {
		return
	}
	if n := len(l.pending); n == maxPending {
		l.pending[n-1].rev = rev // keeps its time: counted as older
		return
	}
	l.pending = append(l.pending, seenRev{rev, now})
}

// ack records that the box stored everything up to rev.
func (l *lag) ack(rev uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rev <= l.acked {
		return
	}
	l.acked = rev
	l.head = max(l.head, rev)
	i := 0
	for i < len(l.pending) && l.pending[i].rev <= rev {
		i++
	}
	l.pending = append(l.pending[:0], l.pending[i:]...)
}

// behind returns how many revisions the box is behind and how long ago
// the server first knew of the oldest it has not acknowledged; 0 and 0
// when it is caught up.
func (l *lag) behind(now time.Time) (uint64, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.acked >= l.head || len(l.pending) == 0 {
		return 0, 0
	}
	return l.head - l.acked, max(now.Sub(l.pending[0].at), 0)
}

// Buckets of the lag histograms: revisions behind, and seconds since the
// oldest change a box has not acknowledged. 0 holds the boxes caught up.
var (
	lagRevisionBuckets = []float64{0, 1, 2, 5, 10, 25, 50, 100}
	lagSecondBuckets   = []float64{0, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600}
)

var (
	lagRevisionsDesc = prometheus.NewDesc("edgebox_sync_lag_revisions",
		"Connected boxes by how many revisions of their desired state they have not acknowledged; counted afresh at each scrape (a snapshot: use it without rate()).", nil, nil)
	lagSecondsDesc = prometheus.NewDesc("edgebox_sync_lag_seconds",
		"Connected boxes by the age of the oldest change to their desired state they have not acknowledged (from when the console made it, or from when the box's stream began for changes made while it was away); counted afresh at each scrape (a snapshot: use it without rate()).", nil, nil)
	lagMaxDesc = prometheus.NewDesc("edgebox_sync_lag_max_seconds",
		"The age of the oldest change to a connected box's desired state that the box has not acknowledged; 0 when every connected box is caught up.", nil, nil)
)

// Metrics are the connected boxes' sync lag, counted at each scrape from
// what the server holds of each open stream: no store reads, a lock of
// each stream's lag in turn (10,000 boxes: 1.5 to 2.2 ms of one core,
// BenchmarkSyncLagScrape). Boxes without an open stream are not counted.
func (s *Server) Metrics() prometheus.Collector { return lagCollector{s} }

type lagCollector struct{ s *Server }

func (c lagCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- lagRevisionsDesc
	ch <- lagSecondsDesc
	ch <- lagMaxDesc
}

func (c lagCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.s.now()
	revs, secs := newSnapshot(lagRevisionBuckets), newSnapshot(lagSecondBuckets)
	var oldest time.Duration
	for _, sc := range c.s.open() {
		n, age := sc.lag.behind(now)
		revs.add(float64(n))
		secs.add(age.Seconds())
		oldest = max(oldest, age)
	}
	ch <- prometheus.MustNewConstHistogram(lagRevisionsDesc, revs.count, revs.sum, revs.buckets())
	ch <- prometheus.MustNewConstHistogram(lagSecondsDesc, secs.count, secs.sum, secs.buckets())
	ch <- prometheus.MustNewConstMetric(lagMaxDesc, prometheus.GaugeValue, oldest.Seconds())
}

// snapshot is a histogram counted from nothing, for one scrape.
type snapshot struct {
	bounds []float64
	counts []uint64 // of each bucket alone; the last is above every bound
	count  uint64
	sum    float64
}

func newSnapshot(bounds []float64) *snapshot {
	return &snapshot{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func (h *snapshot) add(v float64) {
	h.count++
	h.sum += v
	i, _ := slices.BinarySearch(h.bounds, v) // the first bound >= v
	h.counts[i]++
}

// buckets are the cumulative counts, as Prometheus has them.
func (h *snapshot) buckets() map[float64]uint64 {
	out := make(map[float64]uint64, len(h.bounds))
	var n uint64
	for i, b := range h.bounds {
		n += h.counts[i]
		out[b] = n
	}
	return out
}
