package rollout

import (
	"github.com/prometheus/client_golang/prometheus"
)

// phases and states are every box phase and rollout state, in the order
// the metrics give them.
var (
	phases = []Phase{Waiting, Held, Updating, Gating, Done, Failed}
	states = []State{AwaitingApproval, Running, Paused, Stopped, Aborted, Finished}
)

// progress is where one rollout stands, as the metrics tell it.
type progress struct {
	tenant, id, app string
	state           State
	boxes           map[Phase]int
}

func progressOf(r Rollout) progress {
	p := progress{tenant: r.TenantID, id: r.ID, app: r.App, state: r.State, boxes: make(map[Phase]int, len(phases))}
	if r.Machine != nil {
		for _, g := range r.Machine.Regions {
			for _, b := range g.Boxes {
				p.boxes[b.Phase]++
			}
		}
	}
	return p
}

var (
	rolloutsDesc = prometheus.NewDesc("edgebox_rollouts",
		"Rollouts the controller has work for, by state (awaiting-approval, running, paused; stopped, aborted and done until its next look), every state given.",
		[]string{"state"}, nil)
	rolloutBoxesDesc = prometheus.NewDesc("edgebox_rollout_boxes",
		"Boxes of each rollout the controller has work for, by phase: waiting (its wave has not started), held, updating, gating, done, failed.",
		[]string{"tenant", "rollout", "app", "phase"}, nil)
	rolloutStateDesc = prometheus.NewDesc("edgebox_rollout_state",
		"1 for the state each rollout the controller has work for is in, 0 for the others.",
		[]string{"tenant", "rollout", "app", "state"}, nil)
)

// Collector is the active rollouts' progress, as the controller saw it at
// its last look (TickAll, every Every): no store reads at a scrape. A
// rollout leaves the metrics at the controller's first look after it
// ended; a console whose controller does not run reports none.
func (s *Service) Collector() prometheus.Collector { return progressCollector{s} }

type progressCollector struct{ s *Service }

func (c progressCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- rolloutsDesc
	ch <- rolloutBoxesDesc
	ch <- rolloutStateDesc
}

func (c progressCollector) Collect(ch chan<- prometheus.Metric) {
	c.s.mu.Lock()
	seen := c.s.progress // replaced whole by TickAll, never changed
	c.s.mu.Unlock()
	byState := make(map[State]int, len(states))
	for _, p := range seen {
		byState[p.state]++
		for _, ph := range phases {
			ch <- prometheus.MustNewConstMetric(rolloutBoxesDesc, prometheus.GaugeValue, float64(p.boxes[ph]), p.tenant, p.id, p.app, string(ph))
		}
		for _, st := range states {
			v := 0.0
			if p.state == st {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(rolloutStateDesc, prometheus.GaugeValue, v, p.tenant, p.id, p.app, string(st))
		}
	}
	for _, st := range states {
		ch <- prometheus.MustNewConstMetric(rolloutsDesc, prometheus.GaugeValue, float64(byState[st]), string(st))
	}
}
