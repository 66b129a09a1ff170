package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Etcd is the Store on an etcd cluster, for consoles that share state. Every
// key lives under Prefix, so several stores can share a cluster; revisions
// are etcd's own, so they also grow with writes of other stores.
//
// Every read and write gets 5 s when its context has no deadline; one
// that runs out of time or finds etcd unreachable fails as
// errdefs.ErrUnavailable (HTTP 503, "try again").
//
// When the cluster loses members, a console on it carries on while a
// quorum is left: a cluster of three that loses its leader elects another
// within 1 to 2 s, and calls meanwhile wait for it. When it loses its
// quorum (two of three), writes are refused within their 5 s, as
// Unavailable saying that the cluster has lost its quorum; reads still
// answer, from the copy of the member the console reaches, which may lag
// the cluster's last writes (a read asks for a linearizable answer for
// 2 s, then for a serializable one; while the quorum is lost, one read a
// second asks for a linearizable one again and the others take the
// member's copy at once); and watches stay open, silent as nothing is
// written (see Watch), so that what the console holds open on them, such
// as a key carried between two boxes, goes on. The store logs when its
// reads become stale and current again, and shows it as
// edgebox_console_store_reads_stale (Observe). When the members return,
// the first write or linearizable read that succeeds ends it all.
type Etcd struct {
	cli    *clientv3.Client
	prefix string
	owned  bool   // Close closes cli too (DialEtcd)
	reads  *reads // whether reads are stale

	ctx    context.Context // cancelled by Close; parent of every watch
	cancel context.CancelFunc
	wg     sync.WaitGroup // watchers
}

var _ Store = (*Etcd)(nil)

// NewEtcd returns a store on cli under prefix. The caller owns cli and
// closes it after the store.
func NewEtcd(cli *clientv3.Client, prefix string) *Etcd {
	ctx, cancel := context.WithCancel(context.Background())
	return &Etcd{cli: cli, prefix: prefix, reads: newReads(), ctx: ctx, cancel: cancel}
}

// Close ends every watch and waits for them; a store DialEtcd made
// closes its client too.
func (s *Etcd) Close() error {
	s.cancel()
	s.wg.Wait()
	if s.owned {
		return s.cli.Close()
	}
	return nil
}

func (s *Etcd) closed() bool { return s.ctx.Err() != nil }

// Client is the etcd client the store works through, for what shares its
// cluster (the console's leader elections); Prefix is where its keys live.
func (s *Etcd) Client() *clientv3.Client { return s.cli }

// Prefix is the prefix of every key of the store.
func (s *Etcd) Prefix() string { return s.prefix }

func etcdErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, rpctypes.ErrCompacted):
		return fmt.Errorf("%w: %v", ErrCompacted, err)
	case errors.Is(err, rpctypes.ErrFutureRev):
		return fmt.Errorf("%w: %v", ErrFuture, err)
	}
	return fmt.Errorf("store: etcd: %w", err)
}

func (s *Etcd) kv(k []byte, v []byte, create, mod, version int64) KV {
	return KV{Key: string(k[len(s.prefix):]), Value: v, CreateRevision: create, ModRevision: mod, Version: version}
}

func (s *Etcd) Get(ctx context.Context, key string) (KV, error) {
	if s.closed() {
		return KV{}, ErrClosed
	}
	resp, err := s.get(ctx, s.prefix+key)
	if err != nil {
		return KV{}, err
	}
	if len(resp.Kvs) == 0 {
		return KV{}, ErrNotFound
	}
	k := resp.Kvs[0]
	return s.kv(k.Key, k.Value, k.CreateRevision, k.ModRevision, k.Version), nil
}

func (s *Etcd) Range(ctx context.Context, prefix string, limit int) ([]KV, int64, error) {
	return s.Scan(ctx, prefix, "", limit)
}

func (s *Etcd) Scan(ctx context.Context, prefix, after string, limit int) ([]KV, int64, error) {
	if s.closed() {
		return nil, 0, ErrClosed
	}
	from := s.prefix + prefix
	if after >= prefix {
		from = s.prefix + after + "\x00" // the first key after it
	}
	resp, err := s.get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(s.prefix+prefix)),
		clientv3.WithLimit(int64(limit)), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, 0, err
	}
	out := make([]KV, 0, len(resp.Kvs))
	for _, k := range resp.Kvs {
		out = append(out, s.kv(k.Key, k.Value, k.CreateRevision, k.ModRevision, k.Version))
	}
	return out, resp.Header.Revision, nil
}

