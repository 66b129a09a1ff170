package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/fleetsim"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// consoleProc is the console binary under measurement.
type consoleProc struct {
	bin, data, addr, url, token string
	cmd                         *exec.Cmd
	hc                          *http.Client
	// public, when set, is its --public-url (a load balancer's) instead
	// of url; args are more flags.
	public string
	args   []string
}

func (c *consoleProc) start(b *testing.B) []byte {
	out := c.launch(b)
	c.waitHealthy(b, 20*time.Second)
	return out.Bytes()
}

// launch starts the console and returns what it will print on standard
// output. EDGEBOX_BENCH_CONSOLE_LOG_LEVEL is its log level (error unless
// set); EDGEBOX_BENCH_CONSOLE_ARGS adds space-separated flags;
// EDGEBOX_BENCH_CONSOLE_CPUS pins it to those CPUs (taskset's list);
// EDGEBOX_BENCH_CONSOLE_CPU_QUOTA limits it to that many cores' time (0.5:
// half of one, through a cgroup; root only), so that the console, not the
// simulator beside it, is what limits a storm;
// EDGEBOX_BENCH_CONSOLE_ENV adds space-separated NAME=value pairs
// to its environment (GOMAXPROCS=1 limits it to one core), after
// EDGEBOX_BENCH_HEAP_PROFILE's and EDGEBOX_BENCH_CONSOLE_GODEBUG's GODEBUG.
func (c *consoleProc) launch(b *testing.B) *bytes.Buffer {
	level := cmp.Or(os.Getenv("EDGEBOX_BENCH_CONSOLE_LOG_LEVEL"), "error")
	var out bytes.Buffer
	args := append([]string{"--data", c.data, "--listen", c.addr, "--public-url", cmp.Or(c.public, c.url), "--log-level", level},
		strings.Fields(os.Getenv("EDGEBOX_BENCH_CONSOLE_ARGS"))...)
	args = append(args, c.args...)
	c.cmd = exec.Command(filepath.Join(c.bin, "edgebox-console"), args...)
	c.cmd.Stdout, c.cmd.Stderr = &out, os.Stderr
	c.cmd.Env = os.Environ()
	if os.Getenv("EDGEBOX_BENCH_HEAP_PROFILE") != "" {
		c.cmd.Env = append(c.cmd.Env, "GODEBUG=memprofilerate=1")
	}
	if g := os.Getenv("EDGEBOX_BENCH_CONSOLE_GODEBUG"); g != "" {
		c.cmd.Env = append(c.cmd.Env, "GODEBUG="+g)
	}
	c.cmd.Env = append(c.cmd.Env, strings.Fields(os.Getenv("EDGEBOX_BENCH_CONSOLE_ENV"))...)
	if err := c.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	if cpus := os.Getenv("EDGEBOX_BENCH_CONSOLE_CPUS"); cpus != "" {
		// Every thread of the console onto those CPUs, before it does
		// much: with the benchmark run on the others (taskset), the
		// console has them to itself.
		if out, err := exec.Command("taskset", "-a", "-p", "-c", cpus, strconv.Itoa(c.cmd.Process.Pid)).CombinedOutput(); err != nil {
			b.Fatalf("taskset %s: %v: %s", cpus, err, out)
		}
	}
	if q := os.Getenv("EDGEBOX_BENCH_CONSOLE_CPU_QUOTA"); q != "" {
		if err := limitCPU(c.cmd.Process.Pid, q); err != nil {
			b.Fatalf("EDGEBOX_BENCH_CONSOLE_CPU_QUOTA=%s: %v", q, err)
		}
	}
	return &out
}

// limitCPU moves the process pid into a cgroup of its own whose CPU time
// is limited to cores (a fraction such as "0.5") in every 100 ms, through
// cgroup v2's cpu.max or v1's CFS quota, whichever the machine mounts.
func limitCPU(pid int, cores string) error {
	f, err := strconv.ParseFloat(cores, 64)
	if err != nil || f <= 0 || f > 64 {
		return errors.New("want a number of cores such as 0.5")
	}
	quota := strconv.Itoa(int(f * 100000))
	write := func(dir, file, value string) error {
		return os.WriteFile(filepath.Join(dir, file), []byte(value), 0o644)
	}
	if ctl, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && slices.Contains(strings.Fields(string(ctl)), "cpu") {
		dir := "/sys/fs/cgroup/edgebox-bench-console"
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := write(dir, "cpu.max", quota+" 100000"); err != nil {
			return err
		}
		return write(dir, "cgroup.procs", strconv.Itoa(pid))
	}
	if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"); err != nil {
		return errors.New("no cgroup CPU controller mounted under /sys/fs/cgroup")
	}
	dir := "/sys/fs/cgroup/cpu/edgebox-bench-console"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range [][2]string{{"cpu.cfs_period_us", "100000"}, {"cpu.cfs_quota_us", quota}, {"cgroup.procs", strconv.Itoa(pid)}} {
		if err := write(dir, f[0], f[1]); err != nil {
			return err
		}
	}
	return nil
}

