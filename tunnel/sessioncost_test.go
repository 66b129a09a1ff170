package tunnel

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The boxes of BenchmarkSessionCost run in a child process (this test
// binary, started again with sessionCostEnv set), so that the benchmark
// process holds only the console side.
const sessionCostEnv = "EDGEBOX_SESSION_COST_BOXES"

func TestMain(m *testing.M) {
	if os.Getenv(sessionCostEnv) != "" {
		if err := runCostBoxes(); err != nil {
			fmt.Fprintln(os.Stderr, "boxes:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// BenchmarkSessionCost measures what the console side of the tunnel alone
// holds per connected box (2,000 unless EDGEBOX_BENCH_BOXES says
// otherwise): TLS, yamux and the tunnel's Session, with nothing of the
// console on top. It reports the cost of a box that only connected, then
// of the same boxes after a small exchange (1 KiB each way on one stream),
// after a bulk one (1 MiB each way), and once the boxes renewed their
// sessions (Renewal, here after 15 quiet seconds), all idle when measured.
func BenchmarkSessionCost(b *testing.B) {
	n := 2000
	if s := os.Getenv("EDGEBOX_BENCH_BOXES"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			b.Fatal(err)
		}
		n = v
	}
	for range b.N {
		sessionCost(b, n)
	}
}

// memory is the console side's memory at one moment, after collecting.
type memory struct {
	objects, unused, stacks, rss float64
	goroutines                   int
}

func measure() memory {
	runtime.GC()
	runtime.GC()
	debug.FreeOSMemory()
	s := []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/memory/classes/heap/stacks:bytes"},
	}
	metrics.Read(s)
	m := memory{
		objects: float64(s[0].Value.Uint64()), unused: float64(s[1].Value.Uint64()),
		stacks: float64(s[2].Value.Uint64()), goroutines: runtime.NumGoroutine(),
	}
	if raw, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(raw)); len(f) > 1 {
			pages, _ := strconv.Atoi(f[1])
			m.rss = float64(pages * os.Getpagesize())
		}
	}
	return m
}

func (m memory) report(b *testing.B, base memory, n int, stage string) {
	per := func(v float64) float64 { return v / float64(n) / 1024 }
	b.ReportMetric(per(m.objects-base.objects), stage+"-live-KiB/box")
	b.ReportMetric(per(m.unused-base.unused), stage+"-unused-KiB/box")
	b.ReportMetric(per(m.stacks-base.stacks), stage+"-stack-KiB/box")
	b.ReportMetric(per(m.rss-base.rss), stage+"-rss-KiB/box")
	b.ReportMetric(float64(m.goroutines-base.goroutines)/float64(n), stage+"-goroutines/box")
}

func sessionCost(b *testing.B, n int) {
	if os.Getenv("EDGEBOX_BENCH_HEAP_PROFILE") != "" {
		runtime.MemProfileRate = 1 // every allocation, for the profile written at the end
	}
	p := newTestPKI(b)
	ts := startTestServer(b, p, DefaultConfig(), "")
	// The console's side of every exchange: read what the box sends, send
	// as much back.
	echo := ts.Listen(KindForward)
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var size [8]byte
				if _, err := io.ReadFull(c, size[:]); err != nil {
					return
				}
				l := int64(binary.BigEndian.Uint64(size[:]))
				if _, err := io.CopyN(io.Discard, c, l); err != nil {
					return
				}
				io.CopyN(c, zeros{}, l)
			}()
		}
	}()
	dir := b.TempDir()
	caKey, err := x509.MarshalECPrivateKey(p.caKey)
	if err != nil {
		b.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "ca.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.ca.Raw}), 0o600)
	os.WriteFile(filepath.Join(dir, "ca.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: caKey}), 0o600)

	base := measure()
	child := exec.Command(os.Args[0])
	child.Env = append(os.Environ(), sessionCostEnv+"="+strconv.Itoa(n), "EDGEBOX_SESSION_COST_ADDR="+ts.addr, "EDGEBOX_SESSION_COST_DIR="+dir)
	child.Stderr = os.Stderr
	stdin, err := child.StdinPipe() // the boxes stop when it closes
	if err != nil {
		b.Fatal(err)
	}
	out, err := child.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := child.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { stdin.Close(); child.Wait() }()

	deadline := time.Now().Add(5 * time.Minute)
	for len(ts.Sessions()) < n {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d boxes connected", len(ts.Sessions()), n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	measure().report(b, base, n, "idle")

	// Each exchange is asked of the boxes through the child's stdin; the
	// child answers one line when every box is done.
	answers := bufio.NewScanner(out)
	for _, stage := range []struct {
		name string
		size int
	}{{"small", 1 << 10}, {"bulk", 1 << 20}} {
		fmt.Fprintln(stdin, stage.size)
		if !answers.Scan() || answers.Text() != "done" {
			b.Fatalf("boxes: %q (%v)", answers.Text(), answers.Err())
		}
		time.Sleep(2 * time.Second)
		measure().report(b, base, n, stage.name)
	}
	bulkDone := time.Now()
	deadline = time.Now().Add(3 * time.Minute)
	for {
		renewed := 0
		for _, s := range ts.Sessions() {
			if s.Started().After(bulkDone) {
				renewed++
			}
		}
		if renewed == n {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d boxes renewed their sessions", renewed, n)
		}
		time.Sleep(time.Second)
	}
	time.Sleep(2 * time.Second)
	measure().report(b, base, n, "renewed")
	if path := os.Getenv("EDGEBOX_BENCH_HEAP_PROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			b.Fatal(err)
		}
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// runCostBoxes runs the boxes of BenchmarkSessionCost: n tunnel clients,
// each with a certificate of its own. For each size read from stdin,
// every box sends that many bytes to the console and reads as many back,
// then "done" is printed. The boxes stop when stdin closes.
func runCostBoxes() error {
	n, err := strconv.Atoi(os.Getenv(sessionCostEnv))
	if err != nil {
		return err
	}
	dir := os.Getenv("EDGEBOX_SESSION_COST_DIR")
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		return err
	}
	cb, _ := pem.Decode(caPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return fmt.Errorf("no PEM in %s", dir)
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return err
	}
	caKey, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return err
	}
	p := &testPKI{ca: ca, caKey: caKey, pool: x509.NewCertPool()}
	p.pool.AddCert(ca)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	clients := make([]*Client, n)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i := range clients {
		cert, err := p.makeLeaf(fmt.Sprintf("box-%d", i), x509.ExtKeyUsageClientAuth)
		if err != nil {
			return err
		}
		cfg := ClientConfig{
			Config: DefaultConfig(), Addr: os.Getenv("EDGEBOX_SESSION_COST_ADDR"),
			TLS:   &tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{cert}},
			Proxy: func(*url.URL) (*url.URL, error) { return nil, nil },
			Renew: Renewal{After: 1 << 20, Idle: 15 * time.Second},
		}
		c, err := NewClient(cfg, quiet)
		if err != nil {
			return err
		}
		clients[i] = c
		wg.Add(1)
		go func() { defer wg.Done(); c.Run(ctx) }()
	}

	var size int64
	for {
		if _, err := fmt.Fscanln(os.Stdin, &size); err != nil {
			return nil // stdin closed: the benchmark is over
		}
		errs := make(chan error, n)
		sem := make(chan struct{}, 32)
		for _, c := range clients {
			sem <- struct{}{}
			go func() {
				defer func() { <-sem }()
				errs <- exchange(ctx, c, size)
			}()
		}
		var failed error
		for range clients {
			if err := <-errs; err != nil && failed == nil {
				failed = err
			}
		}
		if failed != nil {
			fmt.Println("failed:", failed)
			continue
		}
		fmt.Println("done")
	}
}

// exchange sends size bytes to the console's echo and reads them back.
func exchange(ctx context.Context, c *Client, size int64) error {
	conn, err := c.Open(ctx, KindForward, nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	var hdr [8]byte
	binary.BigEndian.PutUint64(hdr[:], uint64(size))
	if _, err := conn.Write(hdr[:]); err != nil {
		return err
	}
	go io.CopyN(conn, zeros{}, size)
	_, err = io.CopyN(io.Discard, conn, size)
	return err
}
