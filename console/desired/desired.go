// Package desired keeps each box's desired state in the console store.
//
// Keys (under the store):
//
//	desired/<box>/rev                  -> the box's revision, decimal; only grows
//	desired/<box>/acked                -> the last revision the box stored, decimal
//	desired/<box>/obj/<kind>/<name>    -> edgeboxv1.DesiredObject (protobuf)
//
// Every change to a box's objects takes the next box revision in the same
// store transaction that writes the object, guarded by the revision key, so
// revisions are dense per box and never reused. An operator's change
// (PutBy, DeleteBy) writes its audit entry in that same transaction. A
// delete writes a tombstone
// that stays until the box has acknowledged its revision. Since answers
// "everything newer than N": only the latest of each object, because each
// object is one key.
package desired

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// MinCapability is the agent capability version that understands kind; a
// box below it is never sent objects of that kind.
func MinCapability(kind string) uint32 {
	switch kind {
	case edgeboxv1.KindWorkload, edgeboxv1.KindUsbAssignment, edgeboxv1.KindAgentConfig, edgeboxv1.KindAgentRelease:
		return 1
	case edgeboxv1.KindImagePrefetch:
		return 2
	case edgeboxv1.KindSitePeers:
		return 4
	}
	return ^uint32(0) // unknown kinds go nowhere
}

// State reads and writes desired state on a store.
type State struct {
	s store.Store
	// locks serialise writers of one box within this console, so they do
	// not spin on each other's compare-and-swap; the guard in the store
	// still orders writers of several consoles sharing it.
	locks boxLocks
	now   func() time.Time // audit entries' time
}

func (st *State) lock(box string) func() { return st.locks.lock(box) }

// boxLocks are a lock for each box with a writer, held across the store's
// commit. They were 64 locks shared by hashing the box's ID, and a fleet
// coming back acknowledges all at once: thousands of boxes queued on 64
// locks, one commit at a time each, where the store commits the writes of
// all of them together.
type boxLocks struct {
	mu   sync.Mutex
	held map[string]*boxLock // only while a writer holds or waits
}

type boxLock struct {
	sync.Mutex
	users int // guarded by boxLocks.mu
}

// lock takes box's lock and returns its release.
func (l *boxLocks) lock(box string) func() {
	l.mu.Lock()
	if l.held == nil {
		l.held = map[string]*boxLock{}
	}
	b := l.held[box]
	if b == nil {
		b = &boxLock{}
		l.held[box] = b
	}
	b.users++
	l.mu.Unlock()
	b.Lock()
	return func() {
		b.Unlock()
		l.mu.Lock()
		if b.users--; b.users == 0 {
			delete(l.held, box)
		}
		l.mu.Unlock()
	}
}

// New returns a State on s.
func New(s store.Store) *State { return &State{s: s, now: time.Now} }

func boxPrefix(box string) string { return "desired/" + box + "/" }
func revKey(box string) string    { return boxPrefix(box) + "rev" }
func ackedKey(box string) string  { return boxPrefix(box) + "acked" }
func objPrefix(box string) string { return boxPrefix(box) + "obj/" }
func capKey(box string) string    { return boxPrefix(box) + "cap" }

// ObjectPrefix is the store prefix of box's objects, for watching them.
func ObjectPrefix(box string) string       { return objPrefix(box) }
func objKey(box, kind, name string) string { return objPrefix(box) + kind + "/" + name }

func parseRev(kv store.KV) uint64 {
	n, _ := strconv.ParseUint(string(kv.Value), 10, 64)
	return n
}

// maxRetries bounds optimistic retries against concurrent writers of the
// same box.
const maxRetries = 100

// Audit actions of an operator's direct changes.
const (
	ActionPut    = "desired.put"
	ActionDelete = "desired.delete"
)

// Put writes an object of box, giving it the box's next revision, which it
// returns. The object's kind comes from its spec. Put writes no audit
// entry: it is for writes that follow from a change audited where it was
// made (an app's pin, a key's lease). An operator's own change goes
// through PutBy.
func (st *State) Put(ctx context.Context, box string, o *edgeboxv1.DesiredObject) (uint64, error) {
	return st.put(ctx, nil, box, o)
}

// PutBy is Put asked by who: its audit entry (ActionPut, on box) is
// written in the transaction that writes the object, so the object and
// its entry land together or not at all.
func (st *State) PutBy(ctx context.Context, who audit.Actor, box string, o *edgeboxv1.DesiredObject) (uint64, error) {
	return st.put(ctx, &who, box, o)
}