// idleCPU measures what the fleet, online and synced, costs the console's
// CPU while nothing happens but the tunnels' keepalives, over span (a
// duration such as "30s"), after 10 s for the cold start's last work to
// end; and how long one /metrics scrape takes meanwhile. With
// EDGEBOX_BENCH_IDLE_PROFILE set, the console's CPU profile over the span
// goes to that file.
func idleCPU(b *testing.B, c *consoleProc, f *fleetsim.Fleet, n int, span string) {
	d, err := time.ParseDuration(span)
	if err != nil || d <= 0 {
		b.Fatalf("EDGEBOX_BENCH_IDLE_CPU=%q: want a positive duration", span)
	}
	time.Sleep(10 * time.Second)
	c0, s0, t0 := procCPU(b, c.cmd.Process.Pid), simCPU(f), time.Now()
	scrape := time.Now()
	if _, err := c.metric("edgebox_tunnel_sessions"); err != nil {
		b.Logf("idle: a /metrics scrape failed after %v: %v", time.Since(scrape).Round(time.Millisecond), err)
	} else {
		b.ReportMetric(float64(time.Since(scrape).Milliseconds()), "idle-metrics-scrape-ms")
	}
	if p := os.Getenv("EDGEBOX_BENCH_IDLE_PROFILE"); p != "" {
		fetchDebug(c, "profile", strconv.Itoa(int(time.Until(t0.Add(d)).Seconds())), p)
	}
	time.Sleep(time.Until(t0.Add(d)))
	c1, s1, secs := procCPU(b, c.cmd.Process.Pid), simCPU(f), time.Since(t0).Seconds()
	share := (c1 - c0) / secs
	b.ReportMetric(share*1000, "idle-console-cpu-ms/s")
	b.ReportMetric(share*1e6/float64(n), "idle-console-cpu-us/s/box")
	b.Logf("idle: over %v the console used %.1f ms of CPU a second for %d boxes (%.2f µs a second per box), the simulator %.1f ms a second",
		d, share*1000, n, share*1e6/float64(n), (s1-s0)/secs*1000)
}

// procCPU is the CPU time, in seconds, process pid has used.
func procCPU(b *testing.B, pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command's closing parenthesis; utime and
	// stime are the 12th and 13th of them, in clock ticks of 1/100 s.
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100
}

// fetchDebug saves what the console's /debug/pprof/NAME?seconds=SECS
// answers to file.
func fetchDebug(c *consoleProc, name, secs, file string) {
	req, _ := http.NewRequest(http.MethodGet, c.url+"/debug/pprof/"+name+"?seconds="+secs, nil)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := (&http.Client{Timeout: 10 * time.Minute, Transport: c.hc.Transport}).Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	os.WriteFile(file, body, 0o644)
}

// simCPU is the simulator's CPU time in seconds, 0 if it cannot be read.
func simCPU(f *fleetsim.Fleet) float64 {
	d, err := f.CPUTime()
	if err != nil {
		return 0
	}
	return d.Seconds()
}

// waitHealthy waits until the console's /healthz answers.
func (c *consoleProc) waitHealthy(b *testing.B, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := c.hc.Get(c.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("console did not start: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// debugFetch saves what the console's /debug/pprof/NAME?seconds=SECS
// answers (?debug=1 when secs is empty) to file, from at on or as soon
// as it listens, in a goroutine wg waits for.
func (c *consoleProc) debugFetch(b *testing.B, wg *sync.WaitGroup, name, secs, file string, at time.Time) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(time.Until(at))
		q := "?seconds=" + secs
		if secs == "" {
			q = "?debug=1"
		}
		// A console just started may not listen yet.
		var resp *http.Response
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			req, _ := http.NewRequest(http.MethodGet, c.url+"/debug/pprof/"+name+q, nil)
			req.Header.Set("Authorization", "Bearer "+c.token)
			var err error
			if resp, err = (&http.Client{Timeout: 10 * time.Minute, Transport: c.hc.Transport}).Do(req); err == nil {
				break
			} else if time.Now().After(deadline) {
				b.Log(err)
				return
			}
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		os.WriteFile(file, body, 0o644)
	}()
}

func (c *consoleProc) kill() { killAll(c) }

// killAll kills every console at once, then waits for each to end.
func killAll(cs ...*consoleProc) {
	for _, c := range cs {
		c.cmd.Process.Signal(syscall.SIGKILL)
	}
	for _, c := range cs {
		c.cmd.Wait()
	}
}

// metric reads one unlabelled sample from the console's /metrics.
func (c *consoleProc) metric(name string) (float64, error) {
	req, _ := http.NewRequest(http.MethodGet, c.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("no metric %s", name)
}

// metricSum adds up every sample of a metric, all labels, from the
// console's /metrics; a metric it does not export is 0.
func (c *consoleProc) metricSum(name string) (float64, error) {
	req, _ := http.NewRequest(http.MethodGet, c.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var sum float64
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{' && !strings.HasSuffix(name, "}")) {
			continue
		}
		if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
			sum += v
		}
	}
	return sum, sc.Err()
}

// settledMemory samples heap in use and RSS for a while and keeps the
// lowest of each, so garbage awaiting collection is not counted.
func (c *consoleProc) settledMemory(b *testing.B, d time.Duration) (heap, rss float64) {
	heap, rss = 1e18, 1e18
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		h, err := c.metric("go_memstats_heap_inuse_bytes")
		if err != nil {
			b.Fatal(err)
		}
		r, err := c.metric("process_resident_memory_bytes")
		if err != nil {
			b.Fatal(err)
		}
		heap, rss = min(heap, h), min(rss, r)
	}
	return heap, rss
}

