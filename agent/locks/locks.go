// Package locks holds the update locks that workloads take through the
// agent's local API: while a robot signs a payment, say, it takes a lock,
// and the box is not updated (no workload replaced or removed, no rollout
// wave started on it) until the lock is released or expires. Locks
// survive a restart of the agent: they are written to disk at each change.
package locks

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/internal/atomicfile"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Lock is one update lock.
type Lock struct {
	// Holder names who holds it: a workload's name, or any object name.
	// One holder holds one lock; taking it again renews it.
	Holder string    `json:"holder"`
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
	Until  time.Time `json:"until"`
}

// Bounds on locks.
const (
	// MaxTTL bounds how long a lock lasts without renewal, so a workload
	// that dies holding one does not hold the box for ever.
	MaxTTL = time.Hour
	// DefaultTTL is a lock's time when its taker names none.
	DefaultTTL = 10 * time.Minute
	// MaxLocks bounds the locks a box holds at once.
	MaxLocks  = 64
	maxReason = 256
)

// Set is a box's update locks, kept in a file. It is safe for
// concurrent use.
type Set struct {
	path string
	now  func() time.Time

	mu     sync.Mutex
	locks  map[string]Lock
	change chan struct{} // signalled on every change
}

// Open reads the locks kept at path (none when it does not exist). A
// damaged file holds no locks: the box can then be updated, and says so
// in its log through the error.
func Open(path string, now func() time.Time) (*Set, error) {
	if now == nil {
		now = time.Now
	}
	s := &Set{path: path, now: now, locks: map[string]Lock{}, change: make(chan struct{}, 1)}
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	} else if err != nil {
		return nil, err
	}
	var ls []Lock
	if err := json.Unmarshal(raw, &ls); err != nil {
		return s, fmt.Errorf("locks: %s is damaged, no lock held: %w", path, err)
	}
	for _, l := range ls {
		if edgeboxv1.ValidObjectName(l.Holder) && l.Until.Sub(l.Since) <= MaxTTL {
			s.locks[l.Holder] = l
		}
	}
	return s, nil
}

// Changed is signalled after every change of the set, expiries aside.
func (s *Set) Changed() <-chan struct{} { return s.change }

// Take takes or renews holder's lock for ttl (DefaultTTL when 0).
func (s *Set) Take(holder, reason string, ttl time.Duration) (Lock, error) {
	if !edgeboxv1.ValidObjectName(holder) {
		return Lock{}, errdefs.Invalid("holder %q: use 1-63 lower-case letters, digits, '.', '_' or '-'", clip(holder, 64))
	}
	if len(reason) > maxReason {
		return Lock{}, errdefs.Invalid("reason: at most %d bytes", maxReason)
	}
	if ttl == 0 {
		ttl = DefaultTTL
	}
	if ttl < time.Second || ttl > MaxTTL {
		return Lock{}, errdefs.Invalid("ttl %s: from 1s to %s", ttl, MaxTTL)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now().UTC()
	s.prune(now)
	l, renew := s.locks[holder]
	was := l
	if !renew && len(s.locks) >= MaxLocks {
		return Lock{}, errdefs.Unavailable("the box holds %d update locks, the most it holds; release one first", MaxLocks)
	}
	if !renew {
		l = Lock{Holder: holder, Since: now}
	}
	l.Reason, l.Until = strings.ToValidUTF8(reason, ""), now.Add(ttl)
	if l.Until.Sub(l.Since) > MaxTTL {
		l.Since = l.Until.Add(-MaxTTL) // a renewed lock counts its time from its last hour
	}
	s.locks[holder] = l
	if err := s.save(); err != nil {
		if renew {
			s.locks[holder] = was // still held as it was
		} else {
			delete(s.locks, holder)
		}
		return Lock{}, err
	}
	s.signal()
	return l, nil
}

// Release gives holder's lock back.
func (s *Set) Release(holder string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prune(s.now())
	l, ok := s.locks[holder]
	if !ok {
		return errdefs.NotFound("no update lock held by %q", clip(holder, 64))
	}
	delete(s.locks, holder)
	if err := s.save(); err != nil {
		s.locks[holder] = l
		return err
	}
	s.signal()
	return nil
}

// Held returns the locks held now, the soonest to end first.
func (s *Set) Held() []Lock {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prune(s.now())
	out := make([]Lock, 0, len(s.locks))
	for _, l := range s.locks {
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b Lock) int { return a.Until.Compare(b.Until) })
	return out
}

// Holding says, when a lock is held, why the box may not be updated now.
func (s *Set) Holding() (bool, string) {
	held := s.Held()
	if len(held) == 0 {
		return false, ""
	}
	l := held[len(held)-1]
	why := fmt.Sprintf("update lock held by %s until %s", l.Holder, l.Until.Format(time.RFC3339))
	if l.Reason != "" {
		why += ": " + l.Reason
	}
	if len(held) > 1 {
		why += fmt.Sprintf(" (and %d more)", len(held)-1)
	}
	return true, why
}

// prune drops expired locks; the file keeps them until the next change,
// which is harmless: they are expired there too. Hold mu.
func (s *Set) prune(now time.Time) {
	for h, l := range s.locks {
		if !now.Before(l.Until) {
			delete(s.locks, h)
		}
	}
}

// save writes the locks, synced: a lock a workload was told it holds
// survives a crash of the agent. Hold mu.
func (s *Set) save() error {
	ls := make([]Lock, 0, len(s.locks))
	for _, l := range s.locks {
		ls = append(ls, l)
	}
	raw, err := json.Marshal(ls)
	if err != nil {
		return err
	}
	return atomicfile.Write(s.path, raw)
}

func (s *Set) signal() {
	select {
	case s.change <- struct{}{}:
	default:
	}
}

func clip(s string, n int) string {
	if len(s) > n {
		return strings.ToValidUTF8(s[:n], "") + "…"
	}
	return s
}
