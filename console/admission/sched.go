package admission

import (
	"math"
	rtmetrics "runtime/metrics"
	"time"
)

// schedLatency reads the Go scheduler's latency histogram (how long
// goroutines waited in the run queue) and tells the 99th percentile of
// what was added to it since its last reading.
type schedLatency struct {
	sample []rtmetrics.Sample
	last   []uint64
}

const schedMetric = "/sched/latencies:seconds"

func newSchedLatency() *schedLatency {
	return &schedLatency{sample: []rtmetrics.Sample{{Name: schedMetric}}}
}

// p99 returns the 99th percentile since the last call, 0 when nothing was
// scheduled or the runtime does not keep the histogram. Not safe for
// concurrent use: Run's loop is its one caller.
func (s *schedLatency) p99() time.Duration {
	rtmetrics.Read(s.sample)
	if s.sample[0].Value.Kind() != rtmetrics.KindFloat64Histogram {
		return 0
	}
	h := s.sample[0].Value.Float64Histogram()
	if len(s.last) != len(h.Counts) {
		s.last = make([]uint64, len(h.Counts))
	}
	d := percentile(h.Counts, s.last, h.Buckets, 0.99)
	copy(s.last, h.Counts)
	return d
}

// percentile returns the q-quantile of the counts added since last, as
// the upper bound of its bucket (buckets has one more bound than counts;
// an infinite upper bound reads as its lower one).
func percentile(counts, last []uint64, buckets []float64, q float64) time.Duration {
	var total uint64
	for i, n := range counts {
		total += n - last[i]
	}
	if total == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	for i, n := range counts {
		seen += n - last[i]
		if seen >= want {
			hi := buckets[i+1]
			if math.IsInf(hi, 1) {
				hi = buckets[i]
			}
			return time.Duration(hi * float64(time.Second))
		}
	}
	return 0
}