// liveHeap forces two garbage collections in the console (the second
// empties sync.Pool victims) through its pprof endpoint, then reads the
// heap in use: memory the console really holds.
func (c *consoleProc) liveHeap(b *testing.B) float64 {
	for range 2 {
		req, _ := http.NewRequest(http.MethodGet, c.url+"/debug/pprof/heap?gc=1", nil)
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := c.hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	v, err := c.metric("go_memstats_heap_inuse_bytes")
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// boxCount is EDGEBOX_BENCH_BOXES, or def.
func boxCount(b *testing.B, def int) int { return envInt(b, "EDGEBOX_BENCH_BOXES", def) }

// simDir is where the simulated boxes keep their data: on tmpfs
// (/dev/shm) where the machine has one, or in EDGEBOX_BENCH_SIM_DIR.
// Thousands of boxes creating files on one ext4 journal spent a quarter of
// the simulator's CPU in a storm creating them (each agent's status file,
// mostly), a contention that separate boxes, each with its own disk, do
// not share.
func simDir(b *testing.B) string {
	parent := os.Getenv("EDGEBOX_BENCH_SIM_DIR")
	if parent == "" {
		if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
			parent = "/dev/shm"
		}
	}
	if parent == "" {
		return b.TempDir()
	}
	dir, err := os.MkdirTemp(parent, "edgebox-fleet-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// envInt is the integer in the environment variable name, or def.
func envInt(b *testing.B, name string, def int) int {
	if s := os.Getenv(name); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			b.Fatalf("%s=%q: want a number", name, s)
		}
		return n
	}
	return def
}

// holdIdleProcess starts this test binary again as an attacker that holds
// n idle connections to addr from 127.0.0.1–127.0.0.20 (the operator's
// address among them), and returns what stops it.
func holdIdleProcess(b *testing.B, addr string, n int) (stop func()) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "EDGEBOX_IDLE_ADDR="+addr, "EDGEBOX_IDLE_N="+strconv.Itoa(n))
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	lines := make(chan string, 2)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	select {
	case l := <-lines: // "holding N idle connections"
		b.Logf("idle attacker: %s", l)
	case <-time.After(time.Minute):
		b.Log("idle attacker: not all connected after a minute")
	}
	return func() {
		stdin.Close()
		for l := range lines {
			b.Logf("idle attacker: %s", l)
		}
		cmd.Wait()
	}
}

// holdIdle is the attacker in its own process: n connections to addr that
// never send a byte, each opened again 1–2 s after the console closes it,
// until standard input closes.
func holdIdle(addr string, n int) {
	ctx, cancel := context.WithCancel(context.Background())
	var dials atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(i%20+1))}, Timeout: 5 * time.Second}
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1)
			for ctx.Err() == nil {
				if c, err := d.DialContext(ctx, "tcp", addr); err == nil {
					dials.Add(1)
					stop := context.AfterFunc(ctx, func() { c.Close() })
					c.Read(buf)
					stop()
					c.Close()
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Second + rand.N(time.Second)):
				}
			}
		}()
	}
	for dials.Load() < int64(n) {
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Printf("holding %d idle connections\n", n)
	io.Copy(io.Discard, os.Stdin)
	cancel()
	wg.Wait()
	fmt.Printf("made %d connections in all\n", dials.Load())
}

// BenchmarkFleet connects N real agents (2,000 unless EDGEBOX_BENCH_BOXES
// says otherwise) to the console binary, reports the console's memory per
// idle connected box, then kills the console, restarts it and reports how
// long the fleet takes to come back and the API's latency meanwhile.
//
// The agents run in child processes (fleetsim), 3,000 boxes a process
// unless EDGEBOX_BENCH_PROCS sets the number of processes; each box dials
// from a loopback address of its own process's range, shared by
// EDGEBOX_BENCH_BOXES_PER_ADDR boxes (8 unless set; 2000 puts a fleet of
// 2,000 behind one address). EDGEBOX_BENCH_STORM_REVISIONS writes that
// many revisions of each box's desired state while the console is down,
// so that every box must catch up after the restart; the storm's "synced"
// figures count it.
//
// For investigating a storm: EDGEBOX_BENCH_STORM_ONLY skips the idle
// memory figures; EDGEBOX_BENCH_STORM_TIMEOUT (a duration, 10m unless
// set) bounds the wait for the fleet to come back, and a fleet that does
// not is logged with its curve before the benchmark fails;
// EDGEBOX_BENCH_CONSOLE_ENV and EDGEBOX_BENCH_CONSOLE_LOG_LEVEL reach the
// console (GOMAXPROCS=1 limits it to one core); EDGEBOX_BENCH_SIM_LOGS
// names a directory for the simulated agents' logs at info, and
// EDGEBOX_BENCH_SIM_PROFILES one for each child's CPU profile (.2 the
// storm's, from the kill until all are synced);
// EDGEBOX_BENCH_SIM_DIR is where the simulated boxes keep their data
// (/dev/shm unless set, see simDir), and EDGEBOX_BENCH_SIM_ENV adds
// space-separated NAME=value pairs to the simulator's processes'
// environment, and EDGEBOX_BENCH_SIM_NICE runs them at that niceness
// (10: the console, at 0, gets the CPU it asks for, and the simulated
// fleet the rest); EDGEBOX_BENCH_REJOIN (a duration) is the boxes' own
// rejoin window, which the console's advice can only lengthen (with
// EDGEBOX_BENCH_CONSOLE_ARGS=--box-rejoin-max=0 it gives none): how fast
// the fleet offers itself after the kill;
// EDGEBOX_BENCH_IDLE_CPU (a duration) measures the console's CPU with the
// fleet online and idle, for that long, before the storm;
// EDGEBOX_BENCH_CPU_PROFILE names a file for the console's, over the
// storm's first EDGEBOX_BENCH_CPU_PROFILE_SECONDS (8 unless set), and
// EDGEBOX_BENCH_ALLOC_PROFILE one for what it allocated over them;
// EDGEBOX_BENCH_GOROUTINES one for its goroutines by stack at
// EDGEBOX_BENCH_GOROUTINES_AFTER (5s unless set) after the restart. The API is
// measured from the moment the restarted console listens, and
// storm-s-healthz is when /healthz first answered.
//
// EDGEBOX_BENCH_STORM_IDLE=N holds N idle anonymous connections to the
// console's port from this process (127.2.x.y, 64 an address), from just
// before the kill to the storm's end, each opened again
// EDGEBOX_BENCH_STORM_IDLE_PAUSE to twice that (1s unless set) after the
// console closes it; the log says how many were held and closed.
func BenchmarkFleet(b *testing.B) {
	n := boxCount(b, 2000)
	for range b.N {
		fleet(b, n)
	}
}

