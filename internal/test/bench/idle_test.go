package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// idlePerAddr is how many of the idle holder's connections share one
// source address: well under the console's 256 a address
// (port.Config.MaxConnsPerAddr), so that only its limit on idle
// connections in all (MaxIdle, 4,096) closes them early, as it would for
// an attacker with many addresses.
const idlePerAddr = 64

// idleFilesSpare is the open files the benchmark's process keeps for
// itself beside the idle holder's connections: pipes to the fleet's
// processes and the prober, HTTP clients, files.
const idleFilesSpare = 512

// idleHolder is a hostile client in the benchmark's own process: n TCP
// connections to the console's public port that never send a byte, from
// source addresses 127.2.x.y, idlePerAddr to an address. Each of its n
// slots dials, waits until the console closes the connection, pauses
// between pause and twice pause, and dials again, so that n connections
// are attempted at all times; a failed dial pauses likewise. A sampler
// records how many are open every 100 ms.
//
// Its goroutines (one per slot, and the sampler) end when stop is called;
// stop closes every connection and waits for them.
type idleHolder struct {
	addr  string
	n     int
	pause time.Duration

	ctx    context.Context // cancelled by stop
	cancel context.CancelFunc
	wg     sync.WaitGroup // the slots and the sampler
	once   sync.Once      // stop's

	// restarted is 1 once the console has been started again: a
	// connection opened after it is the restarted console's.
	restarted atomic.Int32

	open  atomic.Int64 // connections open now
	tried atomic.Int64 // slots that have made their first dial
	// Since the restart: connections opened by slots that had held one
	// before, connections the restarted console closed, failed dials.
	reopened, closed, failed atomic.Int64

	mu      sync.Mutex // guards samples
	samples []idleSample
}

// idleSample is how many connections were open at t.
type idleSample struct {
	t    time.Time
	open int64
}

// idleAddr is the holder's source address number i: 127.2.x.y, 250 a
// block, apart from the fleet's 127.1.x.y and the prober's 127.0.0.1.
func idleAddr(i int) net.IP {
	return net.IPv4(127, 2+byte(i/(250*256)), byte(i/250%256), byte(i%250+1))
}

// startIdleHolder raises the process's open-file limit to its hard
// limit, checks that n connections fit in it, and starts the holder.
func startIdleHolder(addr string, n int, pause time.Duration) (*idleHolder, error) {
	if n <= 0 || pause <= 0 {
		return nil, fmt.Errorf("idle holder: want a positive number of connections and pause, have %d and %v", n, pause)
	}
	if (n+idlePerAddr-1)/idlePerAddr > 253*250*256 {
		return nil, fmt.Errorf("idle holder: %d connections need more source addresses than 127.2.0.0–127.255.255.255 hold", n)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return nil, fmt.Errorf("idle holder: reading the open-file limit: %w", err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return nil, fmt.Errorf("idle holder: raising the open-file limit to %d: %w", lim.Max, err)
		}
	}
	used := 0
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		used = len(fds)
	}
	if need := uint64(n + used + idleFilesSpare); need > lim.Cur {
		return nil, fmt.Errorf("idle holder: %d connections need %d open files with the %d this process holds, and its limit is %d",
			n, need, used, lim.Cur)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &idleHolder{addr: addr, n: n, pause: pause, ctx: ctx, cancel: cancel}
	for i := range n {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: idleAddr(i / idlePerAddr)}, Timeout: 5 * time.Second}
		h.wg.Add(1)
		// The first dials are spread over a second, not all in one
		// instant: the attacker holds connections, it does not flood.
		go h.slot(d, rand.N(time.Second))
	}
	h.wg.Add(1)
	go h.sample()
	return h, nil
}

