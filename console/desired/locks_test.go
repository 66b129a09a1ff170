package desired

import (
	"testing"
	"time"
)

func TestBoxLocksHoldOneBoxNotOthers(t *testing.T) {
	var l boxLocks
	release := l.lock("a")

	other := make(chan struct{})
	go func() { l.lock("b")(); close(other) }()
	select {
	case <-other:
	case <-time.After(5 * time.Second):
		t.Fatal("a writer of box b waited for box a's")
	}

	same := make(chan struct{})
	go func() { l.lock("a")(); close(same) }()
	select {
	case <-same:
		t.Fatal("two writers of box a held its lock at once")
	case <-time.After(50 * time.Millisecond):
	}
	release()
	select {
	case <-same:
	case <-time.After(5 * time.Second):
		t.Fatal("box a's second writer never got the lock")
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.held) != 0 {
		t.Fatalf("%d locks kept with no writer", len(l.held))
	}
}
