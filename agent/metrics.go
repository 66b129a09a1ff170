package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/edgebox/edgebox/agent/vitals"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/tunnel"
)

// DefaultMetricsListen is where the agent command serves the box's
// metrics unless told otherwise: loopback only, on the port of
// OpenTelemetry's Prometheus exporter, which a box's own collector or
// node agent scrapes.
const DefaultMetricsListen = "127.0.0.1:9464"

// metricsOff reports whether addr, a Config.MetricsListen, serves nothing.
func metricsOff(addr string) bool { return addr == "" || addr == "off" }

// checkMetricsListen refuses a metrics address that is not loopback: the
// metrics tell what the box runs and how it is, and are for its own host,
// never its LAN. A host name other than localhost is refused too: what
// it resolves to may change.
func checkMetricsListen(addr string) error {
	if metricsOff(addr) {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = strconv.ParseUint(port, 10, 16)
	}
	if err != nil {
		return fmt.Errorf("agent: metrics address %q: want a loopback address and port, such as %s, or \"off\"", addr, DefaultMetricsListen)
	}
	if ip, err := netip.ParseAddr(host); host != "localhost" && (err != nil || !ip.IsLoopback()) {
		return fmt.Errorf("agent: metrics address %q is not loopback: the agent serves its metrics on loopback only (127.0.0.1:PORT, [::1]:PORT or localhost:PORT), or \"off\"", addr)
	}
	return nil
}

// initMetrics makes the registry the agent serves: the Go runtime's and
// the process's collectors, the box's own, and the tunnel's, which it
// returns for the tunnel client.
func (a *Agent) initMetrics() *tunnel.Metrics {
	a.metrics = prometheus.NewRegistry()
	a.boxMetrics = &boxCollector{a: a, vitals: vitals.NewReader(a.cfg.DataDir)}
	a.metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), a.boxMetrics)
	return tunnel.NewMetrics(a.metrics)
}

// serveMetrics serves /metrics on the configured loopback address until
// ctx ends, then stops the server and waits for its handlers. An address
// it cannot listen on is logged: the box runs on without metrics.
func (a *Agent) serveMetrics(ctx context.Context) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", a.cfg.MetricsListen)
	if err != nil {
		a.log.Warn("the box's metrics are not served", "address", a.cfg.MetricsListen, "err", err)
		return
	}
	if ap, err := netip.ParseAddrPort(ln.Addr().String()); err != nil || !ap.Addr().IsLoopback() {
		ln.Close()
		a.log.Warn("the box's metrics are not served: the address is not loopback", "address", a.cfg.MetricsListen, "listened", ln.Addr().String())
		return
	}
	errLog := slog.NewLogLogger(a.log.Handler(), slog.LevelWarn)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.metrics, promhttp.HandlerOpts{ErrorLog: errLog, MaxRequestsInFlight: 4}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute, ErrorLog: errLog}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Warn("the box's metrics stopped", "err", err)
		}
	}()
	a.boxMetrics.prime()
	a.metricsAddr.Store(ln.Addr().String())
	a.log.Info("the box's metrics are served", "address", ln.Addr().String())
	<-ctx.Done()
	a.metricsAddr.Store("")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if srv.Shutdown(sctx) != nil { // a scrape outlived the wait
		srv.Close()
	}
	<-served
}

// MetricsAddr is where the agent serves its metrics now; "" while it
// serves none.
func (a *Agent) MetricsAddr() string {
	s, _ := a.metricsAddr.Load().(string)
	return s
}

// workloadPhases are the phases a workload's status takes on the box, in
// the order the metrics give them.
var workloadPhases = []string{edgeboxv1.PhasePending, edgeboxv1.PhasePulling, edgeboxv1.PhaseRunning, edgeboxv1.PhaseStopped, edgeboxv1.PhaseFailed}