func (st *State) put(ctx context.Context, who *audit.Actor, box string, o *edgeboxv1.DesiredObject) (uint64, error) {
	kind := edgeboxv1.KindOf(o)
	if kind == "" {
		return 0, errdefs.Invalid("object %q has no spec", o.GetName())
	}
	if !edgeboxv1.ValidObjectName(o.GetName()) {
		return 0, errdefs.Invalid("object name %q: use 1-63 lower-case letters, digits, '.', '_' or '-'", o.GetName())
	}
	if w := o.GetWorkload(); w != nil {
		switch w.GetRestart() {
		case "", edgeboxv1.RestartAlways, edgeboxv1.RestartOnFailure, edgeboxv1.RestartNever:
		default:
			return 0, errdefs.Invalid("workload %q: restart %q: use always, on-failure or never", o.GetName(), w.GetRestart())
		}
	}
	obj := proto.Clone(o).(*edgeboxv1.DesiredObject)
	obj.Kind, obj.Deleted = kind, false
	return st.write(ctx, who, box, kind, obj.GetName(), obj, false)
}

// Delete replaces an object with a tombstone; deleting a missing object is
// a no-op that returns the current revision. Like Put, it writes no audit
// entry; an operator's own delete goes through DeleteBy.
func (st *State) Delete(ctx context.Context, box, kind, name string) (uint64, error) {
	return st.write(ctx, nil, box, kind, name, &edgeboxv1.DesiredObject{Kind: kind, Name: name, Deleted: true}, true)
}

// DeleteBy is Delete asked by who, with its audit entry (ActionDelete, on
// box) in the same transaction. Deleting a missing object changes no
// object but is still recorded: the operator asked.
func (st *State) DeleteBy(ctx context.Context, who audit.Actor, box, kind, name string) (uint64, error) {
	return st.write(ctx, &who, box, kind, name, &edgeboxv1.DesiredObject{Kind: kind, Name: name, Deleted: true}, true)
}

// write gives obj the box's next revision and stores it; with who, the
// audit entry of who's change goes in the same transaction.
func (st *State) write(ctx context.Context, who *audit.Actor, box, kind, name string, obj *edgeboxv1.DesiredObject, del bool) (uint64, error) {
	entry := func(rev uint64) []store.Op {
		if who == nil {
			return nil
		}
		action := ActionPut
		if del {
			action = ActionDelete
		}
		return []store.Op{audit.Op(st.now(), who.Did(action, box, kind+"/"+name+" at revision "+strconv.FormatUint(rev, 10)))}
	}
	defer st.lock(box)()
	for range maxRetries {
		var cur uint64
		var curMod int64
		if kv, err := st.s.Get(ctx, revKey(box)); err == nil {
			cur, curMod = parseRev(kv), kv.ModRevision
		} else if !errors.Is(err, store.ErrNotFound) {
			return 0, err
		}
		if del {
			old, err := st.s.Get(ctx, objKey(box, kind, name))
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return 0, err
			}
			var prev edgeboxv1.DesiredObject
			if errors.Is(err, store.ErrNotFound) || proto.Unmarshal(old.Value, &prev) == nil && prev.Deleted {
				// Nothing to delete: only the operator's request is
				// recorded, guarded so that cur is still the revision.
				ops := entry(cur)
				if len(ops) == 0 {
					return cur, nil
				}
				res, err := st.s.Txn(ctx, store.Txn{If: []store.Cmp{{Key: revKey(box), ModRevision: curMod}}, Then: ops})
				if err != nil {
					return 0, err
				}
				if res.Succeeded {
					return cur, nil
				}
				continue
			}
		}
		next := cur + 1
		obj.Revision = next
		raw, err := proto.Marshal(obj)
		if err != nil {
			return 0, err
		}
		res, err := st.s.Txn(ctx, store.Txn{
			If: []store.Cmp{{Key: revKey(box), ModRevision: curMod}},
			Then: append([]store.Op{
				{Key: revKey(box), Value: []byte(strconv.FormatUint(next, 10))},
				{Key: objKey(box, kind, name), Value: raw},
			}, entry(next)...),
		})
		if err != nil {
			return 0, err
		}
		if res.Succeeded {
			return next, nil
		}
	}
	return 0, errdefs.Unavailable("box %s: too many concurrent changes; try again", box)
}

