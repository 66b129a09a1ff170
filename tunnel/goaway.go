package tunnel

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// kindGoAway is the console's goodbye: a stream it opens on each session
// when it shuts down, before it closes them. The box answers it itself (no
// listener sees it), remembers it, and on losing the session redials within
// its rejoin window instead of its grown backoff. yamux's own GoAway frame
// cannot serve: the far side learns of it only by failing to open a stream,
// and not at all once the session is closed. A box that predates goodbyes
// refuses the stream as an unknown kind, and the console closes its session
// all the same.
const kindGoAway Kind = "goaway"

// Goodbye limits on the console: how long Close waits for boxes to confirm
// a goodbye (a box that has not confirmed by then is closed anyway), and how
// many goodbyes are in flight at once. 1,024 at a time over 80 ms links
// says goodbye to 10,000 boxes in under a second.
const (
	goodbyeTimeout = 2 * time.Second
	goodbyeWorkers = 1024
)

// GoAwayReason is what the console tells boxes when it shuts down.
const GoAwayReason = "console shutting down"

// sayGoodbye tells the far side we are going away and waits for it to
// confirm, as long as ctx allows.
func (s *Session) sayGoodbye(ctx context.Context, reason string) error {
	c, err := s.Open(ctx, kindGoAway, map[string]string{"reason": reason})
	if err != nil {
		return err
	}
	return c.Close()
}

// heardGoodbye records the far side's goodbye and confirms it.
func (s *Session) heardGoodbye(st *yamux.Stream, h Header) {
	reason := h.Meta["reason"]
	s.goAway.Store(&reason)
	s.log.Info("the console is going away", "peer", s.peer, "reason", reason)
	s.setDeadline(st.SetWriteDeadline, time.Now().Add(s.cfg.OpenTimeout))
	writeVerdict(st, "")
	s.untrack(st)
	st.Close()
}

// GoneAway reports whether the far side said it is going away, and why.
func (s *Session) GoneAway() (reason string, ok bool) {
	if r := s.goAway.Load(); r != nil {
		return *r, true
	}
	return "", false
}

// sayGoodbyes tells every session's box that the console is going away,
// at most goodbyeWorkers at a time, for at most goodbyeTimeout.
func sayGoodbyes(all []*Session, log *slog.Logger) {
	if len(all) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), goodbyeTimeout)
	defer cancel()
	work := make(chan *Session)
	var wg sync.WaitGroup
	for range min(len(all), goodbyeWorkers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for sess := range work {
				if err := sess.sayGoodbye(ctx, GoAwayReason); err != nil {
					log.Debug("goodbye not confirmed", "box_id", sess.Peer(), "err", err)
				}
			}
		}()
	}
	for _, sess := range all {
		work <- sess
	}
	close(work)
	wg.Wait()
}
