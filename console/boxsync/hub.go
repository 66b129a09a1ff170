package boxsync

import (
	"context"
	"log/slog"

	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/store"
)

// hub watches every box's desired objects with one watch and calls wake
// with each box whose objects changed, and moved with each box's new
// revision. One watch for the fleet, not one goroutine per box.
type hub struct {
	desired *desired.State
	wake    func(box string)             // must not block
	wakeAll func()                       // the watch was lost: every box re-reads
	moved   func(box string, rev uint64) // must not block
	log     *slog.Logger
}

func newHub(d *desired.State, wake func(box string), wakeAll func(), moved func(box string, rev uint64), log *slog.Logger) *hub {
	return &hub{desired: d, wake: wake, wakeAll: wakeAll, moved: moved, log: log}
}

// watch starts the watch. Call it before any Sync stream can read the
// state, so no change falls between a stream's first read and the hub.
func (h *hub) watch(ctx context.Context) <-chan store.WatchResponse {
	return h.desired.WatchObjects(ctx)
}

// run follows w until ctx ends. A watch that fails (compacted under a slow
// reader) is opened again and every box woken, so each re-reads its state.
func (h *hub) run(ctx context.Context, w <-chan store.WatchResponse) {
	for {
		h.follow(w)
		if ctx.Err() != nil {
			return
		}
		h.log.Warn("desired-state watch ended; watching again")
		w = h.watch(ctx)
		h.wakeAll()
	}
}

func (h *hub) follow(w <-chan store.WatchResponse) {
	for r := range w {
		if r.Err != nil {
			return
		}
		for _, e := range r.Events {
			if box, ok := desired.BoxOf(e); ok {
				h.wake(box)
			} else if box, rev, ok := desired.RevisionOf(e); ok {
				h.moved(box, rev)
			}
		}
	}
}