// Since returns every object of box (tombstones included) changed after
// revision rev, in revision order, and the box's current revision.
func (st *State) Since(ctx context.Context, box string, rev uint64) ([]*edgeboxv1.DesiredObject, uint64, error) {
	kvs, _, err := st.s.Range(ctx, boxPrefix(box), 0)
	if err != nil {
		return nil, 0, err
	}
	var cur uint64
	var out []*edgeboxv1.DesiredObject
	for _, kv := range kvs {
		switch {
		case kv.Key == revKey(box):
			cur = parseRev(kv)
		case strings.HasPrefix(kv.Key, objPrefix(box)):
			o := &edgeboxv1.DesiredObject{}
			if err := proto.Unmarshal(kv.Value, o); err != nil {
				return nil, 0, fmt.Errorf("desired: %s: %w", kv.Key, err)
			}
			if o.Revision > rev {
				out = append(out, o)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Revision < out[j].Revision })
	return out, cur, nil
}

// Ack records that box stored everything up to rev. Acks never go back: an
// older ack than the one recorded changes nothing. A box cannot ack past
// its current revision.
func (st *State) Ack(ctx context.Context, box string, rev uint64) error {
	defer st.lock(box)()
	for range maxRetries {
		var cur uint64
		if kv, err := st.s.Get(ctx, revKey(box)); err == nil {
			cur = parseRev(kv)
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if rev > cur {
			return errdefs.Invalid("box %s acknowledged revision %d, but its state is only at %d", box, rev, cur)
		}
		var acked uint64
		var mod int64
		if kv, err := st.s.Get(ctx, ackedKey(box)); err == nil {
			acked, mod = parseRev(kv), kv.ModRevision
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if rev <= acked {
			return nil
		}
		res, err := store.CAS(ctx, st.s, ackedKey(box), mod, []byte(strconv.FormatUint(rev, 10)))
		if err != nil {
			return err
		}
		if res.Succeeded {
			return nil
		}
	}
	return errdefs.Unavailable("box %s: too many concurrent acks", box)
}

// ServedCapability is the capability version box's stored state was last
// served with: objects of kinds it needs more for were left out.
func (st *State) ServedCapability(ctx context.Context, box string) (uint32, bool, error) {
	kv, err := st.s.Get(ctx, capKey(box))
	if errors.Is(err, store.ErrNotFound) {
		return 0, false, nil
	} else if err != nil {
		return 0, false, err
	}
	return uint32(parseRev(kv)), true, nil
}

// SetServedCapability records the capability version box is served with.
func (st *State) SetServedCapability(ctx context.Context, box string, v uint32) error {
	_, err := store.Put(ctx, st.s, capKey(box), []byte(strconv.FormatUint(uint64(v), 10)))
	return err
}

// Live returns box's objects that are not deleted, in key order, and the
// box's current revision.
func (st *State) Live(ctx context.Context, box string) ([]*edgeboxv1.DesiredObject, uint64, error) {
	all, cur, err := st.Since(ctx, box, 0)
	if err != nil {
		return nil, 0, err
	}
	live := all[:0]
	for _, o := range all {
		if !o.GetDeleted() {
			live = append(live, o)
		}
	}
	sort.Slice(live, func(i, j int) bool {
		if live[i].Kind != live[j].Kind {
			return live[i].Kind < live[j].Kind
		}
		return live[i].Name < live[j].Name
	})
	return live, cur, nil
}

// Acked returns the last revision box acknowledged.
func (st *State) Acked(ctx context.Context, box string) (uint64, error) {
	kv, err := st.s.Get(ctx, ackedKey(box))
	if errors.Is(err, store.ErrNotFound) {
		return 0, nil
	}
	return parseRev(kv), err
}

// PurgeTombstones removes the tombstones box has acknowledged and returns
// how many went. Each removal is guarded, so a tombstone rewritten
// meanwhile stays.
func (st *State) PurgeTombstones(ctx context.Context, box string) (int, error) {
	acked, err := st.Acked(ctx, box)
	if err != nil {
		return 0, err
	}
	kvs, _, err := st.s.Range(ctx, objPrefix(box), 0)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, kv := range kvs {
		o := &edgeboxv1.DesiredObject{}
		if proto.Unmarshal(kv.Value, o) != nil || !o.Deleted || o.Revision > acked {
			continue
		}
		res, err := st.s.Txn(ctx, store.Txn{If: []store.Cmp{{Key: kv.Key, ModRevision: kv.ModRevision}},
			Then: []store.Op{{Key: kv.Key, Delete: true}}})
		if err != nil {
			return n, err
		}
		if res.Succeeded {
			n++
		}
	}
	return n, nil
}
