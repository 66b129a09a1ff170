package replicas

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgebox/edgebox/internal/test/etcdtest"
)

// replica is one Set of a test, with the boxes it was told to drop.
type replica struct {
	*Set
	mu      sync.Mutex
	dropped []string
}

func (r *replica) drops() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.dropped)
}

func client(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func start(t *testing.T, endpoint, id string) *replica {
	t.Helper()
	r := &replica{}
	s, err := Start(context.Background(), Config{Client: client(t, endpoint), Prefix: "/edgebox/", TTL: 2 * time.Second,
		Self: Replica{ID: id, Name: "console " + id, URL: "https://" + id + ":8444"},
		Drop: func(box string) {
			r.mu.Lock()
			r.dropped = append(r.dropped, box)
			r.mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	r.Set = s
	t.Cleanup(func() { s.Close() })
	return r
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// holds reports whether, as r sees it, box is held by the replica id.
func holds(r *replica, box, id string) bool {
	h, ok := r.Holder(box)
	return ok && h.ID == id
}

func TestReplicasSeeEachOthersBoxes(t *testing.T) {
	ep := etcdtest.Start(t)
	a, b := start(t, ep, "a"), start(t, ep, "b")
	waitFor(t, "both replicas known to both", func() bool { return len(a.Replicas()) == 2 && len(b.Replicas()) == 2 })
	since := time.Now()
	for i := range 250 { // more than one transaction's worth
		a.Hold(fmt.Sprintf("bx-%03d", i), since)
	}
	waitFor(t, "b to see a hold every box", func() bool {
		for i := range 250 {
			if !holds(b, fmt.Sprintf("bx-%03d", i), "a") {
				return false
			}
		}
		return true
	})
	if h, ok := b.Holder("bx-000"); !ok || h.URL != "https://a:8444" {
		t.Fatalf("b says bx-000 is held by %+v (%v)", h, ok)
	}
	if _, ok := a.Holder("bx-000"); ok {
		t.Fatal("a says another replica holds its own box")
	}
	a.Release("bx-000", since.Add(-time.Second)) // not its session: nothing happens
	a.Release("bx-001", since)
	waitFor(t, "bx-001 to be held by nobody", func() bool { _, ok := b.Holder("bx-001"); return !ok })
	if !holds(b, "bx-000", "a") {
		t.Fatal("releasing an older session took the box's claim")
	}

	// A replica that stops takes its claims with it at once.
	a.Close()
	waitFor(t, "a's boxes and a to be gone", func() bool { _, ok := b.Holder("bx-002"); return !ok && len(b.Replicas()) == 1 })
}

// TestTheNewerSessionKeepsTheBox: whichever order the claims reach etcd
// in, the replica with the box's older session drops it and the other
// keeps it.
func TestTheNewerSessionKeepsTheBox(t *testing.T) {
	ep := etcdtest.Start(t)
	a, b := start(t, ep, "a"), start(t, ep, "b")
	waitFor(t, "both replicas known to both", func() bool { return len(a.Replicas()) == 2 && len(b.Replicas()) == 2 })
	older, newer := time.Now(), time.Now().Add(time.Millisecond)

	// In order: the box left a for b.
	a.Hold("bx-1", older)
	waitFor(t, "b to see a hold bx-1", func() bool { return holds(b, "bx-1", "a") })
	b.Hold("bx-1", newer)
	waitFor(t, "a to drop bx-1", func() bool { return slices.Contains(a.drops(), "bx-1") })
	waitFor(t, "a to see b hold bx-1", func() bool { return holds(a, "bx-1", "b") })

	// Out of order: a's claim for an older session comes last.
	b.Hold("bx-2", newer)
	waitFor(t, "a to see b hold bx-2", func() bool { return holds(a, "bx-2", "b") })
	a.Hold("bx-2", older)
	waitFor(t, "a to drop bx-2", func() bool { return slices.Contains(a.drops(), "bx-2") })
	waitFor(t, "b's claim to be back", func() bool { return holds(a, "bx-2", "b") })
	// The dropped session's end takes nothing back.
	a.Release("bx-2", older)
	time.Sleep(200 * time.Millisecond)
	if !holds(a, "bx-2", "b") || len(b.drops()) != 0 {
		t.Fatalf("after a's release: b holds bx-2 %v, b dropped %v", holds(a, "bx-2", "b"), b.drops())
	}
}

// TestAPausedReplicaComesBackToWhatItLost simulates a replica paused past
// its lease (its lease revoked under it): its claims go, and come back
// when it renews, unless the box has a newer session elsewhere meanwhile,
// which it then drops.
func TestAPausedReplicaComesBackToWhatItLost(t *testing.T) {
	ep := etcdtest.Start(t)
	a, b := start(t, ep, "a"), start(t, ep, "b")
	waitFor(t, "both replicas known to both", func() bool { return len(a.Replicas()) == 2 && len(b.Replicas()) == 2 })
	since := time.Now()
	a.Hold("bx-stays", since)
	a.Hold("bx-moves", since)
	waitFor(t, "b to see a hold both", func() bool { return holds(b, "bx-stays", "a") && holds(b, "bx-moves", "a") })

	a.mu.Lock()
	lease := a.lease
	a.mu.Unlock()
	if _, err := client(t, ep).Revoke(context.Background(), lease); err != nil {
		t.Fatal(err)
	}
	b.Hold("bx-moves", since.Add(time.Second)) // the box redialled and landed on b
	waitFor(t, "a to drop bx-moves", func() bool { return slices.Contains(a.drops(), "bx-moves") })
	waitFor(t, "a to claim bx-stays again", func() bool { return holds(b, "bx-stays", "a") && len(b.Replicas()) == 2 })
	waitFor(t, "b to keep bx-moves", func() bool { return holds(a, "bx-moves", "b") })
	if len(b.drops()) != 0 {
		t.Fatalf("b dropped %v", b.drops())
	}
}
