package desired

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/edgebox/edgebox/console/store/storetest"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

func newState(t *testing.T) *State { return New(storetest.Bolt(t)) }

func workload(name, release string) *edgeboxv1.DesiredObject {
	return &edgeboxv1.DesiredObject{Name: name, Spec: &edgeboxv1.DesiredObject_Workload{
		Workload: &edgeboxv1.Workload{App: name, Release: release, Runtime: "containerd"}}}
}

var ctx = context.Background()

func TestOfflineBoxGetsOnlyTheLatestOfEachObject(t *testing.T) {
	t.Parallel()
	st := newState(t)
	// The box stored revision 0; then 1,000 changes to 50 objects.
	for i := range 1000 {
		if _, err := st.Put(ctx, "bx-1", workload(fmt.Sprintf("w%02d", i%50), fmt.Sprintf("1.%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	objs, cur, err := st.Since(ctx, "bx-1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if cur != 1000 || len(objs) != 50 {
		t.Fatalf("revision %d and %d objects, want 1000 and exactly 50", cur, len(objs))
	}
	for _, o := range objs {
		var n int
		fmt.Sscanf(o.Name, "w%d", &n)
		if want := fmt.Sprintf("1.%d", 950+n); o.GetWorkload().Release != want || o.Revision != uint64(951+n) {
			t.Fatalf("%s: release %s at revision %d, want the latest %s at %d", o.Name, o.GetWorkload().Release, o.Revision, want, 951+n)
		}
	}
	// A box that stored 990 gets only what changed after.
	objs, _, _ = st.Since(ctx, "bx-1", 990)
	if len(objs) != 10 {
		t.Fatalf("since 990: %d objects, want 10", len(objs))
	}
}

func TestDeletesAreTombstonesUntilAcked(t *testing.T) {
	t.Parallel()
	st := newState(t)
	st.Put(ctx, "bx-1", workload("a", "1"))
	st.Put(ctx, "bx-1", workload("b", "1"))
	rev, err := st.Delete(ctx, "bx-1", edgeboxv1.KindWorkload, "a")
	if err != nil || rev != 3 {
		t.Fatalf("delete: rev %d, %v", rev, err)
	}
	if again, _ := st.Delete(ctx, "bx-1", edgeboxv1.KindWorkload, "a"); again != 3 {
		t.Fatalf("deleting a tombstone moved the revision to %d", again)
	}
	if none, _ := st.Delete(ctx, "bx-1", edgeboxv1.KindWorkload, "never"); none != 3 {
		t.Fatalf("deleting a missing object moved the revision to %d", none)
	}
	objs, _, _ := st.Since(ctx, "bx-1", 2)
	if len(objs) != 1 || !objs[0].Deleted || objs[0].Kind != edgeboxv1.KindWorkload || objs[0].Name != "a" {
		t.Fatalf("since 2: %v", objs)
	}
	// Not acked yet: purging keeps it.
	if n, _ := st.PurgeTombstones(ctx, "bx-1"); n != 0 {
		t.Fatalf("purged %d unacked tombstones", n)
	}
	if err := st.Ack(ctx, "bx-1", 3); err != nil {
		t.Fatal(err)
	}
	if n, _ := st.PurgeTombstones(ctx, "bx-1"); n != 1 {
		t.Fatalf("purged %d acked tombstones, want 1", n)
	}
	objs, _, _ = st.Since(ctx, "bx-1", 0)
	if len(objs) != 1 || objs[0].Name != "b" {
		t.Fatalf("after purge: %v", objs)
	}
}

func TestAcksNeverGoBack(t *testing.T) {
	t.Parallel()
	st := newState(t)
	for range 5 {
		st.Put(ctx, "bx-1", workload("a", "1"))
	}
	st.Ack(ctx, "bx-1", 4)
	st.Ack(ctx, "bx-1", 2)
	if a, _ := st.Acked(ctx, "bx-1"); a != 4 {
		t.Fatalf("acked %d after acks 4 then 2, want 4", a)
	}
	if err := st.Ack(ctx, "bx-1", 6); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("ack past the current revision: %v", err)
	}
}

func TestConcurrentWritersGetDenseRevisions(t *testing.T) {
	t.Parallel()
	st := newState(t)
	const writers, each = 8, 20
	revs := make(chan uint64, writers*each)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				r, err := st.Put(ctx, "bx-1", workload(fmt.Sprintf("w%d-%d", w, i), "1"))
				if err != nil {
					t.Error(err)
					return
				}
				revs <- r
			}
		}()
	}
	wg.Wait()
	close(revs)
	seen := map[uint64]bool{}
	for r := range revs {
		if seen[r] {
			t.Fatalf("revision %d given twice", r)
		}
		seen[r] = true
	}
	for r := uint64(1); r <= writers*each; r++ {
		if !seen[r] {
			t.Fatalf("revision %d skipped", r)
		}
	}
}

func TestBoxesAreSeparate(t *testing.T) {
	t.Parallel()
	st := newState(t)
	st.Put(ctx, "bx-1", workload("a", "1"))
	st.Put(ctx, "bx-10", workload("b", "1"))
	objs, cur, _ := st.Since(ctx, "bx-1", 0)
	if len(objs) != 1 || objs[0].Name != "a" || cur != 1 {
		t.Fatalf("bx-1 sees %v at %d", objs, cur)
	}
}

func TestBadObjectsRefused(t *testing.T) {
	t.Parallel()
	st := newState(t)
	if _, err := st.Put(ctx, "bx-1", &edgeboxv1.DesiredObject{Name: "a"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("no spec: %v", err)
	}
	if _, err := st.Put(ctx, "bx-1", workload("Bad Name", "1")); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("bad name: %v", err)
	}
}
