package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Bolt is the bbolt Store: one file, group commit, watch from the log.
//
// Layout:
//
//	store_meta/
//	    rev         -> u64 current revision
//	    compacted   -> u64 oldest revision still in the log
//	store_kv/<key>  -> u64 create rev | u64 mod rev | u64 version | value
//	store_log/<u64 rev> -> the events of that revision:
//	    repeated u8 type | u16 len(key) | key | u64 create rev | u64 version
//	             | u32 len(value) | value
//
// Writes go through one committer goroutine: it takes every transaction
// waiting, applies them in order, each with its own revision, in one bbolt
// transaction, and syncs once. Under load many revisions share one fsync,
// and a commit that follows a shared one first waits a moment (linger) for
// more; alone, a transaction waits for nothing but its own fsync.
type Bolt struct {
	db *bolt.DB

	reqs   chan *txnReq
	closed chan struct{} // closed by Close
	idle   chan struct{} // closed when the committer has stopped
	once   sync.Once
	wg     sync.WaitGroup // the committer and every watcher

	closeMu  sync.Mutex // orders a watcher's wg.Add before Close's Wait
	isClosed bool

	mu      sync.Mutex    // guards changed
	changed chan struct{} // closed and replaced after each commit

	linger time.Duration // see the constant; set before the committer starts
	// commits and lingered count the commits, and those that waited for
	// more transactions first.
	commits, lingered atomic.Int64
}

var _ Store = (*Bolt)(nil)

var (
	bucketMeta = []byte("store_meta")
	bucketKV   = []byte("store_kv")
	bucketLog  = []byte("store_log")
	keyRev     = []byte("rev")
	keyCompact = []byte("compacted")
)

type txnReq struct {
	ctx  context.Context // a request whose ctx ended before its commit is dropped
	t    Txn
	res  TxnResult
	err  error
	done chan struct{}
}

// maxBatch bounds the transactions one commit takes.
const maxBatch = 1000

// OpenBolt uses db (opened by the caller, who closes it after the store)
// and starts the committer.
func OpenBolt(db *bolt.DB) (*Bolt, error) { return openBolt(db, linger) }

func openBolt(db *bolt.DB, linger time.Duration) (*Bolt, error) {
	err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketMeta, bucketKV, bucketLog} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	s := &Bolt{db: db, reqs: make(chan *txnReq, maxBatch), closed: make(chan struct{}),
		idle: make(chan struct{}), changed: make(chan struct{}), linger: linger}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(s.idle)
		s.commitLoop()
	}()
	return s, nil
}

// Close stops the committer and the watchers and waits for them. It does
// not close the bbolt database.
func (s *Bolt) Close() error {
	s.closeMu.Lock()
	s.isClosed = true
	s.once.Do(func() { close(s.closed) })
	s.closeMu.Unlock()
	s.wg.Wait()
	return nil
}

func u64(b []byte) int64 {
	if len(b) != 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(b))
}

func be(v int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) }

func decodeKV(key string, raw []byte) (KV, error) {
	if len(raw) < 24 {
		return KV{}, fmt.Errorf("store: corrupt value of %q", key)
	}
	return KV{Key: key, CreateRevision: u64(raw[0:8]), ModRevision: u64(raw[8:16]), Version: u64(raw[16:24]),
		Value: append([]byte(nil), raw[24:]...)}, nil
}

func encodeKV(kv KV) []byte {
	b := make([]byte, 0, 24+len(kv.Value))
	b = binary.BigEndian.AppendUint64(b, uint64(kv.CreateRevision))
	b = binary.BigEndian.AppendUint64(b, uint64(kv.ModRevision))
	b = binary.BigEndian.AppendUint64(b, uint64(kv.Version))
	return append(b, kv.Value...)
}

func encodeEvents(evs []Event) []byte {
	var b []byte
	for _, e := range evs {
		b = append(b, byte(e.Type))
		b = binary.BigEndian.AppendUint16(b, uint16(len(e.KV.Key)))
		b = append(b, e.KV.Key...)
		b = binary.BigEndian.AppendUint64(b, uint64(e.KV.CreateRevision))
		b = binary.BigEndian.AppendUint64(b, uint64(e.KV.Version))
		b = binary.BigEndian.AppendUint32(b, uint32(len(e.KV.Value)))
		b = append(b, e.KV.Value...)
	}
	return b
}