func (s *Etcd) Revision(ctx context.Context) (int64, error) {
	if s.closed() {
		return 0, ErrClosed
	}
	resp, err := s.get(ctx, s.prefix, clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

func (s *Etcd) Txn(ctx context.Context, t Txn) (TxnResult, error) {
	if err := validate(t); err != nil {
		return TxnResult{}, err
	}
	if s.closed() {
		return TxnResult{}, ErrClosed
	}
	cmps := make([]clientv3.Cmp, 0, len(t.If))
	for _, c := range t.If {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(s.prefix+c.Key), "=", c.ModRevision))
	}
	ops := make([]clientv3.Op, 0, len(t.Then))
	for _, op := range t.Then {
		if op.Delete {
			ops = append(ops, clientv3.OpDelete(s.prefix+op.Key))
		} else {
			ops = append(ops, clientv3.OpPut(s.prefix+op.Key, string(op.Value)))
		}
	}
	var resp *clientv3.TxnResponse
	if err := s.write(ctx, func(ctx context.Context) (err error) {
		resp, err = s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		return err
	}); err != nil {
		return TxnResult{}, err
	}
	return TxnResult{Succeeded: resp.Succeeded, Revision: resp.Header.Revision}, nil
}

func (s *Etcd) Compact(ctx context.Context, rev int64) error {
	if s.closed() {
		return ErrClosed
	}
	_, err := s.cli.Compact(ctx, rev, clientv3.WithCompactPhysical())
	return etcdErr(err)
}

// Watch asks etcd for a watch served by a member that has a leader, so
// that a member cut off from its cluster does not keep it silent while the
// others write. A member without a leader ends such a watch with
// "etcdserver: no leader": when it opens, and after three election
// timeouts (3 s) when it was open. The store then opens it again from the
// revision after the last one sent, after a pause growing from
// watchPauseMin to watchPauseMax, and keeps the channel open: while the
// cluster has lost its quorum nothing is written that the watch could
// miss, and the console's watchers, which watch again at once when a
// watch ends (and some re-read everything then), wait instead of spinning.
func (s *Etcd) Watch(ctx context.Context, prefix string, from int64) <-chan WatchResponse {
	out := make(chan WatchResponse, 4)
	if from == 0 {
		// etcd registers a watch asynchronously; pin "from the next change"
		// to now.
		cur, err := s.Revision(ctx)
		if err != nil {
			out <- WatchResponse{Err: err}
			close(out)
			return out
		}
		from = cur + 1
	}
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(out)
		defer stop()
		defer cancel()
		send := func(r WatchResponse) bool {
			select {
			case out <- r:
				return true
			case <-wctx.Done():
				return false
			}
		}
		pause := watchPauseMin
		for {
			next, err := s.watch(wctx, prefix, from, send)
			if next > from {
				from, pause = next, watchPauseMin
			}
			switch {
			case err == nil || wctx.Err() != nil:
				return
			case !errors.Is(rpctypes.Error(err), rpctypes.ErrNoLeader):
				if errors.Is(err, ErrCompacted) {
					send(WatchResponse{Err: err})
				} else {
					send(WatchResponse{Err: etcdErr(err)})
				}
				return
			}
			s.reads.logger().Debug("etcd watch ended for want of a leader; watching again", "prefix", prefix, "from", from, "after", pause)
			if !sleep(wctx, pause) {
				return
			}
			pause = min(2*pause, watchPauseMax)
		}
	}()
	return out
}

// The pauses before a watch a member ended for having no leader is opened
// again: a cluster that got its leader back is followed again within
// watchPauseMax, and one without costs a refused watch that often.
const (
	watchPauseMin = 250 * time.Millisecond
	watchPauseMax = 2 * time.Second
)

// watch follows one etcd watch of prefix from revision from, sending its
// events, until it ends. It returns the revision to watch from next, and
// the error that ended the watch; nil when ctx ended or etcd closed the
// watch without one.
func (s *Etcd) watch(ctx context.Context, prefix string, from int64, send func(WatchResponse) bool) (int64, error) {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for resp := range s.cli.Watch(ctx, s.prefix+prefix, clientv3.WithPrefix(), clientv3.WithRev(from)) {
		if err := resp.Err(); err != nil {
			if resp.CompactRevision != 0 {
				err = fmt.Errorf("%w: watch from %d, history starts at %d", ErrCompacted, from, resp.CompactRevision)
			}
			return from, err
		}
		evs := make([]Event, 0, len(resp.Events))
		for _, e := range resp.Events {
			k := e.Kv
			ev := Event{Type: EventPut, KV: s.kv(k.Key, k.Value, k.CreateRevision, k.ModRevision, k.Version)}
			if e.Type == clientv3.EventTypeDelete {
				ev = Event{Type: EventDelete, KV: KV{Key: string(k.Key[len(s.prefix):]), ModRevision: k.ModRevision}}
			}
			evs = append(evs, ev)
		}
		if len(evs) == 0 {
			continue
		}
		if !send(WatchResponse{Events: evs}) {
			return from, nil
		}
		from = evs[len(evs)-1].KV.ModRevision + 1
	}
	return from, nil
}
