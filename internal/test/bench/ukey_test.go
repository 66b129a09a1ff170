package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/fake"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/ccidtest"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/internal/test/toxic"
	"github.com/edgebox/edgebox/usbhub"
	"github.com/edgebox/edgebox/usbhub/ccid"
	"github.com/edgebox/edgebox/usbhub/usbdev"
	"github.com/edgebox/edgebox/usbhub/usbip"
)

// Remote UKEYs (ADR 0018): a sign APDU on a key of another box, offered
// on the holder box's loopback USB/IP server, against the link's own
// round trip; the same APDU on the key itself and through USB/IP on
// loopback; and fifty keys carried by the console at once.

// signMsg is what the benchmarks have the card sign.
var signMsg = []byte("statement 2026-11 for account 6222 0000")

// signOnce runs one sign APDU as a host's CCID driver does (its XfrBlock
// on bulk OUT, then the answer read on bulk IN) and returns how long it
// took; the signature is checked after the clock stops.
func signOnce(ctx context.Context, dev usbdev.Device, seq byte) (time.Duration, error) {
	t0 := time.Now()
	r, err := ccidtest.APDU(ctx, dev, seq, ccidtest.SignAPDU(signMsg))
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	_, err = ccidtest.CheckSignature(signMsg, r)
	return d, err
}

// signPipelined runs one sign APDU with its bulk IN submitted beside its
// bulk OUT instead of after it: what a holder's box completing the OUT
// at once (and sending it on behind) would give a host.
func signPipelined(ctx context.Context, dev usbdev.Device, seq byte) (time.Duration, error) {
	type answer struct {
		a   []byte
		err error
	}
	in := make(chan answer, 1)
	t0 := time.Now()
	go func() {
		a, err := ccidtest.ReadAnswer(ctx, dev, seq)
		in <- answer{a, err}
	}()
	_, err := dev.Transfer(ctx, ccid.EndpointOut, ccidtest.Message(ccidtest.XfrBlock, seq, ccidtest.SignAPDU(signMsg)), 0)
	r := <-in
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if r.err != nil {
		return 0, r.err
	}
	_, err = ccidtest.CheckSignature(signMsg, r.a[10:])
	return d, err
}

// latencies are sorted durations.
type latencies []time.Duration

func measure(b *testing.B, n int, seq *byte, one func(seq byte) (time.Duration, error)) latencies {
	b.Helper()
	l := make(latencies, 0, n)
	for range n {
		*seq++
		d, err := one(*seq)
		if err != nil {
			b.Fatal(err)
		}
		l = append(l, d)
	}
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	return l
}