// startConsole starts the console binary on fresh data and returns it
// with an admin API client; the caller kills it.
func startConsole(b *testing.B) (*consoleProc, []byte, *api.Client) {
	bin := testenv.BuildBinaries(b)
	addr := testenv.FreeAddr(b)
	c := &consoleProc{bin: bin, data: b.TempDir(), addr: addr, url: "https://" + addr,
		hc: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}}
	out := c.start(b)
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "admin token:"); ok {
			c.token = strings.TrimSpace(v)
		}
	}
	caPEM := fetch(b, c.hc, c.url+"/api/v1/ca")
	admin, err := api.NewClient(c.url, c.token, caPEM)
	if err != nil {
		c.kill()
		b.Fatal(err)
	}
	return c, caPEM, admin
}

func fleet(b *testing.B, n int) {
	c, caPEM, admin := startConsole(b)
	defer c.kill()
	f := startFleet(b, admin, n)
	defer func() {
		if err := f.Close(); err != nil {
			b.Error(err)
		}
	}()

	stormOnly := os.Getenv("EDGEBOX_BENCH_STORM_ONLY") != ""
	var heap0, rss0, stack0, live0, g0 float64
	var err error
	if !stormOnly {
		heap0, rss0 = c.settledMemory(b, 5*time.Second)
		stack0, err = c.metric("go_memstats_stack_inuse_bytes")
		if err != nil {
			b.Fatal(err)
		}
		live0 = c.liveHeap(b)
		g0, err = c.metric("go_goroutines")
		if err != nil {
			b.Fatal(err)
		}
	}

	// Start the n agents, in the fleet's processes.
	start, err := f.StartAgents()
	if err != nil {
		b.Fatal(err)
	}
	ids := f.IDs()
	sessions := func() (float64, error) { return c.metric("edgebox_tunnel_sessions") }
	waitOnline(b, admin, n, 5*time.Minute+time.Duration(n)*20*time.Millisecond, sessions)
	b.Logf("%d agents online in %v", n, time.Since(start).Round(time.Millisecond))
	logFleet(b, "cold start", waitSynced(b, f, fleetsim.Window{Since: start}))
	if files, err := f.OpenFiles(); err == nil {
		b.ReportMetric(float64(slices.Max(files)), "sim-open-files-max/process")
	}

	if !stormOnly {
		idleMemory(b, c, n, heap0, rss0, stack0, live0, g0)
	}
	if v := os.Getenv("EDGEBOX_BENCH_IDLE_CPU"); v != "" {
		idleCPU(b, c, f, n, v)
	}

	// An attacker holding idle connections, from a process of its own,
	// through the storm when EDGEBOX_BENCH_IDLE says how many.
	if idle := envInt(b, "EDGEBOX_BENCH_IDLE", 0); idle > 0 {
		stop := holdIdleProcess(b, c.addr, idle)
		defer stop()
	}

	// A hostile client in this process holding idle connections, from
	// just before the kill to the storm's end, when
	// EDGEBOX_BENCH_STORM_IDLE says how many.
	var idle *idleHolder
	if k := envInt(b, "EDGEBOX_BENCH_STORM_IDLE", 0); k > 0 {
		pause := time.Second
		if v := os.Getenv("EDGEBOX_BENCH_STORM_IDLE_PAUSE"); v != "" {
			if pause, err = time.ParseDuration(v); err != nil || pause <= 0 {
				b.Fatalf("EDGEBOX_BENCH_STORM_IDLE_PAUSE=%q: want a positive duration", v)
			}
		}
		if idle, err = startIdleHolder(c.addr, k, pause); err != nil {
			b.Fatal(err)
		}
		defer idle.stop()
		idle.waitTried(time.Minute)
	}

	// The storm: kill the console, start it again, watch the fleet return
	// while an operator keeps calling the API.
	cpu0, cpuErr := f.CPUTime() // the simulator's, through the storm
	// The simulator's CPU profile, if taken, has the storm alone in .2.
	if err := f.SplitProfiles(); err != nil {
		b.Fatal(err)
	}
	// The rejoin window the boxes heard last, as the console computed it.
	if w, err := c.metric("edgebox_admission_rejoin_window_seconds"); err == nil {
		b.Logf("before the kill: the rejoin window last told to a box was %.1f s", w)
		b.ReportMetric(w, "rejoin-window-s")
	}
	killed := time.Now()
	c.kill()
	var targets []uint64
	if k := envInt(b, "EDGEBOX_BENCH_STORM_REVISIONS", 0); k > 0 {
		t0 := time.Now()
		targets = advanceOffline(b, c.data, ids, k)
		b.Logf("storm: the desired state of %d boxes moved on by %d revisions while the console was down, in %v", n, k, time.Since(t0).Round(time.Millisecond))
	}
	restart := time.Now()
	if idle != nil {
		idle.markRestart()
	}
	c.launch(b)
	// The operator's calls come from another process, as they would, so
	// the agents do not slow the prober itself. It starts with the
	// console, and measures from the moment the console listens.
	probe := startProber(b, c.url, c.token, ids[0], caPEM)
	stormTimeout := 10 * time.Minute
	if v := os.Getenv("EDGEBOX_BENCH_STORM_TIMEOUT"); v != "" {
		if stormTimeout, err = time.ParseDuration(v); err != nil {
			b.Fatalf("EDGEBOX_BENCH_STORM_TIMEOUT=%q: %v", v, err)
		}
	}
	c.waitHealthy(b, stormTimeout)
	b.ReportMetric(time.Since(restart).Seconds(), "storm-s-healthz")
	var profiled sync.WaitGroup
	debugFetch := func(name, secs, file string, at time.Time) { c.debugFetch(b, &profiled, name, secs, file, at) }
	if p := os.Getenv("EDGEBOX_BENCH_CPU_PROFILE"); p != "" {
		// The console's CPU during the storm's first
		// EDGEBOX_BENCH_CPU_PROFILE_SECONDS (8 unless set).
		debugFetch("profile", cmp.Or(os.Getenv("EDGEBOX_BENCH_CPU_PROFILE_SECONDS"), "8"), p, time.Now())
	}
	if p := os.Getenv("EDGEBOX_BENCH_ALLOC_PROFILE"); p != "" {
		// What the console allocated over the storm's first
		// EDGEBOX_BENCH_CPU_PROFILE_SECONDS (8 unless set).
		debugFetch("allocs", cmp.Or(os.Getenv("EDGEBOX_BENCH_CPU_PROFILE_SECONDS"), "8"), p, time.Now())
	}
	if p := os.Getenv("EDGEBOX_BENCH_GOROUTINES"); p != "" {
		// The console's goroutines, grouped by stack, at
		// EDGEBOX_BENCH_GOROUTINES_AFTER (5 s unless set) after the
		// restart: what the sessions in flight wait on.
		after, err := time.ParseDuration(cmp.Or(os.Getenv("EDGEBOX_BENCH_GOROUTINES_AFTER"), "5s"))
		if err != nil {
			b.Fatal(err)
		}
		debugFetch("goroutine", "", p, time.Now().Add(after))
	}
	if p := os.Getenv("EDGEBOX_BENCH_TRACE"); p != "" {
		// The console's execution trace (go tool trace) over
		// EDGEBOX_BENCH_TRACE_SECONDS (5 unless set), from
		// EDGEBOX_BENCH_TRACE_AFTER (20 s unless set) after the restart:
		// where its goroutines, an API call's among them, wait.
		after, err := time.ParseDuration(cmp.Or(os.Getenv("EDGEBOX_BENCH_TRACE_AFTER"), "20s"))
		if err != nil {
			b.Fatal(err)
		}
		debugFetch("trace", cmp.Or(os.Getenv("EDGEBOX_BENCH_TRACE_SECONDS"), "5"), p, restart.Add(after))
	}
	defer profiled.Wait()
	// Online in the console, and by the boxes' own account caught up.
	window := fleetsim.Window{Since: killed}
	if targets != nil {
		window.Target = func(i int) uint64 { return targets[i] }
	}
	if err := waitOnlineErr(admin, n, time.Until(restart.Add(stormTimeout)), sessions); err != nil {
		logFleet(b, "storm from the kill (not converged)", f.Stats(window))
		if idle != nil {
			b.Log(idle.figures(killed, restart, time.Now()))
		}
		probe.stop()
		b.Fatal(err)
	}
	back := time.Since(restart)
	storm := waitSynced(b, f, window)
	if err := f.SplitProfiles(); err != nil {
		b.Fatal(err)
	}
	var idleFig idleFigures
	if idle != nil {
		idleFig = idle.figures(killed, restart, time.Now())
	}
	calls := probe.stop()
	if idle != nil {
		idle.stop() // once the prober has stopped: closing them is no part of the storm
	}
	if cpu1, err := f.CPUTime(); err == nil && cpuErr == nil {
		b.ReportMetric((cpu1 - cpu0).Seconds(), "storm-sim-cpu-s")
	}
	if cpu, err := c.metric("process_cpu_seconds_total"); err == nil {
		b.ReportMetric(cpu, "storm-console-cpu-s") // since its restart
	}
	logFleet(b, "storm from the kill", storm)
	b.ReportMetric((storm.AllSyncedAfter - restart.Sub(killed)).Seconds(), "storm-s-all-synced")
	b.ReportMetric(storm.DialsMean, "storm-dials/box")
	b.ReportMetric(float64(storm.DialsMax), "storm-dials-max/box")
	// The dials a restarted console saw: those made while it was down
	// (refused, and more the longer the desired state takes to move) are
	// no part of how it admits boxes.
	up := window
	up.Since = restart
	if st := f.Stats(up); st.Boxes > 0 {
		b.ReportMetric(st.DialsMean, "storm-dials/box-after-restart")
		b.ReportMetric(float64(st.DialsMax), "storm-dials-max/box-after-restart")
		b.Logf("storm: dials per box after the restart mean %.2f, max %d; failed connects %d (%s)",
			st.DialsMean, st.DialsMax, st.ConnectFailures, st.Failures())
	}
	b.ReportMetric(float64(storm.Dropped), "storm-sessions-dropped")
	var lat []time.Duration
	// Each call's latency by when it began, in spans of 5 s from the
	// restart: where in the storm the slow ones were.
	const span = 5 * time.Second
	var spans [][]time.Duration
	for _, call := range calls {
		lat = append(lat, call.took)
		if i := int(call.at.Sub(restart) / span); i >= 0 {
			for len(spans) <= i {
				spans = append(spans, nil)
			}
			spans[i] = append(spans[i], call.took)
		}
	}
	var bySpan []string
	for i, ds := range spans {
		if len(ds) == 0 {
			continue
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		bySpan = append(bySpan, fmt.Sprintf("+%ds:%d/%v", i*int(span/time.Second), len(ds),
			ds[min(len(ds)-1, int(0.99*float64(len(ds))))].Round(time.Millisecond)))
	}
	b.Logf("storm: API calls/p99 by when they began, in 5 s from the restart: %s", strings.Join(bySpan, " "))
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p := func(q float64) time.Duration { return lat[min(len(lat)-1, int(q*float64(len(lat))))] }
	if shed, err := c.metricSum("edgebox_port_shed_total"); err == nil {
		b.ReportMetric(shed, "storm-shed-conns") // refused or closed early by the port's limits
		// On one line: a benchmark's log keeps only 10.
		var reasons []string
		for _, r := range []string{"addr_connections", "idle_evicted_addr", "idle_evicted", "hello_timeout",
			"addr_handshakes", "handshakes", "box_handshakes", "accept_error"} {
			if n, _ := c.metricSum(`edgebox_port_shed_total{reason="` + r + `"}`); n > 0 {
				reasons = append(reasons, fmt.Sprintf("%s %v", r, n))
			}
		}
		if len(reasons) > 0 {
			b.Logf("shed by the port during the storm: %s", strings.Join(reasons, ", "))
		}
	}
	// The restarted console counts from zero: how the boxes came back.
	resumed, _ := c.metricSum(`edgebox_port_tls_handshakes_total{pool="box",resumed="yes"}`)
	full, _ := c.metricSum(`edgebox_port_tls_handshakes_total{pool="box",resumed="no"}`)
	deferred, _ := c.metricSum(`edgebox_admission_sessions_total{result="deferred"}`)
	abandoned, _ := c.metricSum("edgebox_admission_abandoned_total")
	b.ReportMetric(resumed, "storm-tls-resumed")
	b.ReportMetric(full, "storm-tls-full")
	b.ReportMetric(deferred, "storm-deferred")
	b.Logf("storm: box handshakes %v resumed, %v full; sessions told to come back later %v, abandoned before catching up %v",
		resumed, full, deferred, abandoned)
	if idle != nil {
		b.Log(idleFig)
		b.ReportMetric(idleFig.HeldMean, "storm-idle-held-mean")
		b.ReportMetric(float64(idleFig.Closed), "storm-idle-closed")
		b.ReportMetric(float64(idleFig.Reopened), "storm-idle-reopened")
	}
	b.ReportMetric(back.Seconds(), "storm-s-all-online")
	b.ReportMetric(float64(p(0.50).Microseconds())/1000, "storm-api-p50-ms")
	b.ReportMetric(float64(p(0.99).Microseconds())/1000, "storm-api-p99-ms")
	b.Logf("storm: %d boxes online %v after restart; API p50 %v p99 %v max %v over %d calls",
		n, back.Round(time.Millisecond), p(0.5), p(0.99), lat[len(lat)-1], len(lat))
	if hwm, err := c.peakRSS(); err == nil {
		b.ReportMetric(hwm/(1<<20), "storm-console-peak-rss-MiB")
		b.Logf("storm: the console's peak RSS since its restart %.0f MiB (%.1f KiB per box)", hwm/(1<<20), hwm/1024/float64(n))
	}
}

// peakRSS is the most memory the console has held resident since it
// started (VmHWM).
func (c *consoleProc) peakRSS() (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			var kb float64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%f kB", &kb); err != nil {
				return 0, err
			}
			return kb * 1024, nil
		}
	}
	return 0, errors.New("no VmHWM in /proc/pid/status")
}

