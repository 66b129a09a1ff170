// Package health runs workloads' probes: exec inside the workload, HTTP
// and TCP from the box. Each probed workload has one goroutine that checks
// it every period and keeps its verdict: healthy after a passing check,
// unhealthy after failure_threshold failures in a row.
package health

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Health of a workload, as ObjectStatus.health carries it.
const (
	Unknown   = ""
	Healthy   = edgeboxv1.Healthy
	Unhealthy = edgeboxv1.Unhealthy
)

// Verdict is what the probes make of a workload now.
type Verdict struct {
	Health string
	// Reason is the last failure, for status.
	Reason string
}

// Prober watches workloads. Its zero value is not usable; use New.
type Prober struct {
	changed func() // called when a verdict changes
	ctx     context.Context
	mu      sync.Mutex
	watches map[string]*watch
	wg      sync.WaitGroup
	http    *http.Client
}

type watch struct {
	key     string // the spec the probes belong to
	cancel  context.CancelFunc
	verdict Verdict
}

// New returns a prober whose goroutines end with ctx; changed is called
// (from those goroutines) whenever a verdict changes.
func New(ctx context.Context, changed func()) *Prober {
	return &Prober{ctx: ctx, changed: changed, watches: map[string]*watch{},
		http: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// Watch probes workload name with probes, keyed by key (the workload's
// spec hash and start time): a new key starts over from Unknown.
func (p *Prober) Watch(name, key string, probes []*edgeboxv1.Probe, ex runtime.Execer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if w := p.watches[name]; w != nil {
		if w.key == key {
			return
		}
		w.cancel()
	}
	ctx, cancel := context.WithCancel(p.ctx)
	w := &watch{key: key, cancel: cancel}
	p.watches[name] = w
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.run(ctx, name, w, probes, ex)
	}()
}

// Forget stops probing name.
func (p *Prober) Forget(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if w := p.watches[name]; w != nil {
		w.cancel()
		delete(p.watches, name)
	}
}

// Verdict returns what the probes say of name.
func (p *Prober) Verdict(name string) Verdict {
	p.mu.Lock()
	defer p.mu.Unlock()
	if w := p.watches[name]; w != nil {
		return w.verdict
	}
	return Verdict{}
}

// Wait waits for every probing goroutine to end (after ctx ended).
func (p *Prober) Wait() { p.wg.Wait() }

func secs(v, def uint32) time.Duration {
	if v == 0 {
		v = def
	}
	return time.Duration(v) * time.Second
}

// run checks every probe each period until ctx ends.
func (p *Prober) run(ctx context.Context, name string, w *watch, probes []*edgeboxv1.Probe, ex runtime.Execer) {
	if len(probes) == 0 {
		return
	}
	first := probes[0]
	period := secs(first.GetPeriodSeconds(), 10)
	threshold := int(first.GetFailureThreshold())
	if threshold == 0 {
		threshold = 3
	}
	t := time.NewTimer(secs(first.GetInitialDelaySeconds(), 0))
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var err error
		for _, pr := range probes {
			if err = p.check(ctx, name, pr, ex); err != nil {
				break
			}
		}
		if ctx.Err() != nil {
			return
		}
		next := w.verdict
		if err == nil {
			failures = 0
			next = Verdict{Health: Healthy}
		} else {
			failures++
			next.Reason = fmt.Sprintf("probe failed %d times in a row: %v", failures, err)
			if failures >= threshold {
				next.Health = Unhealthy
			}
		}
		p.mu.Lock()
		moved := w.verdict.Health != next.Health
		w.verdict = next
		p.mu.Unlock()
		if moved {
			p.changed()
		}
		t.Reset(period)
	}
}

// check runs one probe once.
func (p *Prober) check(ctx context.Context, name string, pr *edgeboxv1.Probe, ex runtime.Execer) error {
	ctx, cancel := context.WithTimeout(ctx, secs(pr.GetTimeoutSeconds(), 1))
	defer cancel()
	switch {
	case len(pr.GetExec()) > 0:
		if ex == nil {
			return errors.New("this runtime cannot run exec probes")
		}
		code, err := ex.Exec(ctx, name, pr.GetExec(), io.Discard, io.Discard)
		if err != nil {
			return err
		}
		if code != 0 {
			return fmt.Errorf("%q exited with code %d", pr.GetExec()[0], code)
		}
	case pr.GetHttp() != "":
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, pr.GetHttp(), nil)
		if err != nil {
			return err
		}
		resp, err := p.http.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if resp.StatusCode >= 400 {
			return fmt.Errorf("GET %s: %s", pr.GetHttp(), resp.Status)
		}
	case pr.GetTcp() != "":
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", pr.GetTcp())
		if err != nil {
			return err
		}
		c.Close()
	default:
		return errors.New("a probe needs exec, http or tcp")
	}
	return nil
}
