package tunnel

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the tunnel's Prometheus collectors, of the console's side
// (NewServer) or a box's (ClientConfig.Metrics). A nil *Metrics records
// nothing, so tests may leave it out.
type Metrics struct {
	sessions   prometheus.Gauge
	handshakes *prometheus.CounterVec
	streams    *prometheus.CounterVec
	refused    *prometheus.CounterVec
	bytes      *prometheus.CounterVec
	rtt        prometheus.Histogram
	late       prometheus.Counter
	dead       prometheus.Counter

	bytesIn, bytesOut prometheus.Counter
}

// NewMetrics creates the collectors and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "edgebox", Subsystem: "tunnel", Name: "sessions",
			Help: "Tunnel sessions currently up.",
		}),
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "edgebox", Subsystem: "tunnel", Name: "handshakes_total",
			Help: "Tunnel session set-ups, by result.",
		}, []string{"result"}),
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "edgebox", Subsystem: "tunnel", Name: "streams_total",
			Help: "Streams opened, by kind and direction (in: opened by the peer).",
		}, []string{"kind", "direction"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "edgebox", Subsystem: "tunnel", Name: "streams_refused_total",
			Help: "Streams refused because no listener took their kind or it was busy.",
		}, []string{"kind"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "edgebox", Subsystem: "tunnel", Name: "stream_bytes_total",
			Help: "Payload bytes carried by streams, by direction.",
		}, []string{"direction"}),
		rtt: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "edgebox", Subsystem: "tunnel", Name: "ping_rtt_seconds",
			Help:    "Round trip of tunnel pings.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		late: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "edgebox", Subsystem: "tunnel", Name: "pings_late_total",
			Help: "Pings answered after PingTimeout, or not at all, on sessions that stayed up because the link still showed life.",
		}),
		dead: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "edgebox", Subsystem: "tunnel", Name: "links_dead_total",
			Help: "Sessions closed because the link was silent for DeadAfter while a ping was unanswered.",
		}),
	}
	m.bytesIn = m.bytes.WithLabelValues("in")
	m.bytesOut = m.bytes.WithLabelValues("out")
	if reg != nil {
		reg.MustRegister(m.sessions, m.handshakes, m.streams, m.refused, m.bytes, m.rtt, m.late, m.dead)
	}
	return m
}

func (m *Metrics) sessionUp(delta float64) {
	if m != nil {
		m.sessions.Add(delta)
	}
}

func (m *Metrics) handshake(result string) {
	if m != nil {
		m.handshakes.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) streamOpened(k Kind, dir string) {
	if m != nil {
		m.streams.WithLabelValues(string(k), dir).Inc()
	}
}

func (m *Metrics) streamRefused(k Kind) {
	if m != nil {
		m.refused.WithLabelValues(string(k)).Inc()
	}
}

func (m *Metrics) countBytes(read, written int) {
	if m == nil {
		return
	}
	if read > 0 {
		m.bytesIn.Add(float64(read))
	}
	if written > 0 {
		m.bytesOut.Add(float64(written))
	}
}

func (m *Metrics) observeRTT(d time.Duration) {
	if m != nil {
		m.rtt.Observe(d.Seconds())
	}
}

func (m *Metrics) pingLate() {
	if m != nil {
		m.late.Inc()
	}
}

func (m *Metrics) linkDead() {
	if m != nil {
		m.dead.Inc()
	}
}