// p is the q-quantile (0.99 of 50 samples is the largest).
func (l latencies) p(q float64) time.Duration { return l[min(len(l)-1, int(q*float64(len(l))))] }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// importOffered imports busID from addr once it is offered there, and
// powers the card and selects its application.
func importOffered(ctx context.Context, addr, busID string) (*usbip.Client, error) {
	for {
		c, err := usbip.Dial(ctx, addr, busID)
		if err == nil {
			if _, err = ccidtest.PowerOn(ctx, c, 1); err == nil {
				err = ccidtest.Select(ctx, c, 2)
			}
			if err == nil {
				return c, nil
			}
			c.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("key %s not offered on %s: %w", busID, addr, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// BenchmarkUKEYRemoteAPDU: a simulated key on box A, leased to a program
// on box B (the fake driver's workload), offered on B's loopback USB/IP
// server; B's tunnel goes through toxiproxy with 40 ms each way. It
// measures the link's round trip with the tunnel's own ping (console to
// box B) in the same run, then sign APDUs from B's loopback: one XfrBlock
// on bulk OUT and its answer on bulk IN, as pcsc-lite's CCID driver does
// them, one after the other; the same with the IN submitted beside the
// OUT; and a 30-APDU signing sequence. Goal: an APDU within 1.2 × the
// round trip.
func BenchmarkUKEYRemoteAPDU(b *testing.B) {
	ctx := context.Background()
	h := testenv.NewInProcess(b, testenv.Options{})
	sim, err := usbhub.NewSim(usbhub.SimConfig{Keys: []usbhub.Device{{Port: "1-1.1", VendorID: "1050", ProductID: "0407",
		Serial: "UK-BENCH1", Class: usbhub.ClassSmartCard}}})
	if err != nil {
		b.Fatal(err)
	}
	tok := h.Token(b, api.TokenRequest{Region: "bench", Site: "lab"})
	hub, err := h.Enroll(b, tok, "key-box")
	if err != nil {
		b.Fatal(err)
	}
	robot, err := h.Enroll(b, h.Token(b, api.TokenRequest{Region: "bench", Site: "lab"}), "robot-box")
	if err != nil {
		b.Fatal(err)
	}
	testenv.StartAgent(b, hub, func(c *agent.Config) { c.USB, c.USBPoll, c.KeyServer = sim, 100*time.Millisecond, "off" })
	proxy := toxic.New(b, strings.TrimPrefix(h.URL(), "https://"))
	keyServer := testenv.FreeAddr(b)
	drv := fake.New("process")
	testenv.StartAgent(b, robot, func(c *agent.Config) {
		c.Drivers, c.Reconcile, c.KeyServer = []runtime.Driver{drv}, time.Second, keyServer
		c.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, proxy.Addr())
		}
	})
	admin := h.Admin()
	if _, err := admin.CreateApp(ctx, "signer", ""); err != nil {
		b.Fatal(err)
	}
	if _, err := admin.CreateRelease(ctx, "signer", api.ReleaseSpec{Version: "1", Runtime: "process", Image: "/bin/signer"}); err != nil {
		b.Fatal(err)
	}
	if _, err := admin.Deploy(ctx, "signer", "1", "box", robot.ID()); err != nil {
		b.Fatal(err)
	}
	testenv.WaitFor(b, 30*time.Second, "the signer running on box B", func() bool { return drv.Copies("1") == 1 })
	var key api.Key
	testenv.WaitFor(b, 30*time.Second, "the key listed", func() bool {
		ks, err := admin.Keys(ctx, hub.ID(), nil)
		if err == nil && len(ks) == 1 {
			key = ks[0]
		}
		return key.ID != ""
	})
	if _, err := admin.Attach(ctx, key.ID, "signer", robot.ID()); err != nil {
		b.Fatal(err)
	}
	ictx, cancel := context.WithTimeout(ctx, 30*time.Second)
	c, err := importOffered(ictx, keyServer, key.ID)
	cancel()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()

	seq := byte(2)
	apdu := func(s byte) (time.Duration, error) { return signOnce(ctx, c, s) }
	measure(b, 5, &seq, apdu) // warm
	near := measure(b, 50, &seq, apdu)

	for _, dir := range []string{"upstream", "downstream"} {
		if err := proxy.Add("rtt-"+dir, "latency", dir, `"latency": 40`); err != nil {
			b.Fatal(err)
		}
	}
	sess, ok := h.Console().Tunnel().Session(robot.ID())
	if !ok {
		b.Fatal("no tunnel session of box B")
	}
	var pings latencies
	for range 20 {
		rtt, err := sess.Ping()
		if err != nil {
			b.Fatal(err)
		}
		pings = append(pings, rtt)
	}
	sort.Slice(pings, func(i, j int) bool { return pings[i] < pings[j] })
	rtt := pings.p(0.5)

	b.ResetTimer()
	measure(b, 3, &seq, apdu) // the first APDUs after the toxics
	far := measure(b, 50, &seq, apdu)
	t0 := time.Now()
	for range 30 {
		seq++
		if _, err := signOnce(ctx, c, seq); err != nil {
			b.Fatal(err)
		}
	}
	sequence := time.Since(t0)
	piped := measure(b, 20, &seq, func(s byte) (time.Duration, error) { return signPipelined(ctx, c, s) })
	b.StopTimer()

	b.ReportMetric(ms(rtt), "rtt-ms")
	b.ReportMetric(ms(far.p(0.5)), "apdu-p50-ms")
	b.ReportMetric(ms(far.p(0.99)), "apdu-p99-ms")
	b.ReportMetric(float64(far.p(0.5))/float64(rtt), "apdu-p50/rtt")
	b.ReportMetric(float64(far.p(0.99))/float64(rtt), "apdu-p99/rtt")
	b.ReportMetric(sequence.Seconds(), "seq30-s")
	b.ReportMetric(ms(piped.p(0.5)), "pipelined-p50-ms")
	b.ReportMetric(ms(near.p(0.5)), "no-delay-p50-ms")
	b.Logf("box B's link: %v round trip (the tunnel's ping, console to box B, median of 20)", rtt.Round(100*time.Microsecond))
	b.Logf("sign APDU from box B's loopback, OUT then IN (50): p50 %v, p99 (the largest) %v, min %v: p50 %.2f × the round trip (goal ≤ 1.2 ×)",
		far.p(0.5).Round(100*time.Microsecond), far.p(0.99).Round(100*time.Microsecond), far[0].Round(100*time.Microsecond), float64(far.p(0.5))/float64(rtt))
	b.Logf("30 sign APDUs one after another: %v (%.1f round trips)", sequence.Round(time.Millisecond), float64(sequence)/float64(rtt))
	b.Logf("sign APDU with its IN beside its OUT (20): p50 %v (%.2f × the round trip)", piped.p(0.5).Round(100*time.Microsecond), float64(piped.p(0.5))/float64(rtt))
	b.Logf("the same APDU before the delay was added (50): p50 %v, p99 %v", near.p(0.5).Round(10*time.Microsecond), near.p(0.99).Round(10*time.Microsecond))
}

// BenchmarkUKEYLocal: a sign APDU (OUT then IN) on the simulated key
// itself, then through a USB/IP server and client on loopback in this
// process (a standard import, as the kernel's vhci-hcd or usbip-win2 make
// on a holder's loopback; and a resumable one, as box B's agent makes
// through the console): what USB/IP adds to an APDU. Goal: at most 1 ms.
func BenchmarkUKEYLocal(b *testing.B) {
	ctx := context.Background()
	const n = 2000
	serve := func() string {
		s := usbip.New(slog.New(slog.DiscardHandler))
		if err := s.Add("1-1", ccid.New(0x1050, 0x0407, "UK-LOCAL")); err != nil {
			b.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Serve(ln) }()
		b.Cleanup(func() { s.Close(); ln.Close(); <-done })
		return ln.Addr().String()
	}
	prepare := func(dev usbdev.Device) {
		if _, err := ccidtest.PowerOn(ctx, dev, 1); err != nil {
			b.Fatal(err)
		}
		if err := ccidtest.Select(ctx, dev, 2); err != nil {
			b.Fatal(err)
		}
	}
	run := func(dev usbdev.Device) latencies {
		prepare(dev)
		seq := byte(2)
		apdu := func(s byte) (time.Duration, error) { return signOnce(ctx, dev, s) }
		measure(b, 100, &seq, apdu) // warm
		return measure(b, n, &seq, apdu)
	}

	b.ResetTimer()
	direct := run(ccid.New(0x1050, 0x0407, "UK-LOCAL"))

	c, err := usbip.Dial(ctx, serve(), "1-1")
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	imported := run(c)

	addr := serve()
	r, err := usbip.ImportResumable(ctx, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}, "1-1", 10*time.Second, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	resumable := run(r)
	b.StopTimer()

	added := imported.p(0.5) - direct.p(0.5)
	b.ReportMetric(float64(direct.p(0.5).Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64(imported.p(0.5).Microseconds()), "usbip-p50-µs")
	b.ReportMetric(float64(imported.p(0.99).Microseconds()), "usbip-p99-µs")
	b.ReportMetric(float64(resumable.p(0.5).Microseconds()), "resumable-p50-µs")
	b.ReportMetric(float64(added.Microseconds()), "added-p50-µs")
	b.Logf("sign APDU, %d each: on the key p50 %v p99 %v; through USB/IP on loopback p50 %v p99 %v (resumable: p50 %v p99 %v); USB/IP adds %v at p50 (goal ≤ 1 ms)",
		n, direct.p(0.5), direct.p(0.99), imported.p(0.5), imported.p(0.99), resumable.p(0.5), resumable.p(0.99), added)
}

// BenchmarkUKEYFifty: fifty simulated keys, each leased to a workload of
// another box (the fake driver's) and signing there through that box's
// loopback USB/IP server, all at once, each at a robot's pace (a
// signature every 200 ms), for 20 s. The console runs as its binary, so
// its CPU time (process_cpu_seconds_total) and heap in use (after forced
// collections) are its own; the agents and the workloads' clients run in
// this process. Both are compared with the same console before any key
// was carried.
//
// The keys sit on EDGEBOX_BENCH_UKEY_KEY_BOXES boxes and their workloads
// on EDGEBOX_BENCH_UKEY_HOLDER_BOXES boxes (one each unless set: a hub of
// fifty keys used from one box). If some keys do not get through, the
// benchmark says how many did.
func BenchmarkUKEYFifty(b *testing.B) {
	const n = 50
	const every, signFor = 200 * time.Millisecond, 20 * time.Second
	ctx := context.Background()
	keyBoxes := max(1, envInt(b, "EDGEBOX_BENCH_UKEY_KEY_BOXES", 1))
	holderBoxes := max(1, envInt(b, "EDGEBOX_BENCH_UKEY_HOLDER_BOXES", 1))
	c, _, admin := startConsole(b)
	defer c.kill()
	dirs := enrollFleet(b, admin, keyBoxes+holderBoxes)

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	actx, stopAgents := context.WithCancel(ctx)
	var agents sync.WaitGroup
	defer func() { stopAgents(); agents.Wait() }()
	start := func(dir string, adjust func(*agent.Config)) string {
		cfg := agent.DefaultConfig(dir)
		cfg.Version = "bench"
		adjust(&cfg)
		a, err := agent.New(cfg, quiet)
		if err != nil {
			b.Fatal(err)
		}
		agents.Add(1)
		go func() { defer agents.Done(); a.Run(actx) }()
		return a.Identity().BoxID
	}
	// Key j sits on key box j%keyBoxes, in a hub of ten; its workload
	// robot-j runs on holder box j%holderBoxes.
	keyBoxOf := map[string]int{}
	for i := range keyBoxes {
		sim, err := usbhub.NewSim(usbhub.SimConfig{})
		if err != nil {
			b.Fatal(err)
		}
		for j := i; j < n; j += keyBoxes {
			if err := sim.Plug(usbhub.Device{Port: fmt.Sprintf("1-%d.%d", j/10+1, j%10+1), VendorID: "1050", ProductID: "0407",
				Serial: fmt.Sprintf("UK-%04d", j), Class: usbhub.ClassSmartCard}); err != nil {
				b.Fatal(err)
			}
		}
		keyBoxOf[start(dirs[i], func(c *agent.Config) { c.USB, c.USBPoll, c.KeyServer = sim, 500*time.Millisecond, "off" })] = i
	}
	type holder struct {
		id, keyServer string
		drv           *fake.Driver
	}
	holders := make([]holder, holderBoxes)
	for i := range holders {
		h := holder{keyServer: testenv.FreeAddr(b), drv: fake.New("process")}
		h.id = start(dirs[keyBoxes+i], func(c *agent.Config) {
			c.Drivers, c.Reconcile, c.KeyServer = []runtime.Driver{h.drv}, time.Second, h.keyServer
		})
		holders[i] = h
	}
	waitOnline(b, admin, keyBoxes+holderBoxes, 2*time.Minute, nil)
	for j := range n {
		h := holders[j%holderBoxes]
		spec := json.RawMessage(fmt.Sprintf(`{"app":"robot-%02d","release":"1","runtime":"process"}`, j))
		if _, err := admin.PutDesired(ctx, h.id, "Workload", fmt.Sprintf("robot-%02d", j), spec); err != nil {
			b.Fatal(err)
		}
	}
	testenv.WaitFor(b, time.Minute, "the fifty workloads running", func() bool {
		running := 0
		for _, h := range holders {
			running += len(h.drv.Running())
		}
		return running == n
	})
	keyIDs := make([]string, n)
	testenv.WaitFor(b, time.Minute, "the fifty keys listed", func() bool {
		ks, err := admin.Keys(ctx, "", nil)
		if err != nil {
			return false
		}
		found := 0
		for _, k := range ks {
			if j, err := strconv.Atoi(strings.TrimPrefix(k.Serial, "UK-")); err == nil && j < n && k.State == "present" {
				keyIDs[j] = k.ID
				found++
			}
		}
		return found == n
	})

	// The console before it carries any key.
	cpu := func() float64 {
		v, err := c.metric("process_cpu_seconds_total")
		if err != nil {
			b.Fatal(err)
		}
		return v
	}
	goroutines := func() float64 {
		v, err := c.metric("go_goroutines")
		if err != nil {
			b.Fatal(err)
		}
		return v
	}
	heap0, g0 := c.liveHeap(b), goroutines()
	cpu0, self0, t0 := cpu(), selfCPU(b), time.Now()
	time.Sleep(signFor / 2)
	idleCPU := (cpu() - cpu0) / time.Since(t0).Seconds()
	idleSelf := (selfCPU(b) - self0) / time.Since(t0).Seconds()

	for j, id := range keyIDs {
		if _, err := admin.Attach(ctx, id, fmt.Sprintf("robot-%02d", j), holders[j%holderBoxes].id); err != nil {
			b.Fatal(err)
		}
	}
	// Each workload imports its key from its box's loopback once it is
	// offered, then signs every 200 ms until told to stop.
	var ready, signed, failed atomic.Int64
	var latMu sync.Mutex
	var lat latencies
	measuring := make(chan struct{})
	stop := make(chan struct{})
	var workloads sync.WaitGroup
	readyBy := time.Now().Add(90 * time.Second)
	for j, id := range keyIDs {
		workloads.Add(1)
		go func() {
			defer workloads.Done()
			ictx, cancel := context.WithDeadline(ctx, readyBy)
			k, err := importOffered(ictx, holders[j%holderBoxes].keyServer, id)
			cancel()
			if err != nil {
				return
			}
			defer k.Close()
			ready.Add(1)
			seq := byte(2)
			// Spread over the period, as robots working on their own are.
			time.Sleep(time.Duration(j) * every / n)
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				seq++
				d, err := signOnce(ctx, k, seq)
				select {
				case <-measuring:
					if err != nil {
						failed.Add(1)
						continue
					}
					signed.Add(1)
					latMu.Lock()
					lat = append(lat, d)
					latMu.Unlock()
				default:
				}
				if err != nil {
					return
				}
			}
		}()
	}
	for time.Now().Before(readyBy) && ready.Load() < n {
		time.Sleep(100 * time.Millisecond)
	}
	keys := ready.Load()
	if keys == 0 {
		close(stop)
		workloads.Wait()
		b.Fatal("no key was offered on its holder's loopback")
	}
	if keys < n {
		b.Logf("only %d of %d keys were offered on their holders' loopback within 90 s", keys, n)
	}
	time.Sleep(2 * time.Second) // every key signing

	b.ResetTimer()
	cpu1, self1, t1 := cpu(), selfCPU(b), time.Now()
	close(measuring)
	time.Sleep(signFor)
	secs := time.Since(t1).Seconds()
	busyCPU := (cpu() - cpu1) / secs
	busySelf := (selfCPU(b) - self1) / secs
	apdus, failures := signed.Load(), failed.Load()
	heap1, g1 := c.liveHeap(b), goroutines()
	b.StopTimer()
	close(stop)
	workloads.Wait()

	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	perKey := func(v float64) float64 { return v / float64(keys) }
	b.ReportMetric(float64(keys), "keys-signing")
	b.ReportMetric(float64(apdus)/secs, "apdu/s")
	b.ReportMetric(float64(failures), "apdu-failed")
	b.ReportMetric(perKey(100*(busyCPU-idleCPU)), "console-cpu-%/key")
	b.ReportMetric((busyCPU-idleCPU)*secs/float64(apdus)*1e6, "console-cpu-µs/apdu")
	b.ReportMetric(perKey(heap1-heap0)/1024, "console-heap-KiB/key")
	b.ReportMetric(perKey(g1-g0), "console-goroutines/key")
	b.ReportMetric(perKey(100*(busySelf-idleSelf)), "agents+clients-cpu-%/key")
	if len(lat) > 0 {
		b.ReportMetric(ms(lat.p(0.5)), "apdu-p50-ms")
		b.ReportMetric(ms(lat.p(0.99)), "apdu-p99-ms")
		b.Logf("APDUs under load: p50 %v, p99 %v, over %d", lat.p(0.5).Round(10*time.Microsecond), lat.p(0.99).Round(10*time.Microsecond), len(lat))
	}
	b.Logf("%d keys on %d boxes, used from %d boxes, each signing every %v for %v: %d APDUs (%.0f/s), %d failed",
		keys, keyBoxes, holderBoxes, every, signFor, apdus, float64(apdus)/secs, failures)
	b.Logf("the console (its own process): CPU %.1f %% of a core idle, %.1f %% carrying the keys; heap in use %.1f → %.1f MiB; goroutines %.0f → %.0f",
		100*idleCPU, 100*busyCPU, heap0/(1<<20), heap1/(1<<20), g0, g1)
	b.Logf("the agents and the workloads' clients (this process): CPU %.1f %% of a core idle, %.1f %% with the keys signing", 100*idleSelf, 100*busySelf)
}

// selfCPU is this process's CPU time so far, user and system, in
// seconds.
func selfCPU(b *testing.B) float64 {
	raw, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command's closing parenthesis; utime and
	// stime are the 14th and 15th of the line, in clock ticks (100 a
	// second on Linux).
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100
}
