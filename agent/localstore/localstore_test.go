package localstore

import (
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/edgebox/edgebox/internal/boltdb"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

func wl(name, release string, rev uint64) *edgeboxv1.DesiredObject {
	return &edgeboxv1.DesiredObject{Kind: "Workload", Name: name, Revision: rev,
		Spec: &edgeboxv1.DesiredObject_Workload{Workload: &edgeboxv1.Workload{App: name, Release: release}}}
}

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Check(); err != nil {
			t.Errorf("bbolt check: %v", err)
		}
		s.Close()
	})
	return s
}

func TestApplyIsAtomicAndIdempotent(t *testing.T) {
	t.Parallel()
	s := open(t, t.TempDir())
	if rev, _ := s.Revision(); rev != 0 {
		t.Fatalf("new store at revision %d", rev)
	}
	wrote, err := s.Apply([]*edgeboxv1.DesiredObject{wl("a", "1", 1), wl("b", "1", 2)}, 2)
	if err != nil || !wrote {
		t.Fatalf("apply: %v %v", wrote, err)
	}
	// The same batch again (ack lost in a crash): nothing happens.
	if wrote, _ := s.Apply([]*edgeboxv1.DesiredObject{wl("a", "1", 1), wl("b", "1", 2)}, 2); wrote {
		t.Fatal("a batch at the stored revision was applied again")
	}
	// A tombstone and an update.
	s.Apply([]*edgeboxv1.DesiredObject{{Kind: "Workload", Name: "a", Deleted: true, Revision: 3}, wl("b", "2", 4)}, 4)
	objs, _ := s.Objects("Workload")
	if len(objs) != 1 || objs[0].Name != "b" || objs[0].GetWorkload().Release != "2" {
		t.Fatalf("objects: %v", objs)
	}
	if rev, _ := s.Revision(); rev != 4 {
		t.Fatalf("revision %d, want 4", rev)
	}
	// A bad batch writes nothing, not even its revision.
	if _, err := s.Apply([]*edgeboxv1.DesiredObject{wl("c", "1", 5), {Name: "nokind"}}, 5); err == nil {
		t.Fatal("object without a kind accepted")
	}
	if rev, _ := s.Revision(); rev != 4 {
		t.Fatalf("a failed batch moved the revision to %d", rev)
	}
	if objs, _ := s.Objects(""); len(objs) != 1 {
		t.Fatalf("a failed batch wrote: %v", objs)
	}
}

func TestSurvivesReopenAndRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	s.Apply([]*edgeboxv1.DesiredObject{wl("a", "1", 7)}, 7)
	s.Close()
	s = open(t, dir)
	if rev, _ := s.Revision(); rev != 7 {
		t.Fatalf("revision after reopen %d", rev)
	}
	boltdb.SetSchema(s.db, 9)
	s.Close()
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "newer than this agent") {
		t.Fatalf("newer schema: %v", err)
	}
	// Reopen for the cleanup's check.
	s.db, _ = bolt.Open(dir+"/agent.db", 0o600, nil)
}
