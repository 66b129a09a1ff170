package console

import (
	"context"
	"log/slog"
	"strings"
	"sync"

	"github.com/edgebox/edgebox/console/store"
)

// hub watches every box's desired objects with one store watch and wakes
// the Sync streams of the boxes that changed. One watch for the fleet, not
// one goroutine per box.
type hub struct {
	mu     sync.Mutex // guards subs and done
	subs   map[string]map[chan struct{}]struct{}
	done   bool
	prefix string
}

func newHub() *hub {
	return &hub{subs: make(map[string]map[chan struct{}]struct{}), prefix: "desired/"}
}

// watch starts the store watch. Call it before any Sync stream can read
// the state, so no change falls between a stream's first read and the hub.
func (h *hub) watch(ctx context.Context, s store.Store) <-chan store.WatchResponse {
	return s.Watch(ctx, h.prefix, 0)
}

// run follows w until ctx ends, then closes every subscriber's channel. A
// watch that fails (compacted under a slow reader) is opened again and
// every subscriber woken, so each re-reads its box's state.
func (h *hub) run(ctx context.Context, s store.Store, w <-chan store.WatchResponse, log *slog.Logger) {
	defer h.closeAll()
	for {
		h.follow(w)
		if ctx.Err() != nil {
			return
		}
		log.Warn("desired-state watch ended; watching again")
		w = h.watch(ctx, s)
		h.notifyAll()
	}
}

func (h *hub) follow(w <-chan store.WatchResponse) {
	for r := range w {
		if r.Err != nil {
			return
		}
		for _, e := range r.Events {
			// desired/<box>/obj/<kind>/<name>
			rest := strings.TrimPrefix(e.KV.Key, h.prefix)
			box, tail, ok := strings.Cut(rest, "/")
			if ok && strings.HasPrefix(tail, "obj/") {
				h.notify(box)
			}
		}
	}
}

// subscribe returns a channel that receives (at most one pending) signal
// whenever box's objects change, and is closed when the hub stops; cancel
// unsubscribes.
func (h *hub) subscribe(box string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done {
		close(ch)
		return ch, func() {}
	}
	if h.subs[box] == nil {
		h.subs[box] = make(map[chan struct{}]struct{})
	}
	h.subs[box][ch] = struct{}{}
	return ch, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if _, ok := h.subs[box][ch]; ok {
			delete(h.subs[box], ch)
			if len(h.subs[box]) == 0 {
				delete(h.subs, box)
			}
		}
	}
}

func (h *hub) notify(box string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs[box] {
		select {
		case ch <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

func (h *hub) notifyAll() {
	h.mu.Lock()
	boxes := make([]string, 0, len(h.subs))
	for box := range h.subs {
		boxes = append(boxes, box)
	}
	h.mu.Unlock()
	for _, box := range boxes {
		h.notify(box)
	}
}

func (h *hub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.done = true
	for box, set := range h.subs {
		for ch := range set {
			close(ch)
		}
		delete(h.subs, box)
	}
}
