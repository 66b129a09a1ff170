package console

import (
	"context"
	"log/slog"
	"strings"

	"github.com/edgebox/edgebox/console/store"
)

// hub watches every box's desired objects with one store watch and calls
// wake with each box whose objects changed. One watch for the fleet, not
// one goroutine per box.
type hub struct {
	prefix  string
	wake    func(box string) // must not block
	wakeAll func()           // the watch was lost: every box re-reads
}

func newHub(wake func(box string), wakeAll func()) *hub {
	return &hub{prefix: "desired/", wake: wake, wakeAll: wakeAll}
}

// watch starts the store watch. Call it before any Sync stream can read
// the state, so no change falls between a stream's first read and the hub.
func (h *hub) watch(ctx context.Context, s store.Store) <-chan store.WatchResponse {
	return s.Watch(ctx, h.prefix, 0)
}

// run follows w until ctx ends. A watch that fails (compacted under a slow
// reader) is opened again and every box woken, so each re-reads its state.
func (h *hub) run(ctx context.Context, s store.Store, w <-chan store.WatchResponse, log *slog.Logger) {
	for {
		h.follow(w)
		if ctx.Err() != nil {
			return
		}
		log.Warn("desired-state watch ended; watching again")
		w = h.watch(ctx, s)
		h.wakeAll()
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
				h.wake(box)
			}
		}
	}
}
