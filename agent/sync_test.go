package agent

import (
	"io"
	"log/slog"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/edgebox/edgebox/agent/localstore"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// FuzzSyncDown feeds arbitrary console messages to the agent's handler:
// it must never panic, store only well-formed objects, and never move the
// stored revision back except on a reset.
func FuzzSyncDown(f *testing.F) {
	w := func(name string, rev uint64) *edgeboxv1.DesiredObject {
		return &edgeboxv1.DesiredObject{Kind: "Workload", Name: name, Revision: rev,
			Spec: &edgeboxv1.DesiredObject_Workload{Workload: &edgeboxv1.Workload{App: name}}}
	}
	seeds := []*edgeboxv1.SyncDown{
		{Objects: []*edgeboxv1.DesiredObject{w("a", 7), w("b", 8)}, Revision: 8},
		{Objects: []*edgeboxv1.DesiredObject{{Kind: "Workload", Name: "a", Deleted: true, Revision: 9}}, Revision: 9},
		{Objects: []*edgeboxv1.DesiredObject{w("c", 2)}, Revision: 2, Reset_: true},
		{Objects: []*edgeboxv1.DesiredObject{w("../x", 9)}, Revision: 9},
		{Revision: 3},
	}
	for _, s := range seeds {
		raw, _ := proto.Marshal(s)
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		down := &edgeboxv1.SyncDown{}
		if proto.Unmarshal(raw, down) != nil {
			return
		}
		ls, err := localstore.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		defer ls.Close()
		if _, err := ls.Apply([]*edgeboxv1.DesiredObject{w("a", 4), w("z", 5)}, 5); err != nil {
			t.Fatal(err)
		}
		a := &Agent{local: ls, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		_, err = a.storeDown(down)
		rev, _ := ls.Revision()
		switch {
		case err != nil && rev != 5:
			t.Fatalf("a refused message moved the revision to %d", rev)
		case err == nil && !down.GetReset_() && rev != max(5, down.GetRevision()):
			t.Fatalf("revision %d after storing revision %d over 5", rev, down.GetRevision())
		case err == nil && down.GetReset_() && rev != down.GetRevision():
			t.Fatalf("revision %d after a reset to %d", rev, down.GetRevision())
		}
		objs, err := ls.Objects("")
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if err := edgeboxv1.CheckKey(o.GetKind(), o.GetName()); err != nil || o.GetDeleted() {
				t.Fatalf("stored %s/%s (deleted %v): %v", o.GetKind(), o.GetName(), o.GetDeleted(), err)
			}
		}
		if err := ls.Check(); err != nil {
			t.Fatal(err)
		}
	})
}
