package desired

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/console/store/storetest"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

func TestBoxOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		key  string
		box  string
		want bool
	}{
		{"desired/b1/obj/Workload/w1", "b1", true},
		{"desired/b-2/obj/UsbAssignment/k", "b-2", true},
		{"desired/b1/rev", "", false},
		{"desired/b1/acked", "", false},
		{"desired/b1/cap", "", false},
		{"desired//obj/Workload/w1", "", false},
		{"desired/b1", "", false},
		{"status/b1/obj/Workload/w1", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			t.Parallel()
			box, ok := BoxOf(store.Event{Type: store.EventPut, KV: store.KV{Key: tt.key}})
			if box != tt.box || ok != tt.want {
				t.Errorf("BoxOf(%q) = %q, %v; want %q, %v", tt.key, box, ok, tt.box, tt.want)
			}
		})
	}
}

func TestRevisionOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		typ   store.EventType
		key   string
		value string
		box   string
		rev   uint64
		want  bool
	}{
		{store.EventPut, "desired/b1/rev", "7", "b1", 7, true},
		{store.EventPut, "desired/b-2/rev", "18446744073709551615", "b-2", 18446744073709551615, true},
		{store.EventDelete, "desired/b1/rev", "", "", 0, false},
		{store.EventPut, "desired/b1/rev", "seven", "", 0, false},
		{store.EventPut, "desired/b1/acked", "7", "", 0, false},
		{store.EventPut, "desired/b1/obj/Workload/rev", "7", "", 0, false},
		{store.EventPut, "desired//rev", "7", "", 0, false},
		{store.EventPut, "status/b1/rev", "7", "", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.key+"="+tt.value, func(t *testing.T) {
			t.Parallel()
			box, rev, ok := RevisionOf(store.Event{Type: tt.typ, KV: store.KV{Key: tt.key, Value: []byte(tt.value)}})
			if box != tt.box || rev != tt.rev || ok != tt.want {
				t.Errorf("RevisionOf(%s %q=%q) = %q, %d, %v; want %q, %d, %v", tt.typ, tt.key, tt.value, box, rev, ok, tt.box, tt.rev, tt.want)
			}
		})
	}
}

// TestWatchObjectsNamesTheBoxesThatChanged: every Put and Delete of an
// object shows in WatchObjects as a change of its box, with the box's new
// revision, and a box's acknowledgement does not.
func TestWatchObjectsNamesTheBoxesThatChanged(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := New(storetest.Bolt(t))
	w := st.WatchObjects(ctx)
	obj := &edgeboxv1.DesiredObject{Name: "w1", Spec: &edgeboxv1.DesiredObject_Workload{Workload: &edgeboxv1.Workload{App: "a"}}}
	if _, err := st.Put(ctx, "b1", obj); err != nil {
		t.Fatal(err)
	}
	if err := st.Ack(ctx, "b1", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Put(ctx, "b2", obj); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Delete(ctx, "b1", edgeboxv1.KindWorkload, "w1"); err != nil {
		t.Fatal(err)
	}
	want := []string{"b1", "b2", "b1"}
	wantRevs := []string{"b1@1", "b2@1", "b1@2"}
	var got, revs []string
	for len(got) < len(want) || len(revs) < len(wantRevs) {
		select {
		case r, ok := <-w:
			if !ok || r.Err != nil {
				t.Fatalf("watch ended: %v", r.Err)
			}
			for _, e := range r.Events {
				if box, ok := BoxOf(e); ok {
					got = append(got, box)
				}
				if box, rev, ok := RevisionOf(e); ok {
					revs = append(revs, fmt.Sprintf("%s@%d", box, rev))
				}
			}
		case <-ctx.Done():
			t.Fatalf("changed boxes so far %v, want %v", got, want)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("changed boxes %v, want %v", got, want)
	}
	if !slices.Equal(revs, wantRevs) {
		t.Fatalf("revisions %v, want %v", revs, wantRevs)
	}
}
