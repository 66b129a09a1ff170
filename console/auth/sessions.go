package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
)

// SessionsPrefix is where browser sessions live on the store, each under
// the SHA-256 of its cookie, so a stolen store yields no usable cookie.
const SessionsPrefix = "auth/sessions/"

// Session is a browser's login.
type Session struct {
	User   string `json:"user"`
	UserID string `json:"user_id,omitempty"` // the user's ID at login
	Epoch  int64  `json:"epoch"`             // the user's Epoch at login
	// CSRF is the value every state-changing request of this session
	// carries in its X-CSRF-Token header: a cross-site page can make the
	// browser send the cookie, but cannot read this.
	CSRF      string    `json:"csrf"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	Remote    string    `json:"remote,omitempty"`
}

// ErrSessionOver is the error of a cookie whose session expired, was
// logged out, or never was.
var ErrSessionOver = errdefs.Permission("your session is over; log in again")

func sessionKey(cookie string) string {
	h := sha256.Sum256([]byte(cookie))
	return SessionsPrefix + hex.EncodeToString(h[:])
}

func randomText(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// StartSession logs usr in for ttl and returns the cookie's value.
func (u *Users) StartSession(ctx context.Context, usr User, remote string, ttl time.Duration) (string, Session, error) {
	now := u.now().UTC()
	cookie := randomText(32)
	s := Session{User: usr.Name, UserID: usr.ID, Epoch: usr.Epoch, CSRF: randomText(24), CreatedAt: now, ExpiresAt: now.Add(ttl), Remote: remote}
	raw, err := json.Marshal(s)
	if err != nil {
		return "", Session{}, err
	}
	if _, err := store.CAS(ctx, u.s, sessionKey(cookie), 0, raw); err != nil {
		return "", Session{}, fmt.Errorf("auth: starting a session: %w", err)
	}
	return cookie, s, nil
}

// CheckSession returns the live session of a cookie and its user.
func (u *Users) CheckSession(ctx context.Context, cookie string) (Session, User, error) {
	var s Session
	if len(cookie) == 0 || len(cookie) > 100 {
		return s, User{}, ErrSessionOver
	}
	kv, err := u.s.Get(ctx, sessionKey(cookie))
	if errors.Is(err, store.ErrNotFound) {
		return s, User{}, ErrSessionOver
	} else if err != nil {
		return s, User{}, fmt.Errorf("auth: reading a session: %w", err)
	}
	if err := json.Unmarshal(kv.Value, &s); err != nil {
		return s, User{}, fmt.Errorf("auth: session record: %w", err)
	}
	if !u.now().Before(s.ExpiresAt) {
		return s, User{}, ErrSessionOver
	}
	usr, _, err := u.Get(ctx, s.User)
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && (usr.Epoch != s.Epoch || usr.ID != s.UserID)) {
		return s, User{}, ErrSessionOver
	} else if err != nil {
		return s, User{}, err
	}
	return s, usr, nil
}

// EndSession logs a cookie's session out. Ending one that is over is not
// an error.
func (u *Users) EndSession(ctx context.Context, cookie string) error {
	if len(cookie) == 0 || len(cookie) > 100 {
		return nil
	}
	if _, err := store.Delete(ctx, u.s, sessionKey(cookie)); err != nil {
		return fmt.Errorf("auth: ending a session: %w", err)
	}
	return nil
}

// SweepSessions deletes the records of sessions that are over: expired, or
// of a user who is gone or logged out everywhere since. It returns how
// many it deleted.
func (u *Users) SweepSessions(ctx context.Context) (int, error) {
	kvs, _, err := u.s.Range(ctx, SessionsPrefix, 0)
	if err != nil {
		return 0, fmt.Errorf("auth: listing sessions: %w", err)
	}
	now := u.now()
	// who is each user's ID and epoch now; a gone user's is {"", -1}.
	type who struct {
		id    string
		epoch int64
	}
	users := map[string]who{}
	n := 0
	for _, kv := range kvs {
		var s Session
		over := json.Unmarshal(kv.Value, &s) != nil || !now.Before(s.ExpiresAt)
		if !over {
			w, ok := users[s.User]
			if !ok {
				usr, _, err := u.Get(ctx, s.User)
				switch {
				case errors.Is(err, errdefs.ErrNotFound):
					w = who{epoch: -1}
				case err != nil:
					return n, err
				default:
					w = who{usr.ID, usr.Epoch}
				}
				users[s.User] = w
			}
			over = w.epoch != s.Epoch || w.id != s.UserID
		}
		if !over {
			continue
		}
		res, err := u.s.Txn(ctx, store.Txn{If: []store.Cmp{{Key: kv.Key, ModRevision: kv.ModRevision}},
			Then: []store.Op{{Key: kv.Key, Delete: true}}})
		if err != nil {
			return n, fmt.Errorf("auth: deleting a session: %w", err)
		}
		if res.Succeeded {
			n++
		}
	}
	return n, nil
}

// RunSweeper sweeps sessions that are over every period until ctx ends,
// then returns nil. A failed sweep is logged and tried again next time.
func (u *Users) RunSweeper(ctx context.Context, every time.Duration, log *slog.Logger) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if n, err := u.SweepSessions(ctx); err != nil && ctx.Err() == nil {
			log.Warn("sweeping browser sessions", "err", err)
		} else if n > 0 {
			log.Debug("browser sessions swept", "sessions", n)
		}
	}
}
