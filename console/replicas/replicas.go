// Package replicas lets consoles that share an etcd cluster find each
// other and know which of them holds each box's tunnel.
//
// Each replica registers itself under a lease of its own, and records
// each box whose tunnel lands on it as a claim under that lease: the
// replica and when the box's session started. A replica that dies loses
// its lease, and with it its registration and every claim; its boxes,
// redialling, land elsewhere and are claimed there.
//
// Every replica keeps a copy of all claims, read once and then followed
// by a watch, so that asking who holds a box costs no call to etcd. Two
// replicas may claim one box for a while: a box whose link broke dials
// again before the replica it left has seen that link die, and a replica
// that paused (a long GC, a frozen VM) comes back to claims it lost with
// its lease. The newer session wins: the replica that holds the older one
// drops it, so exactly one keeps the box, and the other puts its claim
// back wherever it was overwritten or deleted. The box's sync cannot go
// back meanwhile: its revisions are etcd's, whichever replica serves it.
package replicas

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Replica is one console among those sharing an etcd cluster.
type Replica struct {
	// ID names this run of the console: a replica started again is a
	// new one.
	ID string `json:"id"`
	// Name says which console it is, for people: its public URL, host
	// and process.
	Name string `json:"name"`
	// URL is where the other replicas forward calls for its boxes:
	// https://HOST:PORT of its replica listener.
	URL string `json:"url"`
}

// claim is the value of a box's owner key.
type claim struct {
	Replica string `json:"replica"`
	Since   int64  `json:"since"` // unix ns the box's session started
}

// newer reports whether c is a newer session than the one held by
// replica self since since; the replica IDs break a tie.
func (c claim) newer(self string, since int64) bool {
	if c.Since != since {
		return c.Since > since
	}
	return c.Replica > self
}

// Config is what a Set needs.
type Config struct {
	Client *clientv3.Client
	// Prefix is the store's key prefix; the set lives under Prefix+"ha/".
	Prefix string
	Self   Replica
	// TTL is the lease of the replica's registration and claims: how long
	// a dead replica still seems to hold its boxes. Whole seconds, at
	// least 2.
	TTL time.Duration
	// Drop ends this replica's session of a box another replica holds a
	// newer session of. It must not block.
	Drop func(box string)
	Log  *slog.Logger
	// Metrics, when set, registers the replicas known and the boxes held.
	Metrics prometheus.Registerer
}

// maxOps is the most claims written in one transaction; etcd allows 128
// operations in one by default.
const maxOps = 100

// Set is this replica's view of the replicas and their claims.
type Set struct {
	cfg      Config
	replicas string // key prefix of registrations
	owners   string // key prefix of claims

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kick   chan struct{} // wakes the writer

	mu      sync.Mutex
	lease   clientv3.LeaseID
	known   map[string]Replica // by ID
	claims  map[string]claim   // by box, the copy of every claim
	held    map[string]int64   // boxes whose session is here, since when
	pending map[string]op      // claims to write or take back
}

// op is a write the writer owes etcd for one box.
type op struct {
	hold  bool
	since int64
}

// Start registers self and reads every replica and claim; its
// goroutines run until Close.
func Start(ctx context.Context, cfg Config) (*Set, error) {
	if cfg.TTL < 2*time.Second {
		return nil, fmt.Errorf("replicas: a lease of %v; at least 2s", cfg.TTL)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	base := cfg.Prefix + "ha/"
	s := &Set{cfg: cfg, replicas: base + "replicas/", owners: base + "owners/", kick: make(chan struct{}, 1),
		known: map[string]Replica{}, claims: map[string]claim{}, held: map[string]int64{}, pending: map[string]op{}}
	if err := s.register(ctx); err != nil {
		return nil, err
	}
	rev, err := s.load(ctx)
	if err != nil {
		s.revoke()
		return nil, err
	}
	if cfg.Metrics != nil {
		cfg.Metrics.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "edgebox", Subsystem: "console", Name: "replicas",
				Help: "Console replicas sharing this console's etcd cluster, this one included."},
				func() float64 { s.mu.Lock(); defer s.mu.Unlock(); return float64(len(s.known)) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "edgebox", Subsystem: "console", Name: "boxes_held",
				Help: "Boxes whose tunnel this console replica holds."},
				func() float64 { s.mu.Lock(); defer s.mu.Unlock(); return float64(len(s.held)) }))
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(2)
	go func() { defer s.wg.Done(); s.write() }()
	go func() { defer s.wg.Done(); s.follow(rev) }()
	return s, nil
}

