package agent

import (
	"sort"
	"strings"
	"sync"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Bounds of status reports, as the console accepts them.
const (
	maxReportObjects = 256
	maxReportEvents  = 64
	maxPendingEvents = 256
)

// reports holds what the reconciler made of each desired object until the
// Sync stream carries it up: the latest status per object, and the events
// not yet sent (the oldest go first when too many wait).
type reports struct {
	mu     sync.Mutex // guards the fields below
	latest map[string]*edgeboxv1.ObjectStatus
	dirty  map[string]bool
	events []*edgeboxv1.Event
	wake   chan struct{}
	// usb is the box's USB inventory when it has one; usbDirty says it
	// changed since it was last sent.
	usb      []*edgeboxv1.UsbDevice
	hasUSB   bool
	usbDirty bool
}

func newReports() *reports {
	return &reports{latest: map[string]*edgeboxv1.ObjectStatus{}, dirty: map[string]bool{}, wake: make(chan struct{}, 1)}
}

func (r *reports) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Report records an object's status; an unchanged status is not sent again.
func (r *reports) Report(s *edgeboxv1.ObjectStatus) {
	k := s.GetKind() + "/" + s.GetName()
	r.mu.Lock()
	defer r.mu.Unlock()
	old, ok := r.latest[k]
	if s.GetPhase() == edgeboxv1.PhaseRemoved {
		if !ok {
			return
		}
		delete(r.latest, k)
	} else {
		if ok && old.GetPhase() == s.GetPhase() && old.GetMessage() == s.GetMessage() && old.GetObservedRevision() == s.GetObservedRevision() &&
			old.GetRelease() == s.GetRelease() && old.GetHealth() == s.GetHealth() {
			return
		}
		r.latest[k] = s
	}
	r.dirty[k] = true
	r.signal()
}

// USB records the box's whole USB inventory.
func (r *reports) USB(devs []*edgeboxv1.UsbDevice) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.usb, r.hasUSB, r.usbDirty = devs, true, true
	r.signal()
}

// Event records an event to send.
func (r *reports) Event(e *edgeboxv1.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	if n := len(r.events); n > maxPendingEvents {
		r.events = append([]*edgeboxv1.Event(nil), r.events[n-maxPendingEvents:]...)
	}
	r.signal()
}

// take returns the messages that carry what changed since the last take
// (with full, every status), oldest events first, each within the bounds
// the console accepts; nil when there is nothing to send.
func (r *reports) take(full bool) []*edgeboxv1.SyncStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	var keys []string
	if full {
		for k := range r.latest {
			keys = append(keys, k)
		}
	} else {
		for k := range r.dirty {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	objs := make([]*edgeboxv1.ObjectStatus, 0, len(keys))
	for _, k := range keys {
		s, ok := r.latest[k]
		if !ok {
			kind, name, _ := strings.Cut(k, "/")
			s = &edgeboxv1.ObjectStatus{Kind: kind, Name: name, Phase: edgeboxv1.PhaseRemoved}
		}
		objs = append(objs, s)
	}
	evs := r.events
	r.events, r.dirty = nil, map[string]bool{}
	sendUSB := r.hasUSB && (full || r.usbDirty)
	r.usbDirty = false
	if !full && len(objs) == 0 && len(evs) == 0 && !sendUSB {
		return nil
	}
	var out []*edgeboxv1.SyncStatus
	for first := true; first || len(objs) > 0 || len(evs) > 0; first = false {
		m := &edgeboxv1.SyncStatus{Full: full && first}
		n := min(len(objs), maxReportObjects)
		m.Objects, objs = objs[:n], objs[n:]
		n = min(len(evs), maxReportEvents)
		m.Events, evs = evs[:n], evs[n:]
		if first && sendUSB {
			m.UsbReport, m.Usb = true, r.usb
		}
		out = append(out, m)
	}
	return out
}

// putBack returns events of messages that could not be sent, so the next
// stream carries them; statuses go again whole on the next stream anyway.
func (r *reports) putBack(ms []*edgeboxv1.SyncStatus) {
	var evs []*edgeboxv1.Event
	for _, m := range ms {
		evs = append(evs, m.GetEvents()...)
	}
	if len(evs) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(evs, r.events...)
	if n := len(r.events); n > maxPendingEvents {
		r.events = append([]*edgeboxv1.Event(nil), r.events[n-maxPendingEvents:]...)
	}
}

// phases counts the objects of kind by the phase reported last.
func (r *reports) phases(kind string) map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for _, s := range r.latest {
		if s.GetKind() == kind {
			out[s.GetPhase()]++
		}
	}
	return out
}
