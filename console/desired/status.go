package desired

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Status keys (under the store), written only by the box's own Sync stream:
//
//	status/<box>/obj/<kind>/<name>   -> edgeboxv1.ObjectStatus (protobuf)
//	status/<box>/events              -> edgeboxv1.EventRing, the latest MaxEvents

// Bounds on what a box may report.
const (
	MaxStatusObjects = 256  // per message
	MaxStatusEvents  = 64   // per message
	MaxEvents        = 200  // kept per box
	maxMessage       = 1024 // bytes of a status or event message
	maxReason        = 64
	maxPorts         = 64 // published ports of one workload
)

func statusPrefix(box string) string    { return "status/" + box + "/obj/" }
func eventsKey(box string) string       { return "status/" + box + "/events" }
func statusKey(box, k, n string) string { return statusPrefix(box) + k + "/" + n }

// clip shortens s to at most n bytes of valid UTF-8.
func clip(s string, n int) string {
	if len(s) <= n {
		return strings.ToValidUTF8(s, "?")
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// ReportStatus records what box said of its objects. With full, statuses
// the box no longer holds are dropped. A "Removed" status drops the
// object's status.
func (st *State) ReportStatus(ctx context.Context, box string, r *edgeboxv1.SyncStatus) error {
	if len(r.GetObjects()) > MaxStatusObjects || len(r.GetEvents()) > MaxStatusEvents {
		return errdefs.Invalid("a status report holds at most %d objects and %d events", MaxStatusObjects, MaxStatusEvents)
	}
	// A full report (each new stream's first) mostly repeats what is
	// stored: a box back after a console restart has nothing new. Only
	// what differs is written, so a returning fleet costs reads, not a
	// commit and a watch event per status.
	var kvs []store.KV
	var stored map[string][]byte
	if r.GetFull() {
		var err error
		if kvs, _, err = st.s.Range(ctx, statusPrefix(box), 0); err != nil {
			return err
		}
		stored = make(map[string][]byte, len(kvs))
		for _, kv := range kvs {
			stored[kv.Key] = kv.Value
		}
	}
	var ops []store.Op
	keep := map[string]bool{}
	for _, s := range r.GetObjects() {
		if s == nil || !edgeboxv1.ValidKind(s.GetKind()) || !edgeboxv1.ValidObjectName(s.GetName()) || !edgeboxv1.ValidPhase(s.GetPhase()) ||
			(s.GetHealth() != "" && s.GetHealth() != edgeboxv1.Healthy && s.GetHealth() != edgeboxv1.Unhealthy) {
			return errdefs.Invalid("status of %q/%q: bad kind, name or phase %q", clip(s.GetKind(), 64), clip(s.GetName(), 64), clip(s.GetPhase(), 16))
		}
		k := statusKey(box, s.GetKind(), s.GetName())
		if s.GetPhase() == edgeboxv1.PhaseRemoved {
			if !r.GetFull() { // a full report drops it below, with all it left out
				ops = append(ops, store.Op{Key: k, Delete: true})
			}
			continue
		}
		keep[k] = true
		c := proto.Clone(s).(*edgeboxv1.ObjectStatus)
		c.Message = clip(c.Message, maxMessage)
		c.Release = clip(c.Release, 64)
		c.Health = clip(c.Health, 16)
		c.Reason = clip(c.Reason, 32)
		c.Address = clip(c.Address, 64)
		if len(c.Ports) > maxPorts {
			c.Ports = c.Ports[:maxPorts]
		}
		for i, p := range c.Ports {
			c.Ports[i] = clip(p, 64)
		}
		raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
		if err != nil {
			return err
		}
		if have, ok := stored[k]; ok && bytes.Equal(have, raw) {
			continue
		}
		ops = append(ops, store.Op{Key: k, Value: raw})
	}
	for _, kv := range kvs { // in key order
		if !keep[kv.Key] {
			ops = append(ops, store.Op{Key: kv.Key, Delete: true})
		}
	}
	if len(r.GetEvents()) > 0 {
		op, err := st.appendEvents(ctx, box, r.GetEvents())
		if err != nil {
			return err
		}
		ops = append(ops, op)
	}
	if len(ops) == 0 {
		return nil
	}
	// Only this box's stream writes its status keys, so no guard is needed.
	_, err := st.s.Txn(ctx, store.Txn{Then: ops})
	return err
}

func (st *State) appendEvents(ctx context.Context, box string, evs []*edgeboxv1.Event) (store.Op, error) {
	ring := &edgeboxv1.EventRing{}
	if kv, err := st.s.Get(ctx, eventsKey(box)); err == nil {
		if err := proto.Unmarshal(kv.Value, ring); err != nil {
			ring = &edgeboxv1.EventRing{} // a damaged ring starts over
		}
	} else if !errors.Is(err, store.ErrNotFound) {
		return store.Op{}, err
	}
	for _, e := range evs {
		if e == nil {
			continue
		}
		c := proto.Clone(e).(*edgeboxv1.Event)
		c.Kind, c.Name = clip(c.Kind, 63), clip(c.Name, 63)
		c.Reason, c.Message = clip(c.Reason, maxReason), clip(c.Message, maxMessage)
		ring.Events = append(ring.Events, c)
	}
	if n := len(ring.Events); n > MaxEvents {
		ring.Events = append([]*edgeboxv1.Event(nil), ring.Events[n-MaxEvents:]...)
	}
	raw, err := proto.Marshal(ring)
	if err != nil {
		return store.Op{}, err
	}
	return store.Op{Key: eventsKey(box), Value: raw}, nil
}

// Statuses returns box's object statuses in key order.
func (st *State) Statuses(ctx context.Context, box string) ([]*edgeboxv1.ObjectStatus, error) {
	kvs, _, err := st.s.Range(ctx, statusPrefix(box), 0)
	if err != nil {
		return nil, err
	}
	out := make([]*edgeboxv1.ObjectStatus, 0, len(kvs))
	for _, kv := range kvs {
		s := &edgeboxv1.ObjectStatus{}
		if err := proto.Unmarshal(kv.Value, s); err != nil {
			return nil, fmt.Errorf("desired: %s: %w", kv.Key, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// Events returns box's latest events, oldest first.
func (st *State) Events(ctx context.Context, box string) ([]*edgeboxv1.Event, error) {
	kv, err := st.s.Get(ctx, eventsKey(box))
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	ring := &edgeboxv1.EventRing{}
	if err := proto.Unmarshal(kv.Value, ring); err != nil {
		return nil, fmt.Errorf("desired: %s: %w", kv.Key, err)
	}
	return ring.Events, nil
}
