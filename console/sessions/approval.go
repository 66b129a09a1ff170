package sessions

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/sessionwire"
)

// Approve lets a four-eyes session that waits run, on behalf of who: a
// second user, whose role the caller has checked.
func (b *Broker) Approve(ctx context.Context, who audit.Actor, id string) error {
	b.mu.Lock()
	l, ok := b.live[id]
	b.mu.Unlock()
	if !ok || l.rec.TenantID != who.TenantID {
		return errdefs.NotFound("no live session %q", id)
	}
	if l.approve == nil {
		return errdefs.Conflict("session %s needs no approval", id)
	}
	if l.rec.User == who.Name {
		return errdefs.Permission("a session is approved by a second user, not by the one who opened it")
	}
	l.mu.Lock()
	if l.approved != "" {
		l.mu.Unlock()
		return errdefs.Conflict("session %s was approved already, by %s", id, l.approved)
	}
	l.approved = who.Name
	l.mu.Unlock()
	// The record says who approved it from now on, with the audit entry;
	// only while it has not ended, which the session may write meanwhile.
	undo := func() {
		l.mu.Lock()
		l.approved = ""
		l.mu.Unlock()
	}
	kv, err := b.cfg.Store.Get(ctx, key(l.rec.TenantID, id))
	var rec Record
	if err == nil {
		err = json.Unmarshal(kv.Value, &rec)
	}
	if err != nil {
		undo()
		return fmt.Errorf("recording the approval: %w", err)
	}
	if !rec.Live() {
		undo()
		return errdefs.Conflict("session %s ended already (%s)", id, rec.EndedBy)
	}
	now := b.cfg.Now()
	rec.ApprovedBy, rec.ApprovedAt = who.Name, &now
	raw, _ := json.Marshal(rec)
	e := who.Did("session.approve", target(l.rec), fmt.Sprintf("approved %s's session %s", l.rec.User, id))
	res, err := b.cfg.Store.Txn(ctx, store.Txn{If: []store.Cmp{{Key: kv.Key, ModRevision: kv.ModRevision}},
		Then: []store.Op{{Key: kv.Key, Value: raw}, audit.Op(now, e)}})
	if err == nil && !res.Succeeded {
		err = errdefs.Conflict("session %s changed while it was approved; look again", id)
	}
	if err != nil {
		undo()
		return err
	}
	l.approve <- who.Name // buffered: the session takes it when it can
	return nil
}

// CanEnd reports whether user may end or watch the live session r: its
// own, the one they approved; admins may any (the caller checks roles).
func (b *Broker) CanEnd(r Record, user string) bool {
	if r.User == user {
		return true
	}
	b.mu.Lock()
	l, ok := b.live[r.ID]
	b.mu.Unlock()
	if !ok {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.approved == user
}

// watcher is a user watching a live session.
type watcher struct {
	ch   chan []byte
	gone chan struct{} // closed when the watcher is dropped
}

// watchBuffer bounds the frames a watcher may fall behind by before it
// is dropped: a slow watcher never slows the session.
const watchBuffer = 256

// broadcast gives msg to every watcher, dropping those too far behind.
func (l *live) broadcast(msg []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for w := range l.watchers {
		select {
		case w.ch <- msg:
		default:
			delete(l.watchers, w)
			close(w.gone)
		}
	}
}

// resized tells every watcher the terminal's new size, so a watching
// terminal draws what the operator's does.
func (l *live) resized(id string, size sessionwire.Resize) {
	l.mu.Lock()
	same := l.size == size
	l.size = size
	l.mu.Unlock()
	if !same {
		l.broadcast(sessionwire.EncodeJSONFrame(sessionwire.FrameStatus, sessionwire.SessionStatus{Session: id, State: "resized", Cols: size.Cols, Rows: size.Rows}))
	}
}

// closeWatchers lets every watcher go once the session has ended, and
// takes no more.
func (l *live) closeWatchers() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for w := range l.watchers {
		delete(l.watchers, w)
		close(w.ch)
	}
}

// Watch shows a live session's output to op, read only, until the
// session ends or op leaves. The caller has checked that user may
// (CanEnd, or an admin).
func (b *Broker) Watch(ctx context.Context, tenant, id, user string, op Operator) {
	defer op.Close()
	b.mu.Lock()
	l, ok := b.live[id]
	b.mu.Unlock()
	if !ok || l.rec.TenantID != tenant || (l.rec.Kind != KindShell && l.rec.Kind != KindExec) || l.asking {
		op.WriteMessage(sessionwire.EncodeJSONFrame(sessionwire.FrameExit, sessionwire.SessionExit{Code: -1, Error: fmt.Sprintf("no live shell or command %q to watch", id)}))
		return
	}
	w := &watcher{ch: make(chan []byte, watchBuffer), gone: make(chan struct{})}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		op.WriteMessage(sessionwire.EncodeJSONFrame(sessionwire.FrameExit, sessionwire.SessionExit{Code: -1, Error: "the session has ended"}))
		return
	}
	l.watchers[w] = struct{}{}
	size := l.size
	l.mu.Unlock()
	b.cfg.Log.Info("a user watches a session", "session", id, "user", user)
	e := audit.Entry{TenantID: tenant, Actor: user, Action: "session.watch", Target: target(l.rec), Result: "ok",
		Detail: fmt.Sprintf("watched %s's session %s", l.rec.User, id)}
	if err := audit.New(b.cfg.Store, b.cfg.Now).Append(ctx, e); err != nil {
		b.cfg.Log.Error("a session's watcher could not be audited", "session", id, "err", err)
	}
	left := make(chan struct{})
	go func() {
		defer close(left)
		for {
			if _, err := op.ReadMessage(); err != nil {
				return // a watcher's input goes nowhere; its end is its leaving
			}
		}
	}()
	defer func() {
		l.mu.Lock()
		if _, ok := l.watchers[w]; ok {
			delete(l.watchers, w)
		}
		l.mu.Unlock()
	}()
	msg := fmt.Sprintf("watching %s's session on %s, read only", l.rec.User, cmpOr(l.rec.BoxName, l.rec.Box))
	if size.Cols > 0 {
		msg += fmt.Sprintf(", in a terminal of %dx%d", size.Cols, size.Rows)
	}
	op.WriteMessage(sessionwire.EncodeJSONFrame(sessionwire.FrameStatus, sessionwire.SessionStatus{Session: id, State: "watching",
		Message: msg, Cols: size.Cols, Rows: size.Rows}))
	for {
		select {
		case msg, ok := <-w.ch:
			if !ok {
				return
			}
			op.WriteMessage(msg)
		case <-w.gone:
			op.WriteMessage(sessionwire.EncodeJSONFrame(sessionwire.FrameExit, sessionwire.SessionExit{Code: -1, Error: "this watch fell too far behind the session and was dropped"}))
			return
		case <-left:
			return
		case <-ctx.Done():
			return
		}
	}
}
