package events

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/console/store/storetest"
	"github.com/edgebox/edgebox/errdefs"
)

func waitTopics(t *testing.T, s *Sub, want ...Topic) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	var got []Topic
	for {
		select {
		case <-s.C:
			got = append(got, s.Take()...)
			if len(got) >= len(want) {
				slices.Sort(got)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Fatalf("topics %v, want %v", got, want)
				}
				return
			}
		case <-deadline:
			t.Fatalf("topics %v, want %v", got, want)
		}
	}
}

func TestHubTellsEachTenantItsOwnTopics(t *testing.T) {
	t.Parallel()
	st := storetest.Bolt(t)
	boxes := map[string]string{"bx-1": "bank1", "bx-2": "bank2"}
	lookup := func(_ context.Context, id string) (fleet.Box, error) {
		if tn, ok := boxes[id]; ok {
			return fleet.Box{ID: id, TenantID: tn}, nil
		}
		return fleet.Box{}, errdefs.NotFound("no box %s", id)
	}
	h := NewHub(st, lookup, 2, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())

	// Both subscribe before the hub runs: a subscriber that comes once
	// the watch runs is told of changes from then on, not All.
	one, stop1, err := h.Subscribe("bank1", "alice")
	if err != nil {
		t.Fatal(err)
	}
	defer stop1()
	two, stop2, _ := h.Subscribe("bank2", "bob")
	defer stop2()
	if _, _, err := h.Subscribe("bank3", "carol"); !errors.Is(err, ErrFull) {
		t.Fatalf("a third subscriber of two: %v", err)
	}
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitTopics(t, one, All) // the watch began
	waitTopics(t, two, All)

	put := func(key, value string) {
		if _, err := store.Put(ctx, st, key, []byte(value)); err != nil {
			t.Fatal(err)
		}
	}
	put("apps/bank1/robot", "{}")
	put("status/bx-1/obj/Workload/robot", "x")
	waitTopics(t, one, Apps, State)
	put("fleet/boxes/bx-9", `{"id":"bx-9","tenant_id":"bank2"}`) // learned from the record
	put("audit/bank2/1", "{}")
	waitTopics(t, two, Boxes, Audit)
	h.BoxChanged("bx-9")
	waitTopics(t, two, Boxes)
	put("auth/users/alice", "{}")
	waitTopics(t, one, User)
	select {
	case <-one.C:
		t.Fatalf("bank1 heard of bank2's changes: %v", one.Take())
	default:
	}
}
