package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/internal/test/toxic"
	"github.com/edgebox/edgebox/tunnel"
	"github.com/edgebox/edgebox/tunnel/forwarding"
)

// sessionBox is a console and one box in this process, the box's tunnel
// through a toxiproxy that can delay it.
func sessionBox(b *testing.B) (*testenv.InProcess, testenv.Box, *toxic.Proxy) {
	h := testenv.NewInProcess(b, testenv.Options{})
	tok := h.Token(b, api.TokenRequest{Region: "bench", Site: "lab"})
	box, err := h.Enroll(b, tok, "session-box")
	if err != nil {
		b.Fatal(err)
	}
	proxy := toxic.New(b, strings.TrimPrefix(h.URL(), "https://"))
	testenv.StartAgent(b, box, func(c *agent.Config) {
		c.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, proxy.Addr())
		}
	})
	testenv.WaitFor(b, time.Minute, "the box online", func() bool {
		bx, err := h.Admin().Box(context.Background(), box.ID())
		return err == nil && bx.Online
	})
	return h, box, proxy
}

// BenchmarkKeystrokeEcho: the time from a key pressed in a remote shell
// to its echo, through the tunnel on a link of 80 ms round trip (40 ms
// each way, the box's side; the operator is next to the console), against
// the link's own round trip measured with the tunnel's ping in the same
// run. Goal: p99 within the round trip + 10 ms.
func BenchmarkKeystrokeEcho(b *testing.B) {
	h, box, proxy := sessionBox(b)
	for _, dir := range []string{"upstream", "downstream"} {
		if err := proxy.Add("rtt-"+dir, "latency", dir, `"latency": 40`); err != nil {
			b.Fatal(err)
		}
	}
	// The link's round trip, as the tunnel's own ping sees it.
	sess, ok := h.Console().Tunnel().Session(box.ID())
	if !ok {
		b.Fatal("no tunnel session")
	}
	var rtts []time.Duration
	for range 20 {
		rtt, err := sess.Ping()
		if err != nil {
			b.Fatal(err)
		}
		rtts = append(rtts, rtt)
	}
	sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
	rtt := rtts[len(rtts)/2]

	s, err := h.Admin().OpenSession(context.Background(), box.ID(), api.SessionOptions{TTY: true, Cols: 80, Rows: 24, Command: []string{"cat"}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	next := func() api.Frame {
		f, err := s.Recv()
		if err != nil {
			b.Fatal(err)
		}
		return f
	}
	for f := next(); f.Type != api.FrameStatus || !strings.Contains(string(f.Payload), "started"); f = next() {
	}
	n := max(b.N, 200)
	lat := make([]time.Duration, 0, n)
	b.ResetTimer()
	for i := range n {
		key := []byte{byte('a' + i%26)}
		t0 := time.Now()
		s.Write(key)
		for {
			f := next()
			if f.Type == api.FrameOutput && bytes.Contains(f.Payload, key) {
				break
			}
		}
		lat = append(lat, time.Since(t0))
		time.Sleep(20 * time.Millisecond) // a typist, not a flood
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p := func(q float64) time.Duration { return lat[min(len(lat)-1, int(q*float64(len(lat))))] }
	b.ReportMetric(float64(rtt.Microseconds())/1000, "rtt-ms")
	b.ReportMetric(float64(p(0.5).Microseconds())/1000, "echo-p50-ms")
	b.ReportMetric(float64(p(0.99).Microseconds())/1000, "echo-p99-ms")
	b.Logf("keystroke echo over a link of %v round trip (tunnel ping, median): p50 %v, p99 %v, max %v over %d keys",
		rtt.Round(100*time.Microsecond), p(0.5).Round(100*time.Microsecond), p(0.99).Round(100*time.Microsecond),
		lat[len(lat)-1].Round(100*time.Microsecond), len(lat))
}

// BenchmarkShells: 20 shells open at once on one box: what each costs the
// console and the agent (here one process: heap in use, goroutines).
func BenchmarkShells(b *testing.B) {
	h, box, _ := sessionBox(b)
	settle := func() (heap uint64, goroutines int) {
		runtime.GC()
		runtime.GC()
		time.Sleep(500 * time.Millisecond)
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse, runtime.NumGoroutine()
	}
	heap0, g0 := settle()
	const n = 20
	var open []*api.Session
	for i := range n {
		s, err := h.Admin().OpenSession(context.Background(), box.ID(), api.SessionOptions{TTY: true, Cols: 80, Rows: 24})
		if err != nil {
			b.Fatal(err)
		}
		open = append(open, s)
		s.Write([]byte(fmt.Sprintf("echo shell-%d\n", i)))
		for {
			f, err := s.Recv()
			if err != nil {
				b.Fatal(err)
			}
			if bytes.Contains(f.Payload, []byte(fmt.Sprintf("shell-%d\r\n", i))) {
				break
			}
		}
	}
	heap1, g1 := settle()
	rss := vmRSS()
	for _, s := range open {
		s.Close()
	}
	per := float64(int64(heap1)-int64(heap0)) / n / 1024
	b.ReportMetric(per, "heap-KiB-per-shell")
	b.ReportMetric(float64(g1-g0)/n, "goroutines-per-shell")
	b.Logf("%d shells on one box: %.1f KiB of heap and %.1f goroutines each, console and agent together (one process; the shell processes themselves are the box's); process RSS %s",
		n, per, float64(g1-g0)/n, rss)
}

func vmRSS() string {
	raw, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// BenchmarkForward: bytes through a port forward (CLI's multiplexer on a
// WebSocket to the console, a forward stream through the tunnel, the box
// dialling the target) against the same target reached through a forward
// stream the console opens itself: the tunnel's own stream throughput.
// Goal: at least 0.7 of it.
func BenchmarkForward(b *testing.B) {
	h, box, _ := sessionBox(b)
	sink, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	go func() {
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	target := sink.Addr().String()
	const size = 256 << 20
	buf := make([]byte, 256<<10)
	push := func(c net.Conn) time.Duration {
		t0 := time.Now()
		for sent := 0; sent < size; sent += len(buf) {
			if _, err := c.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(t0)
	}
	mbps := func(d time.Duration) float64 { return size / d.Seconds() / 1e6 }

	var direct, forwarded []float64
	for range max(b.N, 3) {
		tc, err := h.Console().Tunnel().Open(context.Background(), box.ID(), tunnel.KindForward, map[string]string{forwarding.MetaTarget: target})
		if err != nil {
			b.Fatal(err)
		}
		if err := forwarding.ReadReply(tc); err != nil {
			b.Fatal(err)
		}
		direct = append(direct, mbps(push(tc)))
		tc.Close()

		conn, err := h.Admin().OpenForward(context.Background(), box.ID(), target, "")
		if err != nil {
			b.Fatal(err)
		}
		mux, err := forwarding.Client(conn)
		if err != nil {
			b.Fatal(err)
		}
		st, err := mux.OpenStream()
		if err != nil {
			b.Fatal(err)
		}
		if err := forwarding.ReadReply(st); err != nil {
			b.Fatal(err)
		}
		forwarded = append(forwarded, mbps(push(st)))
		st.Close()
		mux.Close()
	}
	mean := func(xs []float64) float64 {
		s := 0.0
		for _, x := range xs {
			s += x
		}
		return s / float64(len(xs))
	}
	b.ReportMetric(mean(direct), "tunnel-MB/s")
	b.ReportMetric(mean(forwarded), "forward-MB/s")
	b.ReportMetric(mean(forwarded)/mean(direct), "ratio")
	f := func(xs []float64) string {
		var out []string
		for _, x := range xs {
			out = append(out, strconv.FormatFloat(x, 'f', 0, 64))
		}
		return strings.Join(out, ", ")
	}
	b.Logf("256 MiB each: the tunnel's own forward stream %s MB/s; through edgebox port-forward's path %s MB/s; %.2f ×",
		f(direct), f(forwarded), mean(forwarded)/mean(direct))
}
