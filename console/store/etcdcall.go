package store

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/edgebox/edgebox/errdefs"
)

// How a call to etcd spends its time, and what it says when etcd does not
// answer or has lost its quorum.

const (
	// opTimeout bounds a call whose context has no deadline: an etcd
	// without quorum holds calls until they time out, and an operator's
	// call or a box's sync must hear that the store does not answer, not
	// wait for ever.
	opTimeout = 5 * time.Second

	// linearShare is how long a read waits at most for a linearizable
	// answer (2/5 of a shorter deadline) before it takes the copy of the
	// member it reaches. An election after a leader's loss takes 1 to 2 s
	// at etcd's default timing (1 s election timeout, randomised up to
	// 2 s), which a read waits out; the rest of the 5 s is the member's.
	linearShare = 2 * time.Second
	// While reads are stale, one read each probeEvery tries a
	// linearizable read again, for probeShare at most, so that the store
	// sees the quorum back; the others take the member's copy at once.
	probeShare = 500 * time.Millisecond
	probeEvery = time.Second

	// checkShare is the part of a write's time (1/5 of a shorter
	// deadline) kept to ask, when it runs out of time, whether etcd has
	// lost its quorum.
	checkShare = time.Second
	// writeRetry is the pause before a write that a member refused for
	// having no leader is sent again. A refused write was never proposed,
	// so sending it again writes it at most once.
	writeRetry = 200 * time.Millisecond
)

// budget gives ctx opTimeout when it has no deadline.
func budget(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, opTimeout)
}

// get reads key as opts say (read), and says that the store does not
// answer when it could not (failed).
func (s *Etcd) get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := s.read(ctx, key, opts...)
	if err != nil {
		return nil, failed(ctx, err)
	}
	return resp, nil
}

// read reads key as opts say. It asks for a linearizable read, from a
// member that has a leader; when none answers so in time (the cluster has
// lost its quorum, or the members reached have no leader), it asks the
// member it reaches for its own copy (a serializable read), which may lag
// the cluster's writes. The whole takes no longer than a call's budget.
func (s *Etcd) read(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	cctx, cancel := budget(ctx)
	defer cancel()
	var cause error
	if share, ok := s.reads.linearizable(cctx, time.Now()); ok {
		lctx, lcancel := context.WithTimeout(clientv3.WithRequireLeader(cctx), share)
		resp, err := s.cli.Get(lctx, key, opts...)
		lcancel()
		if err == nil {
			s.reads.set(false, nil)
			return resp, nil
		}
		if cctx.Err() != nil || !unavailable(err) {
			return nil, err
		}
		cause = err
	}
	resp, err := s.cli.Get(cctx, key, append(opts, clientv3.WithSerializable())...)
	if err != nil {
		return nil, err
	}
	s.reads.set(true, cause)
	return resp, nil
}

// write runs the write f within a call's budget. It is sent to a member
// that has a leader: one that has none refuses it unproposed, and it is
// sent again after a pause while time is left, so a write during an
// election waits for the new leader. It fails as Unavailable, saying that
// the cluster has lost its quorum when that is why: when members refused
// it for want of a leader, or when it ran out of time and the member the
// store reaches answers but has no leader (the last part of the budget,
// up to checkShare, is kept to ask).
func (s *Etcd) write(ctx context.Context, f func(context.Context) error) error {
	cctx, cancel := budget(ctx)
	defer cancel()
	dl, _ := cctx.Deadline()
	wctx, wcancel := context.WithDeadline(cctx, dl.Add(-min(checkShare, time.Until(dl)/5)))
	defer wcancel()
	for {
		err := f(clientv3.WithRequireLeader(wctx))
		if err == nil {
			s.reads.set(false, nil)
			return nil
		}
		if errors.Is(rpctypes.Error(err), rpctypes.ErrNoLeader) && sleep(wctx, writeRetry) {
			continue
		}
		if ctx.Err() == nil && unavailable(err) && (lostQuorum(err) || timedOut(err) && s.leaderless(cctx)) {
			return errdefs.Unavailable("the console's store cannot write: its etcd cluster has lost its quorum (etcd: %v); try again", err)
		}
		return failed(ctx, err)
	}
}