func decodeEvents(rev int64, b []byte) ([]Event, error) {
	var evs []Event
	for len(b) > 0 {
		if len(b) < 3 {
			return nil, fmt.Errorf("store: corrupt log at revision %d", rev)
		}
		typ, kl := EventType(b[0]), int(binary.BigEndian.Uint16(b[1:3]))
		b = b[3:]
		if len(b) < kl+20 {
			return nil, fmt.Errorf("store: corrupt log at revision %d", rev)
		}
		e := Event{Type: typ, KV: KV{Key: string(b[:kl]), ModRevision: rev}}
		b = b[kl:]
		e.KV.CreateRevision, e.KV.Version = u64(b[0:8]), u64(b[8:16])
		vl := int(binary.BigEndian.Uint32(b[16:20]))
		b = b[20:]
		if len(b) < vl {
			return nil, fmt.Errorf("store: corrupt log at revision %d", rev)
		}
		if typ == EventPut {
			e.KV.Value = append([]byte(nil), b[:vl]...)
		}
		b = b[vl:]
		evs = append(evs, e)
	}
	return evs, nil
}

func (s *Bolt) Get(ctx context.Context, key string) (KV, error) {
	var kv KV
	err := s.db.View(func(tx *bolt.Tx) error {
		raw := tx.Bucket(bucketKV).Get([]byte(key))
		if raw == nil {
			return ErrNotFound
		}
		var err error
		kv, err = decodeKV(key, raw)
		return err
	})
	return kv, err
}

func (s *Bolt) Range(ctx context.Context, prefix string, limit int) ([]KV, int64, error) {
	return s.Scan(ctx, prefix, "", limit)
}

func (s *Bolt) Scan(ctx context.Context, prefix, after string, limit int) ([]KV, int64, error) {
	var out []KV
	var rev int64
	err := s.db.View(func(tx *bolt.Tx) error {
		rev = u64(tx.Bucket(bucketMeta).Get(keyRev))
		c := tx.Bucket(bucketKV).Cursor()
		p := []byte(prefix)
		start := p
		if after >= prefix {
			start = append([]byte(after), 0) // the first key after it
		}
		for k, v := c.Seek(start); k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
			if limit > 0 && len(out) == limit {
				break
			}
			kv, err := decodeKV(string(k), v)
			if err != nil {
				return err
			}
			out = append(out, kv)
		}
		return nil
	})
	return out, rev, err
}

func (s *Bolt) Revision(ctx context.Context) (int64, error) {
	var rev int64
	err := s.db.View(func(tx *bolt.Tx) error {
		rev = u64(tx.Bucket(bucketMeta).Get(keyRev))
		return nil
	})
	return rev, err
}

// MaxKeyLen and MaxValueLen bound what one op may write.
const (
	MaxKeyLen   = 1024
	MaxValueLen = 1 << 20
)

func validate(t Txn) error {
	for _, c := range t.If {
		if c.Key == "" {
			return ErrEmptyKey
		}
	}
	for _, op := range t.Then {
		if op.Key == "" {
			return ErrEmptyKey
		}
		if len(op.Key) > MaxKeyLen || len(op.Value) > MaxValueLen {
			return fmt.Errorf("store: key %.40q: key over %d bytes or value over %d bytes", op.Key, MaxKeyLen, MaxValueLen)
		}
	}
	return nil
}

func (s *Bolt) Txn(ctx context.Context, t Txn) (TxnResult, error) {
	if err := validate(t); err != nil {
		return TxnResult{}, err
	}
	r := &txnReq{ctx: ctx, t: t, done: make(chan struct{})}
	select {
	case s.reqs <- r:
	case <-s.closed:
		return TxnResult{}, ErrClosed
	case <-ctx.Done():
		return TxnResult{}, ctx.Err()
	}
	// Once queued, the transaction is committed, failed, or dropped unwritten
	// because ctx ended before its commit began; waiting for the answer is
	// not cut short by ctx, so a caller never mistakes a committed write
	// for a lost one. Only a store that closed before the committer
	// took it leaves it unanswered, and then it was not written.
	select {
	case <-r.done:
	case <-s.idle:
		select {
		case <-r.done:
		default:
			return TxnResult{}, ErrClosed
		}
	}
	return r.res, r.err
}

