package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/testenv"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

func workload(name, release string) *edgeboxv1.DesiredObject {
	return &edgeboxv1.DesiredObject{Name: name, Spec: &edgeboxv1.DesiredObject_Workload{
		Workload: &edgeboxv1.Workload{App: name, Release: release, Runtime: "containerd"}}}
}

func TestOfflineBoxCatchesUpWithOnlyTheLatest(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "a"}), "syncer")
	if err != nil {
		t.Fatal(err)
	}
	st := h.Console().Desired()
	// The box is offline (its agent never ran) while 1,000 changes are
	// made to 50 objects.
	for i := range 1000 {
		if _, err := st.Put(ctx(t), box.ID(), workload(fmt.Sprintf("w%02d", i%50), fmt.Sprintf("1.%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	box.Start(t)
	a := testenv.AgentOf(box)
	testenv.WaitFor(t, 20*time.Second, "catch-up", func() bool { r, _ := a.SyncedRevision(); return r == 1000 })
	if n := a.ReceivedObjects(); n != 50 {
		t.Fatalf("the box received %d objects, want exactly the 50 latest", n)
	}
	objs, _ := a.DesiredObjects(edgeboxv1.KindWorkload)
	for _, o := range objs {
		var n int
		fmt.Sscanf(o.Name, "w%d", &n)
		if o.GetWorkload().Release != fmt.Sprintf("1.%d", 950+n) {
			t.Fatalf("%s has release %s, not the latest", o.Name, o.GetWorkload().Release)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "ack", func() bool { r, _ := st.Acked(ctx(t), box.ID()); return r == 1000 })

	// Live changes follow, deletes included.
	st.Put(ctx(t), box.ID(), workload("late", "2.0"))
	st.Delete(ctx(t), box.ID(), edgeboxv1.KindWorkload, "w07")
	testenv.WaitFor(t, 10*time.Second, "live changes", func() bool { r, _ := a.SyncedRevision(); return r == 1002 })
	objs, _ = a.DesiredObjects(edgeboxv1.KindWorkload)
	names := map[string]bool{}
	for _, o := range objs {
		names[o.Name] = true
	}
	if len(objs) != 50 || !names["late"] || names["w07"] {
		t.Fatalf("after a put and a delete the box holds %d objects (late: %v, w07: %v)", len(objs), names["late"], names["w07"])
	}
	testenv.WaitFor(t, 10*time.Second, "ack of the delete", func() bool { r, _ := st.Acked(ctx(t), box.ID()); return r == 1002 })
	// The console drops a tombstone once the box has acknowledged it.
	testenv.WaitFor(t, 10*time.Second, "tombstone purge", func() bool {
		all, _, err := st.Since(ctx(t), box.ID(), 0)
		for _, o := range all {
			if o.GetDeleted() {
				return false
			}
		}
		return err == nil && len(all) == 50
	})
}

func TestWipedBoxGetsEverythingAgain(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "a"}), "wiped")
	if err != nil {
		t.Fatal(err)
	}
	st := h.Console().Desired()
	for i := range 20 {
		st.Put(ctx(t), box.ID(), workload(fmt.Sprintf("w%02d", i), "1"))
	}
	box.Start(t)
	testenv.WaitFor(t, 20*time.Second, "first sync", func() bool { r, _ := testenv.AgentOf(box).SyncedRevision(); return r == 20 })
	box.Stop(t)
	if err := os.Remove(filepath.Join(box.DataDir(), "agent.db")); err != nil {
		t.Fatal(err)
	}
	box.Start(t)
	a := testenv.AgentOf(box)
	testenv.WaitFor(t, 20*time.Second, "resync from 0", func() bool { r, _ := a.SyncedRevision(); return r == 20 })
	if objs, _ := a.DesiredObjects(""); len(objs) != 20 {
		t.Fatalf("wiped box holds %d objects after resync, want 20", len(objs))
	}
}
