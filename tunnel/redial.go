package tunnel

import (
	"math/rand/v2"
	"time"
)

// DefaultRejoin is the window a box comes back within after a console said
// goodbye or after a healthy session broke: each box waits a uniform time
// in [0, 5 s]. A console that needs longer to greet every box it holds
// says so while the box is online (Client.AdviseRejoin), so that a fleet
// it cannot take within 5 s arrives at about the pace it greets boxes,
// instead of most of it being told to come back later; a box it turns
// away anyway waits as it is told.
const DefaultRejoin = 5 * time.Second

// flapsAllowed is how many short healthy sessions in a row (each ending
// without a goodbye) are followed by a quick redial. Past it, the window
// doubles with each further one up to Backoff.Max: a box whose sessions keep
// being cut (a console that crashes as boxes return, a second box with the
// same identity) does not hammer the console every few seconds.
const flapsAllowed = 3

// ending says how one dial, and the session it brought up, ended.
type ending struct {
	// up is false when no session came up: the dial failed, or the
	// console refused the box.
	up bool
	// lasted is how long the link stayed up, across renewals.
	lasted time.Duration
	// healthy means a round trip over the session succeeded after the
	// handshake: a ping was answered, or a stream the box opened was
	// accepted by the console (Session.healthy).
	healthy bool
	// goAway means the console said it was going away (shutting down)
	// before the session ended.
	goAway bool
	// busy is the wait a console too busy to take the session asked for.
	busy time.Duration
}

// redial decides how long a box waits before it dials the console again.
// It is not safe for concurrent use; Client.Run owns one.
//
//   - A failed dial, and a session that ended before it was healthy (a
//     console that sheds boxes after the handshake), count as failures:
//     full-jitter exponential backoff, Backoff.Delay(failures so far), from
//     Backoff.Min up to Backoff.Max.
//   - A console too busy to take the session said when to come back: the
//     box waits that long (the console spreads the boxes it turns away),
//     and neither failures nor flaps change: busy is not broken.
//   - A session that ended after the console said goodbye: the console is
//     restarting on purpose. Failures are forgotten and the box redials
//     within the rejoin window (uniform in [0, rejoin]).
//   - A session that was healthy, or stayed up longer than Backoff.Max:
//     the console worked, so failures are forgotten and the box redials
//     within the rejoin window. Only flapsAllowed short ones in a row get
//     that window; after them it doubles with each (see flapsAllowed). A
//     goodbye or a session longer than Backoff.Max ends the run.
type redial struct {
	backoff Backoff
	rejoin  time.Duration // window after a goodbye or a healthy session
	fails   int           // failures in a row
	flaps   int           // short healthy sessions in a row without a goodbye
	// hurry, while it reports true, keeps a failure's wait within
	// backoff.Min (Client.Hurry); nil never hurries.
	hurry func() bool
}

// next returns the wait before the next dial after e, and why, for the log.
func (r *redial) next(e ending) (time.Duration, string) {
	stable := e.up && e.lasted > r.backoff.Max
	switch {
	case !e.up && e.busy > 0:
		return e.busy, "the console is busy and said when to come back"
	case e.up && e.goAway:
		r.fails, r.flaps = 0, 0
		return r.jitter(r.rejoin), "the console said it was going away"
	case stable:
		r.fails, r.flaps = 0, 0
		return r.jitter(r.rejoin), "the session broke after a long life"
	case e.up && e.healthy:
		r.fails = 0
		r.flaps++
		ceil := r.rejoin
		for i := flapsAllowed; i < r.flaps && ceil < r.backoff.Max; i++ {
			ceil *= 2
		}
		if r.flaps > flapsAllowed {
			return r.jitter(min(ceil, r.backoff.Max)), "short sessions keep breaking"
		}
		return r.jitter(ceil), "a healthy session broke"
	default:
		wait := r.backoff.Delay(r.fails)
		r.fails++
		if r.hurry != nil && r.hurry() {
			wait = min(wait, r.jitter(r.backoff.Min))
		}
		if e.up {
			return wait, "the session ended before any round trip"
		}
		return wait, "the dial failed"
	}
}

// jitter returns a uniform wait in [0, ceil].
func (r *redial) jitter(ceil time.Duration) time.Duration {
	rnd := r.backoff.Rand
	if rnd == nil {
		rnd = rand.Int64N
	}
	return time.Duration(rnd(int64(ceil) + 1))
}