// register takes a new lease and writes this replica's registration under
// it, with a goroutine keeping it alive.
func (s *Set) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	g, err := s.cfg.Client.Grant(ctx, int64(s.cfg.TTL/time.Second))
	if err != nil {
		return fmt.Errorf("replicas: lease: %w", err)
	}
	self, _ := json.Marshal(s.cfg.Self)
	if _, err := s.cfg.Client.Put(ctx, s.replicas+s.cfg.Self.ID, string(self), clientv3.WithLease(g.ID)); err != nil {
		return fmt.Errorf("replicas: registering %s: %w", s.cfg.Self.ID, err)
	}
	s.mu.Lock()
	s.lease = g.ID
	s.mu.Unlock()
	return nil
}

// load reads every registration and claim, and returns the revision to
// follow from.
func (s *Set) load(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := s.cfg.Client.Get(ctx, s.cfg.Prefix+"ha/", clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("replicas: reading the replicas and their boxes: %w", err)
	}
	// The copy is built aside and swapped in whole: meanwhile Holder and
	// Alive answer from the old one, never from a half-read one.
	known, claims := map[string]Replica{}, map[string]claim{}
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		if id, ok := strings.CutPrefix(key, s.replicas); ok {
			var r Replica
			if json.Unmarshal(kv.Value, &r) == nil {
				known[id] = r
			}
		} else if box, ok := strings.CutPrefix(key, s.owners); ok {
			var c claim
			if json.Unmarshal(kv.Value, &c) == nil {
				claims[box] = c
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.known, s.claims = known, claims
	// Claims of ours that went meanwhile are written again.
	for box, since := range s.held {
		if c, ok := s.claims[box]; !ok || c.Replica != s.cfg.Self.ID || c.Since != since {
			s.settle(box, since)
		}
	}
	return resp.Header.Revision, nil
}

// Close takes back every claim and the registration at once, and stops.
func (s *Set) Close() error {
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
	s.revoke()
	return nil
}

func (s *Set) revoke() {
	s.mu.Lock()
	lease := s.lease
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.cfg.Client.Revoke(ctx, lease)
}

// Self is this replica.
func (s *Set) Self() Replica { return s.cfg.Self }

// Hold records that the session of box since since is on this replica.
// It does not wait for etcd.
func (s *Set) Hold(box string, since time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held[box] = since.UnixNano()
	s.queue(box, op{hold: true, since: since.UnixNano()})
}

// Release records that the session of box since since ended here; the
// claim is taken back if it is still this one's. It does not wait.
func (s *Set) Release(box string, since time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[box] != since.UnixNano() {
		return // a newer session of the box is here, or it was dropped
	}
	delete(s.held, box)
	s.queue(box, op{since: since.UnixNano()})
}

// queue notes a write for box and wakes the writer; s.mu is held.
func (s *Set) queue(box string, o op) {
	s.pending[box] = o
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Holder returns the replica that holds box's tunnel when another than
// this one does, from the copy: no call to etcd.
func (s *Set) Holder(box string) (Replica, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.claims[box]
	if !ok || c.Replica == s.cfg.Self.ID {
		return Replica{}, false
	}
	r, ok := s.known[c.Replica]
	return r, ok
}

// replica returns replica id, when it is registered.
func (s *Set) replica(id string) (Replica, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.known[id]
	return r, ok
}

// IDs lists the registered replicas, this one included: those that run,
// or died less than their lease ago.
func (s *Set) IDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Keys(s.known))
}

// Replicas lists the replicas, this one included, by ID.
func (s *Set) Replicas() []Replica {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Collect(maps.Values(s.known))
	slices.SortFunc(out, func(a, b Replica) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// write sends the pending claims to etcd until Close, and keeps the
// lease alive; a lease lost (a pause longer than its TTL, etcd
// unreachable) is taken again with every claim of this replica.
func (s *Set) write() {
	alive, err := s.keepAlive()
	if err != nil {
		s.cfg.Log.Warn("replica lease not kept alive; taking a new one", "err", err)
		alive = s.renew()
	}
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case _, ok := <-alive:
			if ok {
				continue
			}
			alive = s.renew()
			continue
		case <-s.kick:
		case <-retry.C:
		}
		if err := s.flush(); err != nil && s.ctx.Err() == nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				alive = s.renew()
			} else {
				s.cfg.Log.Warn("box claims not written; trying again in a second", "err", err)
			}
			retry.Reset(time.Second)
		}
	}
}

// keepAlive keeps the current lease alive until Close; the channel closes
// when the lease is lost.
func (s *Set) keepAlive() (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	s.mu.Lock()
	lease := s.lease
	s.mu.Unlock()
	return s.cfg.Client.KeepAlive(s.ctx, lease)
}

