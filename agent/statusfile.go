package agent

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/edgebox/edgebox/internal/atomicfile"
)

// statusEvery bounds how often status.json is written. Every change of
// the status wrote it: a session up or down, each hello, each failed dial,
// four or more writes per reconnect. Across 10,000 simulated boxes that
// was a fifth of their CPU in a reconnect storm (docs/benchmarks.md); on a
// real box it is flash wear for a file that people read. The newest status
// is written at most statusEvery late, and at once when the agent stops.
const statusEvery = time.Second

// statusWriter writes the agent's status file, at most every statusEvery.
type statusWriter struct {
	path string
	skip func() bool // true while nothing may be written (a wipe)
	warn func(error)

	mu      sync.Mutex // serialises writes; guards the fields below
	last    time.Time  // when the file was last written
	seq     uint64     // the newest status put
	pending *Status    // the newest status not written yet
	timer   *time.Timer
	closed  bool
}

// put has s, the status numbered seq, written now, or within statusEvery
// when the file was written less than that ago. A status older than one
// put before it (two changes racing here) is dropped.
func (w *statusWriter) put(s Status, seq uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if seq < w.seq {
		return
	}
	w.seq = seq
	if w.closed {
		w.write(s)
		return
	}
	if wait := statusEvery - time.Since(w.last); wait > 0 {
		w.pending = &s
		if w.timer == nil {
			w.timer = time.AfterFunc(wait, w.flush)
		}
		return
	}
	w.pending = nil
	w.write(s)
}

// flush writes the pending status, if any.
func (w *statusWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.timer = nil
	if w.pending != nil {
		s := *w.pending
		w.pending = nil
		w.write(s)
	}
}

// close writes the pending status and stops the timer; statuses put after
// it are written at once.
func (w *statusWriter) close() {
	w.mu.Lock()
	w.closed = true
	if w.timer != nil {
		w.timer.Stop()
	}
	w.mu.Unlock()
	w.flush()
}

// write writes s. Hold w.mu.
func (w *statusWriter) write(s Status) {
	if w.skip() {
		return // a wiped box leaves nothing of itself
	}
	w.last = time.Now()
	// Not synced: it is written anew at every start and after each
	// outage, which must cost neither an fsync each nor the flash's wear.
	b, err := json.MarshalIndent(s, "", "  ")
	if err == nil {
		err = atomicfile.WriteUnsynced(w.path, append(b, '\n'))
	}
	if err != nil {
		w.warn(err)
	}
}
