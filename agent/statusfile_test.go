package agent

import (
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestStatusWritesAreSpaced: statuses put in a burst are written once at
// first and once more, the newest, within statusEvery; one pending when
// the writer closes is written then.
func TestStatusWritesAreSpaced(t *testing.T) {
	dir := t.TempDir()
	var writes atomic.Int32
	w := &statusWriter{path: filepath.Join(dir, statusFile), skip: func() bool { writes.Add(1); return false }, warn: func(err error) { t.Error(err) }}
	for i := range 50 {
		w.put(Status{Name: "box", PID: i}, uint64(i))
	}
	if writes.Load() != 1 {
		t.Fatalf("50 statuses in a burst were written %d times at once", writes.Load())
	}
	deadline := time.Now().Add(statusEvery + 2*time.Second)
	for {
		s, err := ReadStatus(dir)
		if err == nil && s.PID == 49 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the newest status not written %v after it was put: %+v, %v", statusEvery+2*time.Second, s, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := writes.Load(); n != 2 {
		t.Fatalf("the burst was written %d times, want 2", n)
	}

	w.put(Status{Name: "box", PID: 100}, 100)
	w.put(Status{Name: "box", PID: 99}, 99) // older: dropped
	w.close()
	if s, err := ReadStatus(dir); err != nil || s.PID != 100 {
		t.Fatalf("after close: %+v, %v", s, err)
	}
	w.put(Status{Name: "box", PID: 101}, 101) // after close: at once
	if s, err := ReadStatus(dir); err != nil || s.PID != 101 {
		t.Fatalf("a status put after close: %+v, %v", s, err)
	}
}