// renew registers again under a new lease, until it succeeds or Close,
// and queues every claim of this replica to be written again.
func (s *Set) renew() <-chan *clientv3.LeaseKeepAliveResponse {
	for s.ctx.Err() == nil {
		if err := s.register(s.ctx); err != nil {
			s.cfg.Log.Warn("replica registration lost and not taken again; retrying", "err", err)
			select {
			case <-s.ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		s.mu.Lock()
		for box, since := range s.held {
			s.queue(box, op{hold: true, since: since})
		}
		n := len(s.held)
		s.mu.Unlock()
		s.cfg.Log.Warn("replica lease was lost; registered again and claiming its boxes anew", "boxes", n)
		alive, err := s.keepAlive()
		if err == nil {
			return alive
		}
	}
	return nil
}

// flush writes what is pending, maxOps at a time.
func (s *Set) flush() error {
	s.mu.Lock()
	batch := s.pending
	s.pending = map[string]op{}
	lease := s.lease
	s.mu.Unlock()
	boxes := slices.Sorted(maps.Keys(batch))
	for len(boxes) > 0 {
		n := min(len(boxes), maxOps)
		ops := make([]clientv3.Op, 0, n)
		for _, box := range boxes[:n] {
			o := batch[box]
			v, _ := json.Marshal(claim{Replica: s.cfg.Self.ID, Since: o.since})
			key := s.owners + box
			if o.hold {
				ops = append(ops, clientv3.OpPut(key, string(v), clientv3.WithLease(lease)))
			} else {
				ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(key), "=", string(v))},
					[]clientv3.Op{clientv3.OpDelete(key)}, nil))
			}
		}
		ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
		_, err := s.cfg.Client.Txn(ctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			// What was not written is owed again, unless a newer write
			// for the same box came meanwhile.
			s.mu.Lock()
			for _, box := range boxes {
				if _, newer := s.pending[box]; !newer {
					s.pending[box] = batch[box]
				}
			}
			s.mu.Unlock()
			return err
		}
		boxes = boxes[n:]
	}
	return nil
}

// follow keeps the copy up to date from rev on, until Close; a watch
// that ends (etcd compacted past it, or it broke) reads everything again.
func (s *Set) follow(rev int64) {
	for s.ctx.Err() == nil {
		wc := s.cfg.Client.Watch(clientv3.WithRequireLeader(s.ctx), s.cfg.Prefix+"ha/", clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for resp := range wc {
			if err := resp.Err(); err != nil {
				break
			}
			for _, ev := range resp.Events {
				s.apply(ev.Kv, ev.Type == mvccpb.DELETE)
			}
			rev = resp.Header.Revision
		}
		for s.ctx.Err() == nil {
			r, err := s.load(s.ctx)
			if err == nil {
				rev = r
				break
			}
			s.cfg.Log.Warn("replicas not read again; retrying", "err", err)
			select {
			case <-s.ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

// apply brings the copy up to date with one key, and settles a box this
// replica holds whose claim changed.
func (s *Set) apply(kv *mvccpb.KeyValue, deleted bool) {
	key := string(kv.Key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, ok := strings.CutPrefix(key, s.replicas); ok {
		var r Replica
		if deleted || json.Unmarshal(kv.Value, &r) != nil {
			delete(s.known, id)
		} else {
			s.known[id] = r
		}
		return
	}
	box, ok := strings.CutPrefix(key, s.owners)
	if !ok {
		return
	}
	var c claim
	if deleted || json.Unmarshal(kv.Value, &c) != nil {
		delete(s.claims, box)
	} else {
		s.claims[box] = c
	}
	if since, here := s.held[box]; here {
		s.settle(box, since)
	}
}

// settle decides between this replica's session of box since since and
// the claim in the copy: a newer session elsewhere wins, and this one is
// dropped; else this replica's claim is written again. s.mu is held.
func (s *Set) settle(box string, since int64) {
	c, ok := s.claims[box]
	switch {
	case ok && c.Replica == s.cfg.Self.ID && c.Since == since:
	case ok && c.Replica != s.cfg.Self.ID && c.newer(s.cfg.Self.ID, since):
		delete(s.held, box)
		delete(s.pending, box)
		s.cfg.Log.Info("another console replica holds a newer session of the box; ending this one",
			"box_id", box, "replica", c.Replica)
		if s.cfg.Drop != nil {
			s.cfg.Drop(box)
		}
	default:
		s.queue(box, op{hold: true, since: since})
	}
}
