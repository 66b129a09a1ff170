// Package leader runs the console's once-only controllers (app sync,
// rollouts, compaction, alerts) on one console at a time among those
// that share a store. A console alone on its store always leads; consoles
// sharing an etcd cluster hold one election a controller, each under an
// etcd lease: a leader that dies loses it when its lease ends, and
// another console's campaign wins then. The controllers keep their state
// in the store and guard their writes by revision, so a new leader
// carries on where the old one stopped, and a leader that lost its lease
// without knowing yet (a pause, a partition) cannot write over it.
package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Elector runs work only while this console leads for it.
type Elector interface {
	// Lead runs work whenever this console leads for name, until ctx
	// ends. work's context ends when the lead is lost, and Lead campaigns
	// again. Lead returns nil when ctx ended, or the error of a work that
	// failed, or returned by itself, while leading.
	Lead(ctx context.Context, name string, work func(context.Context) error) error
}

// Alone is the Elector of a console that shares its store with none: it
// always leads.
type Alone struct{}

// Lead runs work until ctx ends.
func (Alone) Lead(ctx context.Context, _ string, work func(context.Context) error) error {
	return work(ctx)
}

// Etcd elects among the consoles sharing an etcd cluster.
type Etcd struct {
	cli    *clientv3.Client
	prefix string // the elections live under prefix + "leader/"
	id     string // this console, as the other consoles see the leader
	ttl    time.Duration
	log    *slog.Logger
	gauge  *prometheus.GaugeVec
}

// NewEtcd returns an elector on cli; ttl is the lease a leader holds
// (whole seconds, at least 1): how long a dead leader leads.
func NewEtcd(cli *clientv3.Client, prefix, id string, ttl time.Duration, reg prometheus.Registerer, log *slog.Logger) (*Etcd, error) {
	if ttl < time.Second {
		return nil, fmt.Errorf("leader: a lease of %v; at least 1s", ttl)
	}
	e := &Etcd{cli: cli, prefix: prefix, id: id, ttl: ttl, log: log,
		gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "edgebox", Subsystem: "console", Name: "leader",
			Help: "1 for each controller this console runs now, as the leader of the consoles sharing its store; 0 for those another runs."},
			[]string{"controller"})}
	if reg != nil {
		if err := reg.Register(e.gauge); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// errStopped is work that returned while leading, ctx still on.
var errStopped = errors.New("stopped by itself")

// Lead campaigns for name, runs work while leading, and campaigns again
// when the lead is lost, until ctx ends.
func (e *Etcd) Lead(ctx context.Context, name string, work func(context.Context) error) error {
	e.gauge.WithLabelValues(name).Set(0)
	for ctx.Err() == nil {
		lost, err := e.term(ctx, name, work)
		if err != nil {
			return err
		}
		if lost {
			// The lease ended under it: a new session, after a breath.
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

// term is one campaign and, once won, one term as leader. It says
// whether the lead was lost (the session ended under it), or the error
// work ended with.
func (e *Etcd) term(ctx context.Context, name string, work func(context.Context) error) (lost bool, _ error) {
	s, err := concurrency.NewSession(e.cli, concurrency.WithTTL(int(e.ttl/time.Second)), concurrency.WithContext(ctx))
	if err != nil {
		if ctx.Err() == nil {
			e.log.Warn("cannot campaign: no etcd session", "controller", name, "err", err)
		}
		return true, nil
	}
	defer s.Close()
	el := concurrency.NewElection(s, e.prefix+"leader/"+name)
	if err := el.Campaign(ctx, e.id); err != nil {
		if ctx.Err() == nil {
			e.log.Warn("campaign failed", "controller", name, "err", err)
		}
		return true, nil
	}
	e.log.Info("leading", "controller", name, "console", e.id)
	e.gauge.WithLabelValues(name).Set(1)
	defer e.gauge.WithLabelValues(name).Set(0)
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-s.Done():
			cancel()
		case <-wctx.Done():
		}
	}()
	err = work(wctx)
	select {
	case <-s.Done():
		lost = ctx.Err() == nil
	default:
	}
	cancel()
	wg.Wait()
	switch {
	case lost:
		e.log.Warn("lost the lead: the etcd lease ended", "controller", name)
		return true, nil
	case err == nil && ctx.Err() == nil:
		err = errStopped
	}
	// Give the lead up at once, for the next console not to wait a lease.
	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer rcancel()
	el.Resign(rctx)
	return false, err
}
