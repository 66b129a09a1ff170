package auth

import (
	"sync"
	"time"
)

// ThrottleConfig bounds password guessing. After Free failures in a row,
// each next attempt waits twice as long as the one before, from one
// second: up to UserMax for a user name (so a guesser slows the attacked
// user's own logins by no more than that), and up to AddrMax for a client
// address (so one client guessing at many users is slowed the most).
type ThrottleConfig struct {
	Free    int
	UserMax time.Duration
	AddrMax time.Duration
	// Forget is how long a key's failures are remembered after its last.
	Forget time.Duration
	// MaxKeys bounds the memory the throttle holds.
	MaxKeys int
}

// DefaultThrottleConfig is what the console uses.
var DefaultThrottleConfig = ThrottleConfig{Free: 3, UserMax: 30 * time.Second, AddrMax: 5 * time.Minute,
	Forget: 15 * time.Minute, MaxKeys: 100_000}

// Throttle counts failed logins per user and per client address. It is
// safe for concurrent use.
type Throttle struct {
	cfg ThrottleConfig
	now func() time.Time

	mu sync.Mutex // guards m
	m  map[string]*strikes
}

type strikes struct {
	n     int
	until time.Time // no attempt before this
	last  time.Time
}

// NewThrottle returns a Throttle.
func NewThrottle(cfg ThrottleConfig, now func() time.Time) *Throttle {
	return &Throttle{cfg: cfg, now: now, m: map[string]*strikes{}}
}

func keys(user, addr string) [2]string { return [2]string{"u:" + user, "a:" + addr} }

// Wait returns how long the next attempt for user from addr must wait; 0
// means it may go now.
func (t *Throttle) Wait(user, addr string) time.Duration {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	var wait time.Duration
	for _, k := range keys(user, addr) {
		if s := t.m[k]; s != nil {
			wait = max(wait, s.until.Sub(now))
		}
	}
	return wait
}

// Failed records a wrong password for user from addr.
func (t *Throttle) Failed(user, addr string) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.m) >= t.cfg.MaxKeys {
		t.forget(now)
	}
	for i, k := range keys(user, addr) {
		s := t.m[k]
		if s == nil {
			if len(t.m) >= t.cfg.MaxKeys {
				continue // full of live guessers: they stay slowed, this one is not counted
			}
			s = &strikes{}
			t.m[k] = s
		}
		if now.Sub(s.last) > t.cfg.Forget {
			s.n = 0
		}
		s.n++
		s.last = now
		if over := s.n - t.cfg.Free; over > 0 {
			limit := t.cfg.UserMax
			if i == 1 {
				limit = t.cfg.AddrMax
			}
			d := limit
			if over < 30 {
				d = min(time.Second<<(over-1), limit)
			}
			s.until = now.Add(d)
		}
	}
}

// Succeeded forgets the failures of user and of addr.
func (t *Throttle) Succeeded(user, addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range keys(user, addr) {
		delete(t.m, k)
	}
}

// forget drops keys whose wait is over and whose last failure is older
// than Forget, or, when that frees nothing, every key whose wait is over.
func (t *Throttle) forget(now time.Time) {
	for k, s := range t.m {
		if now.After(s.until) && now.Sub(s.last) > t.cfg.Forget {
			delete(t.m, k)
		}
	}
	if len(t.m) < t.cfg.MaxKeys {
		return
	}
	for k, s := range t.m {
		if now.After(s.until) {
			delete(t.m, k)
		}
	}
}

// Len returns how many keys the throttle holds.
func (t *Throttle) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}
