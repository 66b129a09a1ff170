package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/edgebox/edgebox/errdefs"
)

// Etcd is the Store on an etcd cluster, for consoles that share state. Every
// key lives under Prefix, so several stores can share a cluster; revisions
// are etcd's own, so they also grow with writes of other stores.
type Etcd struct {
	cli    *clientv3.Client
	prefix string
	owned  bool // Close closes cli too (DialEtcd)

	ctx    context.Context // cancelled by Close; parent of every watch
	cancel context.CancelFunc
	wg     sync.WaitGroup // watchers
}

var _ Store = (*Etcd)(nil)

// NewEtcd returns a store on cli under prefix. The caller owns cli and
// closes it after the store.
func NewEtcd(cli *clientv3.Client, prefix string) *Etcd {
	ctx, cancel := context.WithCancel(context.Background())
	return &Etcd{cli: cli, prefix: prefix, ctx: ctx, cancel: cancel}
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

// opTimeout bounds a call whose context has no deadline: an etcd without
// quorum holds calls until they time out, and an operator's call or a
// box's sync must hear that the store does not answer, not wait for ever.
const opTimeout = 5 * time.Second

// call runs f with a deadline, and says that the store does not answer
// (errdefs.ErrUnavailable, HTTP 503) when it ran out of time or etcd was
// unreachable while ctx was still on.
func (s *Etcd) call(ctx context.Context, f func(context.Context) error) error {
	cctx := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, opTimeout)
		defer cancel()
	}
	err := f(cctx)
	if err == nil {
		return nil
	}
	if ctx.Err() == nil {
		switch code := status.Code(err); {
		case errors.Is(err, context.DeadlineExceeded), code == codes.DeadlineExceeded, code == codes.Unavailable:
			return errdefs.Unavailable("the console's store does not answer (etcd: %v); try again", err)
		}
	}
	return etcdErr(err)
}

func (s *Etcd) kv(k []byte, v []byte, create, mod, version int64) KV {
	return KV{Key: string(k[len(s.prefix):]), Value: v, CreateRevision: create, ModRevision: mod, Version: version}
}

func (s *Etcd) Get(ctx context.Context, key string) (KV, error) {
	if s.closed() {
		return KV{}, ErrClosed
	}
	var resp *clientv3.GetResponse
	if err := s.call(ctx, func(ctx context.Context) (err error) { resp, err = s.cli.Get(ctx, s.prefix+key); return err }); err != nil {
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
	var resp *clientv3.GetResponse
	if err := s.call(ctx, func(ctx context.Context) (err error) {
		resp, err = s.cli.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(s.prefix+prefix)),
			clientv3.WithLimit(int64(limit)), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		return err
	}); err != nil {
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
	var resp *clientv3.GetResponse
	if err := s.call(ctx, func(ctx context.Context) (err error) {
		resp, err = s.cli.Get(ctx, s.prefix, clientv3.WithCountOnly())
		return err
	}); err != nil {
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
	if err := s.call(ctx, func(ctx context.Context) (err error) {
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
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	stop := context.AfterFunc(s.ctx, cancel)
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if from > 0 {
		opts = append(opts, clientv3.WithRev(from))
	}
	wch := s.cli.Watch(wctx, s.prefix+prefix, opts...)
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
		for resp := range wch {
			if err := resp.Err(); err != nil {
				if resp.CompactRevision != 0 {
					err = fmt.Errorf("%w: watch from %d, history starts at %d", ErrCompacted, from, resp.CompactRevision)
				} else {
					err = etcdErr(err)
				}
				send(WatchResponse{Err: err})
				return
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
			if len(evs) > 0 && !send(WatchResponse{Events: evs}) {
				return
			}
		}
	}()
	return out
}
