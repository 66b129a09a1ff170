package agent_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/fake"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/leak"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// TestMetricsListenIsLoopbackOnly: the agent serves its metrics on
// loopback or not at all; any other address is refused before it runs.
func TestMetricsListenIsLoopbackOnly(t *testing.T) {
	t.Parallel()
	tests := []struct {
		addr string
		ok   bool
	}{
		{"", true},
		{"off", true},
		{agent.DefaultMetricsListen, true},
		{"127.0.0.1:0", true},
		{"127.0.0.2:9464", true},
		{"[::1]:9464", true},
		{"localhost:9464", true},
		{"0.0.0.0:9464", false},
		{":9464", false},
		{"[::]:9464", false},
		{"192.168.1.20:9464", false},
		{"metrics.example:9464", false},
		{"127.0.0.1", false},
		{"127.0.0.1:http", false},
		{"127.0.0.1:70000", false},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			t.Parallel()
			cfg := agent.DefaultConfig(t.TempDir())
			cfg.MetricsListen = tt.addr
			err := cfg.Validate()
			if tt.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tt.ok && (err == nil || !strings.Contains(err.Error(), "loopback")) {
				t.Fatalf("got %v, want a refusal that says loopback", err)
			}
		})
	}
}

// scrapeAgent reads and parses what the agent serves at addr.
func scrapeAgent(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("the agent's /metrics does not parse: %v\n%s", err, body)
	}
	return families
}

// value is the value of the family's series whose labels include want.
func value(mfs map[string]*dto.MetricFamily, name string, want ...string) (float64, bool) {
next:
	for _, m := range mfs[name].GetMetric() {
		for i := 0; i+1 < len(want); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				found = found || (l.GetName() == want[i] && l.GetValue() == want[i+1])
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), true
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), true
		case m.GetHistogram() != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// TestAgentServesItsMetrics runs an enrolled agent with a workload against
// a real console, its metrics on 127.0.0.1:0, and scrapes them as
// Prometheus would: the tunnel's, the workloads by phase, the desired
// revision, the site peers and (on Linux) the vitals. Once Run returns,
// nothing listens there and no goroutine of the agent is left. It is not
// parallel: it counts the process's goroutines.
func TestAgentServesItsMetrics(t *testing.T) {
	h := testenv.NewInProcess(t, testenv.Options{})
	box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "a"}), "metered")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rev, err := h.Admin().PutDesired(ctx, box.ID(), "Workload", "robot", json.RawMessage(`{"app":"robot","release":"1.0","runtime":"containerd"}`))
	if err != nil {
		t.Fatal(err)
	}
	before, _ := leak.Count()

	cfg := agent.DefaultConfig(box.DataDir())
	cfg.Version = "test"
	cfg.Drivers = []runtime.Driver{fake.New("containerd")}
	cfg.Reconcile = 500 * time.Millisecond
	cfg.MetricsListen = "127.0.0.1:0"
	a, err := agent.New(cfg, testenv.Logger(t).With("side", "agent"))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- a.Run(runCtx) }()

	testenv.WaitFor(t, 30*time.Second, "the metrics served", func() bool { return a.MetricsAddr() != "" })
	addr := a.MetricsAddr()
	if ap, err := net.ResolveTCPAddr("tcp", addr); err != nil || !ap.IP.IsLoopback() || ap.Port == 0 {
		t.Fatalf("metrics served at %q", addr)
	}
	var mfs map[string]*dto.MetricFamily
	testenv.WaitFor(t, 30*time.Second, "the workload running and its revision stored, as the metrics say", func() bool {
		mfs = scrapeAgent(t, addr)
		running, _ := value(mfs, "edgebox_agent_workloads", "phase", "Running")
		stored, _ := value(mfs, "edgebox_agent_desired_revision")
		return running == 1 && stored == float64(rev)
	})
	want := []struct {
		name   string
		labels []string
		value  float64 // -1: any
	}{
		{"edgebox_tunnel_sessions", nil, 1},
		{"edgebox_tunnel_handshakes_total", []string{"result", "ok"}, -1},
		{"edgebox_tunnel_streams_total", []string{"kind", "sync", "direction", "out"}, -1},
		{"edgebox_tunnel_ping_rtt_seconds", nil, -1},
		{"edgebox_agent_workloads", []string{"phase", "Failed"}, 0},
		{"edgebox_agent_site_peers", nil, 0}, // site health is off
		{"edgebox_agent_site_peers_heard", nil, 0},
		{"go_goroutines", nil, -1},
	}
	if goruntime.GOOS == "linux" {
		want = append(want, []struct {
			name   string
			labels []string
			value  float64
		}{
			{"edgebox_box_cpu_ratio", nil, -1},
			{"edgebox_box_memory_total_bytes", nil, -1},
			{"edgebox_box_disk_total_bytes", nil, -1},
			{"edgebox_box_uptime_seconds", nil, -1},
			{"process_open_fds", nil, -1},
		}...)
	}
	for _, w := range want {
		got, ok := value(mfs, w.name, w.labels...)
		switch {
		case !ok:
			t.Errorf("the metrics lack %s%v", w.name, w.labels)
		case w.value >= 0 && got != w.value:
			t.Errorf("%s%v = %g, want %g", w.name, w.labels, got, w.value)
		}
	}
	if v, _ := value(mfs, "edgebox_box_memory_total_bytes"); goruntime.GOOS == "linux" && v <= 0 {
		t.Errorf("the box has %g bytes of memory", v)
	}
	if v, _ := value(mfs, "edgebox_box_cpu_ratio"); v < 0 || v > 1 {
		t.Errorf("CPU share %g, not within 0 to 1", v)
	}

	stop()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run returned %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run has not returned 30s after its context ended")
	}
	if a.MetricsAddr() != "" {
		t.Errorf("metrics still said to be at %s after Run returned", a.MetricsAddr())
	}
	if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
		c.Close()
		t.Errorf("%s still listens after Run returned", addr)
	}
	n, all := leak.Settle(before, 10*time.Second)
	if n > before {
		t.Errorf("%d goroutines before the agent, %d after Run returned; all goroutines:\n%s", before, n, all)
	}
}
