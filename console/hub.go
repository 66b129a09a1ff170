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
	mu     sync.Mutex // guards subs, next and done
	subs   map[string]map[uint64]func()
	next   uint64
	done   bool
	prefix string
}

func newHub() *hub {
	return &hub{subs: make(map[string]map[uint64]func()), prefix: "desired/"}
}

// watch starts the store watch. Call it before any Sync stream can read
// the state, so no change falls between a stream's first read and the hub.
func (h *hub) watch(ctx context.Context, s store.Store) <-chan store.WatchResponse {
	return s.Watch(ctx, h.prefix, 0)
}

// run follows w until ctx ends. A watch that fails (compacted under a slow
// reader) is opened again and every subscriber woken, so each re-reads its
// box's state.
func (h *hub) run(ctx context.Context, s store.Store, w <-chan store.WatchResponse, log *slog.Logger) {
	defer h.stop()
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

// subscribe calls wake whenever box's objects change, until cancel is
// called or the hub stops. wake must not block.
func (h *hub) subscribe(box string, wake func()) (cancel func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done {
		return func() {}
	}
	if h.subs[box] == nil {
		h.subs[box] = make(map[uint64]func())
	}
	id := h.next
	h.next++
	h.subs[box][id] = wake
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.subs[box], id)
		if len(h.subs[box]) == 0 {
			delete(h.subs, box)
		}
	}
}

func (h *hub) notify(box string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, wake := range h.subs[box] {
		wake()
	}
}

func (h *hub) notifyAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, set := range h.subs {
		for _, wake := range set {
			wake()
		}
	}
}

func (h *hub) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.done = true
	clear(h.subs)
}