// slot keeps one connection attempted until the holder stops.
func (h *idleHolder) slot(d *net.Dialer, delay time.Duration) {
	defer h.wg.Done()
	if !h.sleep(delay) {
		return
	}
	held := false // this slot has had a connection
	buf := make([]byte, 1)
	for first := true; ; first = false {
		c, err := d.DialContext(h.ctx, "tcp", h.addr)
		if first {
			h.tried.Add(1)
		}
		if h.ctx.Err() != nil {
			if err == nil {
				c.Close()
			}
			return
		}
		restarted := h.restarted.Load() == 1
		if err != nil {
			if restarted {
				h.failed.Add(1)
			}
		} else {
			h.open.Add(1)
			if held && restarted {
				h.reopened.Add(1)
			}
			held = true
			stop := context.AfterFunc(h.ctx, func() { c.Close() })
			for {
				// The console sends nothing before a ClientHello; any
				// error, EOF among them, is the console closing it (or
				// stop).
				if _, err := c.Read(buf); err != nil {
					break
				}
			}
			stop()
			c.Close()
			h.open.Add(-1)
			if h.ctx.Err() != nil {
				return
			}
			if restarted {
				h.closed.Add(1)
			}
		}
		if !h.sleep(h.pause + rand.N(h.pause)) {
			return
		}
	}
}

// sleep waits d, and reports false when the holder stopped first.
func (h *idleHolder) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-h.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// sample records how many connections are open, every 100 ms.
func (h *idleHolder) sample() {
	defer h.wg.Done()
	tk := time.NewTicker(100 * time.Millisecond)
	defer tk.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case t := <-tk.C:
			h.mu.Lock()
			h.samples = append(h.samples, idleSample{t: t, open: h.open.Load()})
			h.mu.Unlock()
		}
	}
}

// waitTried waits until every slot has made its first dial, or timeout.
func (h *idleHolder) waitTried(timeout time.Duration) {
	for end := time.Now().Add(timeout); h.tried.Load() < int64(h.n) && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
}

// markRestart tells the holder the console is being started again: from
// now its counts are the storm's.
func (h *idleHolder) markRestart() { h.restarted.Store(1) }

// stop ends every slot and the sampler, closing every connection, and
// waits for them. It may be called more than once.
func (h *idleHolder) stop() {
	h.once.Do(func() {
		h.cancel()
		h.wg.Wait()
	})
}

// idleFigures are the holder's figures over a stretch of the storm.
type idleFigures struct {
	Wanted           int
	AtKill           int64   // open just before the console was killed
	HeldMean         float64 // open on average from the restart to the end
	HeldMax          int64
	Reopened, Closed int64 // since the restart
	FailedDials      int64
	Seconds          float64 // from the restart to the end
	Curve            string  // open against time since the kill
}

// figures adds up the samples: the connections open at killed, and from
// restart to end; its counts since the restart are those of the moment it
// is called, so call it at end.
func (h *idleHolder) figures(killed, restart, end time.Time) idleFigures {
	h.mu.Lock()
	samples := append([]idleSample(nil), h.samples...)
	h.mu.Unlock()
	f := idleFigures{Wanted: h.n, Reopened: h.reopened.Load(), Closed: h.closed.Load(),
		FailedDials: h.failed.Load(), Seconds: end.Sub(restart).Seconds()}
	var sum float64
	var n int
	var storm []idleSample
	for _, s := range samples {
		if !s.t.After(killed) {
			f.AtKill = s.open
		}
		if !s.t.Before(restart) && !s.t.After(end) {
			sum += float64(s.open)
			n++
			f.HeldMax = max(f.HeldMax, s.open)
		}
		if s.t.After(killed) && !s.t.After(end) {
			storm = append(storm, s)
		}
	}
	if n > 0 {
		f.HeldMean = sum / float64(n)
	}
	var sb strings.Builder
	every := max(1, len(storm)/12)
	for i, s := range storm {
		if i%every == 0 || i == len(storm)-1 {
			fmt.Fprintf(&sb, " +%v:%d", s.t.Sub(killed).Round(100*time.Millisecond), s.open)
		}
	}
	f.Curve = sb.String()
	return f
}

// String is the benchmark's log line for the holder.
func (f idleFigures) String() string {
	perSecond := func(n int64) float64 {
		if f.Seconds <= 0 {
			return 0
		}
		return float64(n) / f.Seconds
	}
	return fmt.Sprintf("idle connections: wanted %d, held %d at the kill; from the restart to the storm's end (%.1f s) held %.0f on average (max %d), closed by the console %d (%.0f/s), reopened %d (%.0f/s), failed dials %d; held against time since the kill:%s",
		f.Wanted, f.AtKill, f.Seconds, f.HeldMean, f.HeldMax, f.Closed, perSecond(f.Closed), f.Reopened, perSecond(f.Reopened), f.FailedDials, f.Curve)
}
