package tunnel

import (
	"math/rand/v2"
	"time"
)

// Backoff is full-jitter exponential backoff: the n-th wait is uniform in
// [0, min(Max, Min·2ⁿ)], so a fleet that lost its console at once comes
// back spread over a second, then two, then four, and never waits more
// than Max.
type Backoff struct {
	Min, Max time.Duration
	// Rand returns a uniform value in [0, n). nil uses math/rand/v2.
	Rand func(n int64) int64
}

// Delay returns the wait before attempt n (0 is the first retry).
func (b Backoff) Delay(n int) time.Duration {
	ceil := b.Min
	for i := 0; i < n && ceil < b.Max; i++ {
		ceil *= 2
	}
	ceil = min(ceil, b.Max)
	rnd := b.Rand
	if rnd == nil {
		rnd = rand.Int64N
	}
	return time.Duration(rnd(int64(ceil) + 1))
}
