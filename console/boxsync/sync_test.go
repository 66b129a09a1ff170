package boxsync

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/console/store/storetest"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

func newSyncer(t testing.TB) (*Server, store.Store) {
	t.Helper()
	st := storetest.Bolt(t)
	approved := func(context.Context, string) (bool, error) { return true, nil }
	return New(Config{Desired: desired.New(st), Approved: approved, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}), st
}

func workloadObj(name string) *edgeboxv1.DesiredObject {
	return &edgeboxv1.DesiredObject{Name: name, Spec: &edgeboxv1.DesiredObject_Workload{Workload: &edgeboxv1.Workload{App: name}}}
}

// FuzzSyncUp feeds arbitrary messages to the console's handler of a box's
// Sync messages: it must never panic, and whatever the message says, only
// the box of the certificate ("b1") may change.
func FuzzSyncUp(f *testing.F) {
	seeds := []*edgeboxv1.SyncUp{
		{Msg: &edgeboxv1.SyncUp_Ack{Ack: &edgeboxv1.SyncAck{Revision: 3}}},
		{Msg: &edgeboxv1.SyncUp_Ack{Ack: &edgeboxv1.SyncAck{Revision: 1 << 62}}},
		{Msg: &edgeboxv1.SyncUp_Hello{Hello: &edgeboxv1.SyncHello{StoredRevision: 2}}},
		{Msg: &edgeboxv1.SyncUp_Status{Status: &edgeboxv1.SyncStatus{Full: true,
			Objects: []*edgeboxv1.ObjectStatus{{Kind: "Workload", Name: "w1", Phase: "Running", ObservedRevision: 2}},
			Events:  []*edgeboxv1.Event{{Kind: "Workload", Name: "w1", Reason: "Started"}}}}},
		{Msg: &edgeboxv1.SyncUp_Status{Status: &edgeboxv1.SyncStatus{
			Objects: []*edgeboxv1.ObjectStatus{{Kind: "Workload", Name: "../../b2/obj", Phase: "Removed"}}}}},
	}
	for _, s := range seeds {
		raw, _ := proto.Marshal(s)
		f.Add(raw)
	}
	f.Add([]byte{0x1a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, raw []byte) {
		m := &edgeboxv1.SyncUp{}
		if proto.Unmarshal(raw, m) != nil {
			return
		}
		s, st := newSyncer(t)
		ctx := context.Background()
		for _, box := range []string{"b1", "b2"} {
			for _, n := range []string{"w1", "w2", "w3"} {
				if _, err := s.desired.Put(ctx, box, workloadObj(n)); err != nil {
					t.Fatal(err)
				}
			}
		}
		s.desired.Delete(ctx, "b1", edgeboxv1.KindWorkload, "w3")
		before, _, _ := st.Range(ctx, "", 0)
		_ = s.handleUp(ctx, "b1", m)
		after, _, _ := st.Range(ctx, "", 0)
		was := map[string]int64{}
		for _, kv := range before {
			was[kv.Key] = kv.ModRevision
		}
		for _, kv := range after {
			mine := strings.HasPrefix(kv.Key, "desired/b1/") || strings.HasPrefix(kv.Key, "status/b1/")
			if !mine && was[kv.Key] != kv.ModRevision {
				t.Fatalf("a message of b1 changed %s", kv.Key)
			}
			delete(was, kv.Key)
		}
		for k := range was {
			if !strings.HasPrefix(k, "desired/b1/") {
				t.Fatalf("a message of b1 deleted %s", k)
			}
		}
		if acked, _ := s.desired.Acked(ctx, "b1"); acked > 4 {
			t.Fatalf("b1 acked %d, past its revision", acked)
		}
	})
}

func TestHubWatchesAgainAfterItsWatchFails(t *testing.T) {
	t.Parallel()
	s, _ := newSyncer(t)
	ctx, cancel := context.WithCancel(context.Background())
	failed := make(chan store.WatchResponse, 1)
	failed <- store.WatchResponse{Err: store.ErrCompacted}
	close(failed)
	woken := make(chan string, 4)
	h := newHub(s.desired, func(box string) { woken <- box }, func() { woken <- "*" }, func(string, uint64) {}, s.log)
	done := make(chan struct{})
	go func() { defer close(done); h.run(ctx, failed) }()
	if got := <-woken; got != "*" { // everyone re-reads after the watch failed
		t.Fatalf("after the watch failed, woke %q, want every box", got)
	}
	if _, err := s.desired.Put(ctx, "b1", workloadObj("w1")); err != nil {
		t.Fatal(err)
	}
	if got := <-woken; got != "b1" { // and the new watch follows changes
		t.Fatalf("after a change to b1, woke %q", got)
	}
	cancel()
	<-done
}
