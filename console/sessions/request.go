package sessions

import (
	"context"
	"fmt"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/errdefs"
)

// Asking is a screen or a forward asking for the approval a four-eyes box
// needs before it opens. (A shell waits for its approval in its own
// session, which tells its operator; a screen's viewer and a forward's
// connections cannot be told, so they ask first.)
type Asking struct {
	TenantID, Box, BoxName, User, Remote string
	Kind                                 string // KindScreen or KindForward
	Workload                             string // a screen's VM
	Target                               string // a forward's target
	ViewOnly                             bool
}

// Ask records a request for approval and holds it for ApprovalWait: a
// second user approves it (Approve) and its user then opens the screen
// or forward with its ID (Take). Its record says how it went.
func (b *Broker) Ask(ctx context.Context, a Asking) (Record, error) {
	if a.Kind != KindScreen && a.Kind != KindForward {
		return Record{}, errdefs.Invalid("only a screen or a forward asks for approval ahead")
	}
	now := b.cfg.Now()
	rec := Record{ID: newID(now), TenantID: a.TenantID, Box: a.Box, BoxName: a.BoxName, Kind: a.Kind, Workload: a.Workload,
		Target: a.Target, ViewOnly: a.ViewOnly, User: a.User, Remote: a.Remote, Started: now, FourEyes: true}
	// End ends a request as it ends a session: through its cancel.
	ended, cancel := context.WithCancelCause(context.Background())
	l := &live{rec: rec, cancel: cancel, approve: make(chan string, 1), watchers: map[*watcher]struct{}{}, asking: true,
		taken: make(chan struct{}), askEnded: ended.Done()}
	b.mu.Lock()
	if len(b.live) >= b.cfg.MaxLive {
		b.mu.Unlock()
		cancel(nil)
		return Record{}, errdefs.Unavailable("the console runs %d sessions, its most; try again later", b.cfg.MaxLive)
	}
	b.live[rec.ID] = l
	b.mu.Unlock()
	what := "screen of VM " + a.Workload
	if a.Kind == KindForward {
		what = "forward to " + a.Target
	}
	if err := b.put(ctx, rec, audit.Entry{TenantID: rec.TenantID, Actor: rec.User, Remote: rec.Remote, Action: "session.ask",
		Target: target(rec), Result: "ok", Detail: fmt.Sprintf("asked approval for a %s (%s)", what, rec.ID)}); err != nil {
		b.mu.Lock()
		delete(b.live, rec.ID)
		b.mu.Unlock()
		cancel(nil)
		return Record{}, err
	}
	// Unless it is taken in time, the request ends, approved or not; a
	// user may end it sooner.
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer cancel(nil)
		t := time.NewTimer(b.cfg.ApprovalWait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ended.Done():
		case <-l.taken:
			return
		}
		b.mu.Lock()
		cur, ok := b.live[rec.ID]
		if ok && cur == l {
			delete(b.live, rec.ID)
		}
		b.mu.Unlock()
		if !ok || cur != l {
			return
		}
		l.mu.Lock()
		by := l.approved
		l.mu.Unlock()
		end := b.cfg.Now()
		r := rec
		r.Ended, r.EndedBy = &end, "not approved"
		if by != "" {
			r.ApprovedBy, r.EndedBy = by, "not opened"
		}
		if name := causeName(context.Cause(ended)); name != "" {
			r.EndedBy = name // ended by a user, or the console stopping
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		b.put(ctx, r, audit.Entry{TenantID: r.TenantID, Actor: r.User, Action: "session.end", Target: target(r),
			Result: r.EndedBy, Detail: fmt.Sprintf("the request %s ended: %s", r.ID, r.EndedBy)})
	}()
	return rec, nil
}

// Take hands over an approved request to the screen or forward it asked
// for: same user, box, kind and target. It returns the request's record,
// which the session goes on with.
func (b *Broker) Take(id string, want Record) (Record, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	l, ok := b.live[id]
	if !ok || !l.asking || l.rec.TenantID != want.TenantID {
		return Record{}, errdefs.NotFound("no request %q waits to be opened; ask for approval again", id)
	}
	r := l.rec
	select {
	case <-l.askEnded:
		return Record{}, errdefs.NotFound("request %s was ended; ask for approval again", id)
	default:
	}
	if r.User != want.User || r.Box != want.Box || r.Kind != want.Kind || r.Workload != want.Workload || r.Target != want.Target || r.ViewOnly != want.ViewOnly {
		return Record{}, errdefs.Permission("request %s was for another session", id)
	}
	l.mu.Lock()
	by := l.approved
	l.mu.Unlock()
	if by == "" {
		return Record{}, errdefs.Conflict("request %s is not approved yet", id)
	}
	delete(b.live, id)
	close(l.taken)
	now := b.cfg.Now()
	r.ApprovedBy, r.ApprovedAt = by, &now
	return r, nil
}
