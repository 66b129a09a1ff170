package bench

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/rolloutsim"
)

// BenchmarkRollout moves 1,000 simulated boxes (10 regions of 5 sites;
// the real console and agents with the fake runtime, in this process)
// from release 1 to 2 with zero-length gates, waves 1, 10 %, 50 %, 100 %
// of each region and 5 boxes of a site at once, and reports how long it
// took and what the process (console and agents) used meanwhile.
// EDGEBOX_BENCH_ROLLOUT_BOXES sets the fleet (a multiple of 50).
//
//	go test -run '^$' -bench Rollout -benchtime 1x ./internal/test/bench/
func BenchmarkRollout(b *testing.B) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("EDGEBOX_BENCH_ROLLOUT_BOXES")); err == nil && v >= 50 {
		n = v
	}
	for range b.N {
		res := rolloutsim.Run(b, rolloutsim.Config{Regions: 10, SitesPerRegion: 5, BoxesPerSite: n / 50, Timeout: 10 * time.Minute,
			Rollout: api.RolloutRequest{Gate: "0s", BoxTimeout: "2m", MaxUnavailable: 5}})
		r := res.Rollout
		if r.State != "done" || r.Progress.Done != n {
			b.Fatalf("rollout %s (%s): %d of %d done", r.State, r.Reason, r.Progress.Done, n)
		}
		b.ReportMetric(res.Took.Seconds(), "s-all-on-B")
		b.ReportMetric(float64(n)/res.Took.Seconds(), "boxes/s")
		b.ReportMetric(res.CPU.Seconds(), "cpu-s")
		b.ReportMetric(float64(res.HeapPeak)/(1<<20), "heap-MiB")
		b.Logf("%d boxes from 1 to 2 in %s: %.0f boxes/s; the process (console and %d agents) used %.1f s of CPU, heap at most %.0f MiB",
			n, res.Took.Round(time.Millisecond), float64(n)/res.Took.Seconds(), n, res.CPU.Seconds(), float64(res.HeapPeak)/(1<<20))
	}
}
