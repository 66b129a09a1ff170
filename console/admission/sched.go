package admission

import (
	"math"
	rtmetrics "runtime/metrics"
	"time"
)

// schedLatency reads, window by window, how long the Go scheduler kept
// runnable goroutines waiting for a thread to run on
// (/sched/latencies:seconds): how far behind its CPU the console is, which
// every caller waits alike, an operator's API call among the box
// sessions.
type schedLatency struct {
	sample []rtmetrics.Sample
	last   []uint64 // the histogram's counts at the previous read
}

const schedMetric = "/sched/latencies:seconds"

func newSchedLatency() *schedLatency {
	s := &schedLatency{sample: []rtmetrics.Sample{{Name: schedMetric}}}
	s.read() // the counts so far are no window's
	return s
}

// read returns the counts added since the last read, and the buckets.
func (s *schedLatency) read() ([]uint64, []float64) {
	rtmetrics.Read(s.sample)
	if s.sample[0].Value.Kind() != rtmetrics.KindFloat64Histogram {
		return nil, nil // a runtime without the metric
	}
	h := s.sample[0].Value.Float64Histogram()
	delta := make([]uint64, len(h.Counts))
	for i, n := range h.Counts {
		if i < len(s.last) {
			delta[i] = n - s.last[i]
		} else {
			delta[i] = n
		}
	}
	s.last = append(s.last[:0], h.Counts...)
	return delta, h.Buckets
}

// quantile returns the latency q of the goroutines scheduled since the
// last call waited at most (a bucket's upper bound), and false when none
// was.
func (s *schedLatency) quantile(q float64) (time.Duration, bool) {
	counts, buckets := s.read()
	return histogramQuantile(counts, buckets, q)
}

// histogramQuantile is the upper bound of the bucket holding quantile q
// of counts; buckets[i] and buckets[i+1] bound counts[i].
func histogramQuantile(counts []uint64, buckets []float64, q float64) (time.Duration, bool) {
	var total uint64
	for _, n := range counts {
		total += n
	}
	if total == 0 || len(buckets) != len(counts)+1 {
		return 0, false
	}
	want := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	for i, n := range counts {
		seen += n
		if seen >= want {
			hi := buckets[i+1]
			if math.IsInf(hi, 1) {
				hi = buckets[i]
			}
			return time.Duration(hi * float64(time.Second)), true
		}
	}
	return time.Duration(buckets[len(buckets)-1] * float64(time.Second)), true
}
