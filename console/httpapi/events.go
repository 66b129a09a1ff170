package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/edgebox/edgebox/console/auth"
	"github.com/edgebox/edgebox/console/events"
	"github.com/edgebox/edgebox/errdefs"
)

// How the event stream paces itself: topics at most once a Gap, a comment
// every Heartbeat (so proxies and the browser see the stream alive, and
// the caller's access is checked again), and the browser told to
// reconnect after Retry when the stream drops.
const (
	eventsGap       = time.Second
	eventsHeartbeat = 20 * time.Second
	eventsRetry     = 3 * time.Second
	// eventsWriteTimeout bounds one write to a page.
	eventsWriteTimeout = 10 * time.Second
)

// events streams, as server-sent events, the topics of the caller's
// tenant that change: "event: change" with {"topics": [...]}. A page
// fetches what it shows again when its topic comes; after a reconnect it
// fetches everything, since changes may have come meanwhile. The stream
// ends when the caller's session ends or its role no longer reads.
func (s *server) events(c *gin.Context) {
	if s.Events == nil {
		fail(c, errdefs.NotFound("this console has no event stream"))
		return
	}
	a := accessOf(c)
	sub, cancel, err := s.Events.Subscribe(a.Tenant, a.User)
	if err != nil {
		c.Header("Retry-After", "30")
		fail(c, err)
		return
	}
	defer cancel()
	h := c.Writer.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	c.Status(http.StatusOK)
	rc := http.NewResponseController(c.Writer)
	send := func(s string) bool {
		// A page that stops reading holds its place no longer than this:
		// a stalled stream must not keep a slot of the hub's few.
		rc.SetWriteDeadline(time.Now().Add(eventsWriteTimeout))
		if _, err := fmt.Fprint(c.Writer, s); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !send("retry: " + strconv.Itoa(int(eventsRetry/time.Millisecond)) + "\n\n") {
		return
	}
	ctx := c.Request.Context()
	beat := time.NewTicker(eventsHeartbeat)
	defer beat.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-beat.C:
			if !s.stillAllowed(c, a) {
				send("event: ended\ndata: {}\n\n")
				return
			}
			if !send(": alive\n\n") {
				return
			}
		case <-sub.C:
			if wait := eventsGap - time.Since(last); wait > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
			last = time.Now()
			topics := sub.Take()
			if i := slices.Index(topics, events.User); i >= 0 {
				// The user changed: its session or role may be gone.
				if !s.stillAllowed(c, a) {
					send("event: ended\ndata: {}\n\n")
					return
				}
				topics = slices.Delete(topics, i, i+1)
			}
			if len(topics) == 0 {
				continue
			}
			b, _ := json.Marshal(map[string][]events.Topic{"topics": topics})
			if !send("event: change\ndata: " + string(b) + "\n\n") {
				return
			}
		}
	}
}

// stillAllowed checks again that the caller of a long call may still
// read its tenant: its session or token still works and its role there
// still reads.
func (s *server) stillAllowed(c *gin.Context, a access) bool {
	ctx := c.Request.Context()
	var roles map[string]auth.Role
	if a.Session != nil {
		ck, _ := c.Cookie(SessionCookie)
		_, usr, err := s.Users.CheckSession(ctx, ck)
		if err != nil {
			return false
		}
		roles = usr.Roles
	} else {
		tok, _ := strings.CutPrefix(c.GetHeader("Authorization"), "Bearer ")
		rec, err := s.Tokens.Check(ctx, tok)
		if err != nil {
			return false
		}
		p, err := s.Users.Principal(ctx, rec)
		if err != nil {
			return false
		}
		roles = p.Roles
	}
	r, ok := roles[a.Tenant]
	return (ok && r.Can(auth.Read)) || roles[auth.ConsoleTenant] == auth.Admin
}