func (s *Bolt) commitLoop() {
	batch := make([]*txnReq, 0, maxBatch)
	var ended time.Time // when the last commit ended
	// peak is how many transactions the recent commits carried: the most
	// of one, falling by an eighth (and to 1) at each commit that carried
	// fewer, and forgotten after a quietSpell without a write, so writers
	// that stopped are not waited for long.
	peak := 0
	for {
		batch = batch[:0]
		select {
		case r := <-s.reqs:
			batch = append(batch, r)
		case <-s.closed:
			s.failPending()
			return
		}
		batch = s.take(batch, maxBatch, nil)
		since := time.Since(ended)
		if since >= quietSpell {
			peak = 0 // nobody is coming back at once
		}
		if peak > 1 && len(batch) < peak && since < s.linger {
			t := time.NewTimer(s.linger)
			batch = s.take(batch, peak, t.C)
			t.Stop()
			s.lingered.Add(1)
		}
		peak = max(len(batch), peak*7/8)
		s.commits.Add(1)
		s.commit(dropGone(batch))
		ended = time.Now()
	}
}

// take adds the transactions waiting to batch until it holds want (at
// most maxBatch): those queued now when until is nil, else those that come
// before until fires or the store closes.
func (s *Bolt) take(batch []*txnReq, want int, until <-chan time.Time) []*txnReq {
	for len(batch) < min(want, maxBatch) {
		if until == nil {
			select {
			case r := <-s.reqs:
				batch = append(batch, r)
				continue
			default:
				return batch
			}
		}
		select {
		case r := <-s.reqs:
			batch = append(batch, r)
		case <-until:
			return batch
		case <-s.closed:
			return batch
		}
	}
	return batch
}

// linger is how long a commit that follows a shared one within linger
// waits, at most, until it carries as many transactions as the recent
// commits did. Many callers writing at once (a returning fleet's hellos,
// acknowledgements and statuses) then share fewer, larger commits: each
// costs two fsyncs and rewrites the meta page, the freelist and the branch
// pages over the keys it touches, whatever it carries. At 15,000 boxes on
// half a core it took the commits in a storm's first 40 s from about
// 10,000 to about 1,800, and the allocation in them from 545 to 195 MB
// (docs/benchmarks.md). Writers that are all waiting already fill the
// commit at once and wait for nothing. A lone writer, or one after a quiet
// spell, waits only for its own fsync; one that writes on alone straight
// after many others waits at most a few dozen times, while peak falls.
const linger = 4 * time.Millisecond

// quietSpell is how long the store goes without a write before the
// commits' peak is forgotten. Much longer than linger, so the gaps between
// a returning fleet's writes (a collection, a burst of handshakes) do not
// make the commits start small again.
const quietSpell = 100 * time.Millisecond

// dropGone answers the requests whose caller stopped waiting before their
// commit began (a box's hello after its session ended) without writing
// them, and returns the rest: under a backlog, no commit is spent on work
// nobody waits for. Their callers learn they were not written.
func dropGone(batch []*txnReq) []*txnReq {
	kept := batch[:0]
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.err = fmt.Errorf("store: not written, its caller is gone: %w", err)
			close(r.done)
			continue
		}
		kept = append(kept, r)
	}
	return kept
}

func (s *Bolt) failPending() {
	for {
		select {
		case r := <-s.reqs:
			r.err = ErrClosed
			close(r.done)
		default:
			return
		}
	}
}