// enrollFleet enrolls n boxes, 16 at a time, and returns their data
// directories.
func enrollFleet(b *testing.B, admin *api.Client, n int) []string {
	ctx := context.Background()
	tok, err := admin.CreateToken(ctx, api.TokenRequest{Region: "bench", Site: "lab", Uses: n, TTL: "2h"})
	if err != nil {
		b.Fatal(err)
	}
	dirs := make([]string, n)
	start := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		dirs[i] = b.TempDir()
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, _, err := agent.Enroll(ctx, dirs[i], tok.Text, agent.EnrollOptions{Name: fmt.Sprintf("box-%04d", i)}); err != nil {
				b.Error(err)
			}
		}()
	}
	wg.Wait()
	b.Logf("enrolled %d boxes in %v", n, time.Since(start).Round(time.Millisecond))
	return dirs
}

// startFleet has n boxes enrolled by the simulator's processes, their
// agents not yet started; the caller closes it.
func startFleet(b *testing.B, admin *api.Client, n int) *fleetsim.Fleet {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A few uses more than boxes: a failed enrolment is tried again.
	tok, err := admin.CreateToken(ctx, api.TokenRequest{Region: "bench", Site: "lab", Uses: n + n/100 + 10, TTL: "2h"})
	if err != nil {
		b.Fatal(err)
	}
	cfg := fleetsim.DefaultConfig(n, tok.Text, simDir(b))
	cfg.Processes = envInt(b, "EDGEBOX_BENCH_PROCS", 0)
	cfg.BoxesPerAddr = envInt(b, "EDGEBOX_BENCH_BOXES_PER_ADDR", 8)
	cfg.LogDir = os.Getenv("EDGEBOX_BENCH_SIM_LOGS")
	cfg.ProfileDir = os.Getenv("EDGEBOX_BENCH_SIM_PROFILES")
	cfg.Env = append(cfg.Env, strings.Fields(os.Getenv("EDGEBOX_BENCH_SIM_ENV"))...)
	cfg.Nice = envInt(b, "EDGEBOX_BENCH_SIM_NICE", 0)
	if v := os.Getenv("EDGEBOX_BENCH_REJOIN"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("EDGEBOX_BENCH_REJOIN=%q: want a positive duration", v)
		}
		cfg.Agent.Rejoin = d
	}
	start := time.Now()
	f, err := fleetsim.Start(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("enrolled %d boxes in %v, from %d processes", n, time.Since(start).Round(time.Millisecond), f.Processes())
	return f
}