var (
	workloadsDesc = prometheus.NewDesc("edgebox_agent_workloads",
		"Workloads on this box by the phase the agent reported last (Pending, Pulling, Running, Stopped, Failed).", []string{"phase"}, nil)
	revisionDesc = prometheus.NewDesc("edgebox_agent_desired_revision",
		"The revision of the desired state this box stored last, which it acknowledges to the console.", nil, nil)
	peersDesc = prometheus.NewDesc("edgebox_agent_site_peers",
		"Boxes of this box's site it listens for (site health); 0 when it takes no part.", nil, nil)
	peersHeardDesc = prometheus.NewDesc("edgebox_agent_site_peers_heard",
		"Boxes of this box's site it heard within three probe periods.", nil, nil)
	cpuDesc = prometheus.NewDesc("edgebox_box_cpu_ratio",
		"Share of all the box's CPUs that was busy since the previous scrape, 0 to 1.", nil, nil)
	memUsedDesc  = prometheus.NewDesc("edgebox_box_memory_used_bytes", "The box's memory in use (total less available).", nil, nil)
	memTotalDesc = prometheus.NewDesc("edgebox_box_memory_total_bytes", "The box's memory.", nil, nil)
	diskUsedDesc = prometheus.NewDesc("edgebox_box_disk_used_bytes",
		"Space used on the file system of the agent's data.", nil, nil)
	diskTotalDesc = prometheus.NewDesc("edgebox_box_disk_total_bytes",
		"Size of the file system of the agent's data.", nil, nil)
	tempDesc = prometheus.NewDesc("edgebox_box_temperature_celsius",
		"The hottest of the box's thermal zones.", nil, nil)
	uptimeDesc = prometheus.NewDesc("edgebox_box_uptime_seconds", "Time since the box booted.", nil, nil)
)

// boxCollector is the box's own metrics, read at each scrape from what
// the agent holds (statuses, the peers it hears), one read transaction of
// the local store (the revision) and the operating system's figures
// (package vitals: a few small files, one statfs). Figures the system
// does not give (vitals reads Linux's and Windows') are left out, not
// served as 0.
type boxCollector struct {
	a      *Agent
	mu     sync.Mutex // guards vitals, whose CPU share is since its last Read
	vitals *vitals.Reader
}

// prime reads the vitals once, so the first scrape's CPU share is of the
// time since.
func (c *boxCollector) prime() {
	c.mu.Lock()
	c.vitals.Read()
	c.mu.Unlock()
}

func (c *boxCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{workloadsDesc, revisionDesc, peersDesc, peersHeardDesc, cpuDesc,
		memUsedDesc, memTotalDesc, diskUsedDesc, diskTotalDesc, tempDesc, uptimeDesc} {
		ch <- d
	}
}

func (c *boxCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	phases := c.a.reports.phases(edgeboxv1.KindWorkload)
	for _, p := range workloadPhases {
		gauge(workloadsDesc, float64(phases[p]), p)
	}
	if rev, err := c.a.local.Revision(); err == nil {
		gauge(revisionDesc, float64(rev))
	}
	var peers, heard int
	if p := c.a.prober.Load(); p != nil {
		for _, s := range p.Seen() {
			peers++
			if s.GetAlive() {
				heard++
			}
		}
	}
	gauge(peersDesc, float64(peers))
	gauge(peersHeardDesc, float64(heard))

	c.mu.Lock()
	v := c.vitals.Read()
	c.mu.Unlock()
	if v.GetUptimeSeconds() == 0 {
		return // nothing was read: neither Linux nor Windows
	}
	gauge(cpuDesc, float64(v.GetCpuPercent())/100)
	gauge(uptimeDesc, float64(v.GetUptimeSeconds()))
	if v.GetMemoryTotalBytes() > 0 {
		gauge(memUsedDesc, float64(v.GetMemoryUsedBytes()))
		gauge(memTotalDesc, float64(v.GetMemoryTotalBytes()))
	}
	if v.GetDiskTotalBytes() > 0 {
		gauge(diskUsedDesc, float64(v.GetDiskUsedBytes()))
		gauge(diskTotalDesc, float64(v.GetDiskTotalBytes()))
	}
	if v.GetTemperatureCelsius() != 0 {
		gauge(tempDesc, float64(v.GetTemperatureCelsius()))
	}
}
