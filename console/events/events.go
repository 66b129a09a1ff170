// Package events tells the web console's pages what changed, so they
// fetch again at once rather than poll: one watch of the store and the
// tunnel's session changes feed a Hub, which tells each subscriber the
// topics of its own tenant that changed, at most once a second. It tells
// topics, never content: a page fetches what it shows through the API,
// which checks the caller's role as always.
package events

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
)

// Topic names what changed.
type Topic string

// The topics.
const (
	Boxes Topic = "boxes" // a box's record or its session
	State Topic = "state" // a box's desired state or what it reports of it
	Apps  Topic = "apps"  // apps, releases, pins
	Keys  Topic = "keys"  // UKEYs
	Audit Topic = "audit" // the audit log
	// All says "fetch everything again": changes may have been missed.
	All Topic = "all"
	// User says the subscriber's user changed (its roles, its password,
	// a log out everywhere): its access is to be checked again at once.
	User Topic = "user"
)

// BoxLookup finds a box's record, for the tenant of a box whose changes
// do not name it.
type BoxLookup func(ctx context.Context, id string) (fleet.Box, error)

// ErrFull is the answer to a subscriber too many.
var ErrFull = errdefs.Unavailable("too many live pages are open on this console; this page fetches every 30 s instead")

// Hub fans changes out to subscribers. It is safe for concurrent use; Run
// feeds it.
type Hub struct {
	s      store.Store
	lookup BoxLookup
	max    int
	log    *slog.Logger

	sessions chan string   // boxes whose session began or ended, for Run
	woken    chan struct{} // a first subscriber came: Run watches again

	mu       sync.Mutex
	subs     map[*Sub]struct{}
	tenantOf map[string]string // box ID → tenant, as learned
	overflow bool              // sessions overflowed: Run tells everyone All
}

// Sub is one subscriber: a page of one user in one tenant.
type Sub struct {
	tenant, user string
	// C gets a value when topics are waiting; Take takes them.
	C chan struct{}

	mu    sync.Mutex
	dirty map[Topic]bool
}

// NewHub returns a hub over s that admits at most max subscribers at once.
func NewHub(s store.Store, lookup BoxLookup, max int, log *slog.Logger) *Hub {
	return &Hub{s: s, lookup: lookup, max: max, log: log.With("component", "events"),
		sessions: make(chan string, 4096), woken: make(chan struct{}, 1), subs: map[*Sub]struct{}{}, tenantOf: map[string]string{}}
}

// Subscribe adds a subscriber for tenant's changes, and its user's;
// cancel removes it.
func (h *Hub) Subscribe(tenant, user string) (sub *Sub, cancel func(), err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.subs) >= h.max {
		return nil, nil, ErrFull
	}
	sub = &Sub{tenant: tenant, user: user, C: make(chan struct{}, 1), dirty: map[Topic]bool{}}
	h.subs[sub] = struct{}{}
	select {
	case h.woken <- struct{}{}:
	default:
	}
	return sub, func() {
		h.mu.Lock()
		delete(h.subs, sub)
		h.mu.Unlock()
	}, nil
}

// Take returns the topics that changed since the last Take, sorted.
func (s *Sub) Take() []Topic {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Topic, 0, len(s.dirty))
	for _, t := range []Topic{All, User, Boxes, State, Apps, Keys, Audit} {
		if s.dirty[t] {
			out = append(out, t)
		}
	}
	clear(s.dirty)
	return out
}

func (s *Sub) mark(t Topic) {
	s.mu.Lock()
	s.dirty[t] = true
	s.mu.Unlock()
	select {
	case s.C <- struct{}{}:
	default:
	}
}

// publish tells tenant's subscribers ("" for every tenant) that t
// changed.
func (h *Hub) publish(tenant string, t Topic) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		if tenant == "" || s.tenant == tenant {
			s.mark(t)
		}
	}
}

func (h *Hub) idle() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs) == 0
}

// BoxChanged says a box's session began or ended. It does not block: it
// is called from the tunnel's session events.
func (h *Hub) BoxChanged(box string) {
	if h.idle() {
		return
	}
	select {
	case h.sessions <- box:
	default:
		h.mu.Lock()
		h.overflow = true
		h.mu.Unlock()
	}
}