// leaderless says whether the member the store reaches answers but has no
// leader: it serves no read asking for one within half of ctx's time, and
// serves one that does not within the rest.
func (s *Etcd) leaderless(ctx context.Context) bool {
	opts := []clientv3.OpOption{clientv3.WithSerializable(), clientv3.WithCountOnly()}
	dl, _ := ctx.Deadline()
	lctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), time.Until(dl)/2)
	_, err := s.cli.Get(lctx, s.prefix, opts...)
	cancel()
	if err == nil {
		return false
	}
	_, err = s.cli.Get(ctx, s.prefix, opts...)
	return err == nil
}

// failed says that the store does not answer (errdefs.ErrUnavailable,
// HTTP 503) when a call ran out of time or found etcd unreachable while
// ctx was still on.
func failed(ctx context.Context, err error) error {
	if ctx.Err() == nil && unavailable(err) {
		return errdefs.Unavailable("the console's store does not answer (etcd: %v); try again", err)
	}
	return etcdErr(err)
}

// unavailable says whether err is etcd not answering: out of time,
// unreachable, or without a leader.
func unavailable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	switch status.Code(err) {
	case codes.DeadlineExceeded, codes.Unavailable:
		return true
	}
	var ee rpctypes.EtcdError
	return errors.As(rpctypes.Error(err), &ee) && ee.Code() == codes.Unavailable
}

// lostQuorum says whether err is etcd saying it has no quorum: no leader,
// or a proposal lost with the leader or its connection to its followers.
func lostQuorum(err error) bool {
	err = rpctypes.Error(err)
	return errors.Is(err, rpctypes.ErrNoLeader) || errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail) ||
		errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost)
}

func timedOut(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded ||
		errors.Is(rpctypes.Error(err), rpctypes.ErrTimeout)
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// reads is whether the store's reads are linearizable or stale (served
// from one member's copy), and what it says when that changes.
type reads struct {
	stale   atomic.Bool
	probeAt atomic.Int64 // while stale: when (Unix ns) a read next tries a linearizable read
	gauge   prometheus.Gauge

	mu  sync.Mutex   // held while stale changes, so that each change is logged and counted once, in order
	log *slog.Logger // the store's; guarded by mu
}

func newReads() *reads {
	return &reads{
		log: slog.New(slog.DiscardHandler),
		gauge: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "edgebox", Subsystem: "console", Name: "store_reads_stale",
			Help: "1 while the console's etcd cluster serves no linearizable reads (it has lost its quorum) and the store's reads come from one member's copy, possibly stale; 0 while they are current."}),
	}
}

// linearizable says whether a read asks for a linearizable answer first,
// and how long it waits for one: linearShare, or while reads are stale
// probeShare for one read each probeEvery and none for the others.
func (r *reads) linearizable(ctx context.Context, now time.Time) (time.Duration, bool) {
	share := linearShare
	if r.stale.Load() {
		at := r.probeAt.Load()
		if now.UnixNano() < at || !r.probeAt.CompareAndSwap(at, now.Add(probeEvery).UnixNano()) {
			return 0, false
		}
		share = probeShare
	}
	if dl, ok := ctx.Deadline(); ok {
		share = min(share, dl.Sub(now)*2/5)
	}
	return share, true
}

// set records whether the last read was stale; cause is why a stale one
// was.
func (r *reads) set(stale bool, cause error) {
	if r.stale.Load() == stale {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stale.Load() == stale {
		return
	}
	if stale {
		r.probeAt.Store(time.Now().Add(probeEvery).UnixNano())
		r.log.Warn(staleMsg, "err", cause)
		r.gauge.Set(1)
	} else {
		r.log.Info("etcd serves linearizable reads again: the console's reads are current")
		r.gauge.Set(0)
	}
	r.stale.Store(stale)
}

func (r *reads) logger() *slog.Logger {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.log
}

const staleMsg = "etcd serves no linearizable reads (its cluster has lost its quorum?): the console's reads come from one member's copy, possibly stale, and its writes are refused"

// Observe makes the store log to log when its reads become stale and
// current again (and, at debug level, each time it opens again a watch
// that a member without a leader ended), and show it on reg, when not
// nil, as edgebox_console_store_reads_stale. Call it before the store
// serves; until then the store logs nothing.
func (s *Etcd) Observe(log *slog.Logger, reg prometheus.Registerer) error {
	s.reads.mu.Lock()
	s.reads.log = log
	if s.reads.stale.Load() {
		log.Warn(staleMsg)
	}
	s.reads.mu.Unlock()
	if reg != nil {
		return reg.Register(s.reads.gauge)
	}
	return nil
}
