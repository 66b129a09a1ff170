// Package leak counts goroutines for the leak checks of tests that run a
// whole console or agent.
package leak

import (
	"runtime"
	"strings"
	"time"
)

// leftBehind are goroutines that libraries a console uses start and never
// stop, whatever the caller does; Count does not count them.
var leftBehind = []string{
	// distribution's App starts an event broadcaster that App.Shutdown
	// does not close (registry/handlers/app.go): one per registry.Open.
	"github.com/docker/go-events.(*Broadcaster).run",
}

// Count counts the process's goroutines but those libraries leave
// behind for good, and returns their stacks, for leak checks of a whole
// console or agent (tests that use it must not be parallel).
func Count() (int, string) {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var kept []string
next:
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, lb := range leftBehind {
			if strings.Contains(g, lb) {
				continue next
			}
		}
		kept = append(kept, g)
	}
	return len(kept), strings.Join(kept, "\n\n")
}

// Settle waits up to d for the goroutines Count counts to be no more
// than before, and returns how many there are then, with their stacks.
func Settle(before int, d time.Duration) (int, string) {
	deadline := time.Now().Add(d)
	n, all := Count()
	for n > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		n, all = Count()
	}
	return n, all
}