// boxTenant returns the tenant of box, learned or looked up; "" when the
// box is unknown.
func (h *Hub) boxTenant(ctx context.Context, box string) string {
	h.mu.Lock()
	t, ok := h.tenantOf[box]
	h.mu.Unlock()
	if ok {
		return t
	}
	b, err := h.lookup(ctx, box)
	if err != nil {
		return ""
	}
	h.learn(box, b.TenantID)
	return b.TenantID
}

func (h *Hub) learn(box, tenant string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.tenantOf) > 1_000_000 {
		clear(h.tenantOf) // a bound; it fills again as boxes change
	}
	h.tenantOf[box] = tenant
}

// Run watches the store and the sessions until ctx ends, then returns
// nil; while nobody subscribes, it watches nothing, so an idle hub costs
// the console nothing during a storm of boxes. When it falls behind (the
// store's history is compacted past it, or a storm of sessions
// overflows), every subscriber is told to fetch everything again.
func (h *Hub) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		if h.idle() {
			select {
			case <-ctx.Done():
				return nil
			case <-h.woken:
			}
			continue
		}
		rev, err := h.s.Revision(ctx)
		if err != nil {
			if ctx.Err() == nil {
				h.log.Warn("reading the store revision", "err", err)
				time.Sleep(time.Second)
			}
			continue
		}
		wctx, cancel := context.WithCancel(ctx)
		watch := h.s.Watch(wctx, "", rev+1)
		// What changed before the watch began is unknown to the pages
		// that came meanwhile: they fetch everything.
		h.publish("", All)
		h.follow(ctx, watch)
		cancel()
	}
	return nil
}

// follow routes changes from watch and the sessions until the watch
// ends or nobody subscribes any more.
func (h *Hub) follow(ctx context.Context, watch <-chan store.WatchResponse) {
	check := time.NewTicker(5 * time.Second)
	defer check.Stop()
	for {
		select {
		case <-check.C:
			if h.idle() {
				return
			}
		case box := <-h.sessions:
			h.mu.Lock()
			over := h.overflow
			h.overflow = false
			h.mu.Unlock()
			if over {
				h.publish("", All)
			}
			if t := h.boxTenant(ctx, box); t != "" {
				h.publish(t, Boxes)
			}
		case resp, ok := <-watch:
			if !ok {
				return
			}
			if resp.Err != nil {
				if ctx.Err() == nil {
					h.log.Warn("store watch ended; pages fetch everything again", "err", resp.Err)
					h.publish("", All)
				}
				return
			}
			for _, ev := range resp.Events {
				h.route(ctx, ev)
			}
		}
	}
}

// route tells the subscribers of the tenant a change is about.
func (h *Hub) route(ctx context.Context, ev store.Event) {
	first, rest, _ := strings.Cut(ev.KV.Key, "/")
	second, _, _ := strings.Cut(rest, "/")
	switch first {
	case "auth":
		if name, ok := strings.CutPrefix(rest, "users/"); ok {
			h.mu.Lock()
			for s := range h.subs {
				if s.user == name {
					s.mark(User)
				}
			}
			h.mu.Unlock()
		}
	case "fleet":
		id, ok := strings.CutPrefix(ev.KV.Key, "fleet/boxes/")
		if !ok {
			return
		}
		if ev.Type == store.EventPut {
			var b struct {
				TenantID string `json:"tenant_id"`
			}
			if json.Unmarshal(ev.KV.Value, &b) == nil && b.TenantID != "" {
				h.learn(id, b.TenantID)
			}
		}
		if t := h.boxTenant(ctx, id); t != "" {
			h.publish(t, Boxes)
		}
	case "desired", "status":
		if t := h.boxTenant(ctx, second); t != "" {
			h.publish(t, State)
		}
	case "apps":
		h.publish(second, Apps)
	case "keys":
		h.publish(second, Keys)
	case "audit":
		h.publish(second, Audit)
	}
}