// waitSynced waits until every box is online and synced by its own
// account, and returns the fleet's figures over w. It looks once a second:
// adding up the events of 15,000 boxes takes CPU from the storm, and the
// figures come from the events' own times, not from when it looked.
func waitSynced(b *testing.B, f *fleetsim.Fleet, w fleetsim.Window) fleetsim.Stats {
	for deadline := time.Now().Add(10 * time.Minute); ; time.Sleep(time.Second) {
		st := f.Stats(w)
		if st.AllSynced {
			return st
		}
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d boxes online and synced after 10 minutes", st.Synced, st.Boxes)
		}
	}
}

// logFleet logs, on one line (a benchmark's log keeps only 10), what the
// fleet's boxes saw: how long until all were online and synced, their
// dials and sessions, and boxes synced against time. With
// EDGEBOX_BENCH_CURVE naming a file, every point of the curve is added
// to it as CSV: what, seconds, boxes up, boxes synced.
func logFleet(b *testing.B, what string, st fleetsim.Stats) {
	var sb strings.Builder
	every := max(1, len(st.Curve)/20)
	for i, p := range st.Curve {
		if i%every == 0 || i == len(st.Curve)-1 {
			fmt.Fprintf(&sb, " +%v:%d", p.After.Round(100*time.Millisecond), p.Synced)
		}
	}
	b.Logf("%s: all %d online and synced after %v; dials per box mean %.2f, max %d; failed connects %d (%s); sessions %d (per box %d to %d), dropped after admission %d; synced against time:%s",
		what, st.Boxes, st.AllSyncedAfter.Round(time.Millisecond), st.DialsMean, st.DialsMax,
		st.ConnectFailures, st.Failures(), st.Sessions, st.SessionsMin, st.SessionsMax, st.Dropped, sb.String())
	if p := os.Getenv("EDGEBOX_BENCH_CURVE"); p != "" {
		out, err := os.OpenFile(p, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		defer out.Close()
		for _, pt := range st.Curve {
			fmt.Fprintf(out, "%s,%.3f,%d,%d\n", what, pt.After.Seconds(), pt.Up, pt.Synced)
		}
	}
}

// waitOnline polls the console until n boxes are online.
func waitOnline(b *testing.B, admin *api.Client, n int, timeout time.Duration, sessions func() (float64, error)) {
	if err := waitOnlineErr(admin, n, timeout, sessions); err != nil {
		b.Fatal(err)
	}
}

// waitOnlineErr is waitOnline, with an error when the time is out. It
// lists every box through the API, as an operator would, but with
// sessions (the console's session gauge) only once that says n are up:
// listing 10,000 boxes four times a second took a sixth of a one-core
// console's time, load no operator puts on it during a storm.
func waitOnlineErr(admin *api.Client, n int, timeout time.Duration, sessions func() (float64, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		online := 0
		var err error
		up := float64(n)
		if sessions != nil {
			up, err = sessions()
		}
		if err == nil && up >= float64(n) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			var bs []api.Box
			bs, err = admin.Boxes(ctx)
			cancel()
			for _, x := range bs {
				if x.Online && x.AgentVersion != "" {
					online++
				}
			}
			if err == nil && online == n {
				return nil
			}
		} else if err == nil {
			online = int(up)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d boxes online after %v (%v)", online, n, timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func fetch(b *testing.B, hc *http.Client, url string) []byte {
	resp, err := hc.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(body) {
		b.Fatal("no CA")
	}
	return body
}

// TestMain runs the test binary as one of a simulated fleet's processes,
// or as BenchmarkFleet's API prober or idle attacker, when the benchmark
// starts it so.
func TestMain(m *testing.M) {
	fleetsim.Main() // a simulated fleet's process runs here and exits
	if url := os.Getenv("EDGEBOX_PROBE_URL"); url != "" {
		probeAPI(url)
		os.Exit(0)
	}
	if addr := os.Getenv("EDGEBOX_IDLE_ADDR"); addr != "" {
		n, _ := strconv.Atoi(os.Getenv("EDGEBOX_IDLE_N"))
		holdIdle(addr, n)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// prober is the operator's calls to the API in a storm, from a process of
// its own (probeAPI), as they would come: the simulated boxes and the
// benchmark's own work do not slow the caller.
type prober struct {
	b     *testing.B
	cmd   *exec.Cmd
	out   bytes.Buffer
	stdin io.WriteCloser
	ended sync.Once
}

// probeCall is one call the prober made: when it began and how long it
// took (10 s for a call that failed).
type probeCall struct {
	at   time.Time
	took time.Duration
}

// startProber starts calling url's API for box, from the moment url
// listens, until stop.
func startProber(b *testing.B, url, token, box string, caPEM []byte) *prober {
	p := &prober{b: b, cmd: exec.Command(os.Args[0])}
	p.cmd.Env = append(os.Environ(), "EDGEBOX_PROBE_URL="+url, "EDGEBOX_PROBE_TOKEN="+token,
		"EDGEBOX_PROBE_BOX="+box, "EDGEBOX_PROBE_CA="+string(caPEM))
	p.cmd.Stdout = &p.out
	p.stdin, _ = p.cmd.StdinPipe()
	if err := p.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.end) // a benchmark that fails before stop
	return p
}

// end tells the prober to stop, and waits for it.
func (p *prober) end() {
	p.ended.Do(func() {
		p.stdin.Close()
		p.cmd.Wait()
	})
}

// stop ends the prober and returns its calls; it fails the benchmark if
// there were none.
func (p *prober) stop() []probeCall {
	p.end()
	var calls []probeCall
	failed := 0
	for _, line := range strings.Split(p.out.String(), "\n") {
		if f, ok := strings.CutPrefix(line, "failed "); ok {
			if failed++; failed <= 5 { // the first few say why
				p.b.Logf("an API call failed: %s", f)
			}
			continue
		}
		v, ok := strings.CutPrefix(line, "lat ")
		if !ok {
			continue
		}
		dur, at, _ := strings.Cut(v, " ")
		d, err := time.ParseDuration(dur)
		ms, err2 := strconv.ParseInt(at, 10, 64)
		if err != nil || err2 != nil {
			continue
		}
		calls = append(calls, probeCall{at: time.UnixMilli(ms), took: d})
	}
	if len(calls) == 0 {
		p.b.Fatalf("the prober measured nothing: %s", p.out.String())
	}
	if failed > 0 {
		p.b.Logf("%d of %d API calls failed", failed, len(calls))
	}
	return calls
}

// probeAPI is the operator in BenchmarkFleet's storm, in a process of its
// own: it calls the API every 10 ms from 4 workers and prints each latency
// until its standard input closes.
func probeAPI(url string) {
	admin, err := api.NewClient(url, os.Getenv("EDGEBOX_PROBE_TOKEN"), []byte(os.Getenv("EDGEBOX_PROBE_CA")))
	if err != nil {
		fmt.Println("error", err)
		return
	}
	var stop atomic.Bool
	go func() { io.Copy(io.Discard, os.Stdin); stop.Store(true) }()
	// From the moment the console listens: a restarting console's port
	// is closed while it opens its store.
	host := strings.TrimPrefix(url, "https://")
	for !stop.Load() {
		if c, err := net.DialTimeout("tcp", host, time.Second); err == nil {
			c.Close()
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				t0 := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := admin.Box(ctx, os.Getenv("EDGEBOX_PROBE_BOX"))
				cancel()
				d := time.Since(t0)
				mu.Lock()
				if err != nil {
					d = 10 * time.Second // a failure counts as the worst case
					fmt.Printf("failed %d %s\n", t0.UnixMilli(), strings.ReplaceAll(err.Error(), "\n", " "))
				}
				fmt.Printf("lat %s %d\n", d, t0.UnixMilli())
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
}

// idleMemory reports what the console holds per idle connected box, from
// figures taken before the boxes came.
func idleMemory(b *testing.B, c *consoleProc, n int, heap0, rss0, stack0, live0, g0 float64) {
	// Idle means no call in flight: the agents' gRPC connections close
	// after 30 s without calls. Wait until the console's goroutines stop
	// falling.
	idleStart := time.Now()
	last, steady := 1e18, 0
	for steady < 3 || time.Since(idleStart) < 40*time.Second {
		time.Sleep(2 * time.Second)
		g, err := c.metric("go_goroutines")
		if err != nil {
			b.Fatal(err)
		}
		if g < last {
			last, steady = g, 0
		} else {
			steady++
		}
		if time.Since(idleStart) > 3*time.Minute {
			break
		}
	}
	b.ReportMetric((last-g0)/float64(n), "goroutines/box")
	heap1, rss1 := c.settledMemory(b, 10*time.Second)
	live1 := c.liveHeap(b)
	if p := os.Getenv("EDGEBOX_BENCH_HEAP_PROFILE"); p != "" {
		req, _ := http.NewRequest(http.MethodGet, c.url+"/debug/pprof/heap?gc=1", nil)
		req.Header.Set("Authorization", "Bearer "+c.token)
		if resp, err := c.hc.Do(req); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			os.WriteFile(p, body, 0o644)
		}
	}
	// RSS once more, after those collections and half a minute for the
	// runtime to hand freed pages back to the system.
	time.Sleep(30 * time.Second)
	_, rss2 := c.settledMemory(b, 5*time.Second)
	stack2, err := c.metric("go_memstats_stack_inuse_bytes")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric((stack2-stack0)/float64(n)/1024, "stack-KiB/box")
	b.ReportMetric((rss2-rss0)/float64(n)/1024, "rss-after-gc-KiB/box")
	heapPer := (heap1 - heap0) / float64(n)
	rssPer := (rss1 - rss0) / float64(n)
	b.ReportMetric(heapPer/1024, "heap-KiB/box")
	b.ReportMetric((live1-live0)/float64(n)/1024, "live-heap-KiB/box")
	b.ReportMetric(rssPer/1024, "rss-KiB/box")
	b.ReportMetric(float64(1<<30)/rssPer, "boxes/GiB-rss")
}