// commit applies a batch in one bbolt transaction, each with its own
// revision.
func (s *Bolt) commit(batch []*txnReq) {
	if len(batch) == 0 {
		return
	}
	wrote := false
	err := s.db.Update(func(tx *bolt.Tx) error {
		meta, kvb, logb := tx.Bucket(bucketMeta), tx.Bucket(bucketKV), tx.Bucket(bucketLog)
		rev := u64(meta.Get(keyRev))
		for _, r := range batch {
			r.res = TxnResult{Revision: rev}
			ok := true
			for _, c := range r.t.If {
				cur := int64(0)
				if raw := kvb.Get([]byte(c.Key)); raw != nil {
					cur = u64(raw[8:16])
				}
				if cur != c.ModRevision {
					ok = false
					break
				}
			}
			if !ok {
				continue
			}
			r.res.Succeeded = true
			var evs []Event
			next := rev + 1
			for _, op := range r.t.Then {
				k := []byte(op.Key)
				raw := kvb.Get(k)
				if op.Delete {
					if raw == nil {
						continue
					}
					if err := kvb.Delete(k); err != nil {
						return err
					}
					evs = append(evs, Event{Type: EventDelete, KV: KV{Key: op.Key, ModRevision: next}})
					continue
				}
				kv := KV{Key: op.Key, Value: op.Value, CreateRevision: next, ModRevision: next, Version: 1}
				if raw != nil {
					kv.CreateRevision, kv.Version = u64(raw[0:8]), u64(raw[16:24])+1
				}
				if err := kvb.Put(k, encodeKV(kv)); err != nil {
					return err
				}
				evs = append(evs, Event{Type: EventPut, KV: kv})
			}
			if len(evs) == 0 {
				continue
			}
			rev = next
			r.res.Revision = rev
			if err := logb.Put(be(rev), encodeEvents(evs)); err != nil {
				return err
			}
			wrote = true
		}
		if !wrote {
			return nil
		}
		return meta.Put(keyRev, be(rev))
	})
	for _, r := range batch {
		if err != nil {
			r.res, r.err = TxnResult{}, fmt.Errorf("store: commit: %w", err)
		}
		close(r.done)
	}
	if err == nil && wrote {
		s.mu.Lock()
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
	}
}

func (s *Bolt) changedCh() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func (s *Bolt) Compact(ctx context.Context, rev int64) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		cur, compacted := u64(meta.Get(keyRev)), u64(meta.Get(keyCompact))
		switch {
		case rev > cur:
			return fmt.Errorf("%w: compact to %d, current revision %d", ErrFuture, rev, cur)
		case rev <= compacted:
			return fmt.Errorf("%w: already compacted to %d", ErrCompacted, compacted)
		}
		c := tx.Bucket(bucketLog).Cursor()
		for k, _ := c.First(); k != nil && u64(k) < rev; k, _ = c.First() {
			if err := c.Delete(); err != nil {
				return err
			}
		}
		return meta.Put(keyCompact, be(rev))
	})
}

// watchChunk bounds the revisions one log read returns.
const watchChunk = 256

func (s *Bolt) Watch(ctx context.Context, prefix string, from int64) <-chan WatchResponse {
	ch := make(chan WatchResponse, 4)
	if from == 0 {
		// "From the next change" means after now, not after the goroutine
		// below first runs.
		cur, err := s.Revision(ctx)
		if err != nil {
			ch <- WatchResponse{Err: err}
			close(ch)
			return ch
		}
		from = cur + 1
	}
	s.closeMu.Lock()
	if s.isClosed {
		s.closeMu.Unlock()
		ch <- WatchResponse{Err: ErrClosed}
		close(ch)
		return ch
	}
	s.wg.Add(1)
	s.closeMu.Unlock()
	go func() {
		defer s.wg.Done()
		defer close(ch)
		send := func(r WatchResponse) bool {
			select {
			case ch <- r:
				return true
			case <-ctx.Done():
			case <-s.closed:
			}
			return false
		}
		next := from
		for {
			changed := s.changedCh() // before reading, so no commit slips between
			evs, last, more, err := s.readLog(prefix, next)
			if err != nil {
				send(WatchResponse{Err: err})
				return
			}
			if len(evs) > 0 && !send(WatchResponse{Events: evs}) {
				return
			}
			if last >= next {
				next = last + 1
			}
			if more {
				continue
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return
			case <-s.closed:
				return
			}
		}
	}()
	return ch
}

// readLog reads the events under prefix of up to watchChunk revisions from
// next on. It returns the last revision read and whether more remain.
func (s *Bolt) readLog(prefix string, next int64) (evs []Event, last int64, more bool, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		compacted := u64(meta.Get(keyCompact))
		if next < compacted {
			return fmt.Errorf("%w: watch from %d, history starts at %d", ErrCompacted, next, compacted)
		}
		c := tx.Bucket(bucketLog).Cursor()
		n := 0
		for k, v := c.Seek(be(next)); k != nil; k, v = c.Next() {
			if n == watchChunk {
				more = true
				break
			}
			rev := u64(k)
			all, err := decodeEvents(rev, v)
			if err != nil {
				return err
			}
			for _, e := range all {
				if len(e.KV.Key) >= len(prefix) && e.KV.Key[:len(prefix)] == prefix {
					evs = append(evs, e)
				}
			}
			last = rev
			n++
		}
		return nil
	})
	return evs, last, more, err
}
