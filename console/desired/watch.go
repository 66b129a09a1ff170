package desired

import (
	"context"
	"strconv"
	"strings"

	"github.com/edgebox/edgebox/console/store"
)

// WatchObjects watches every box's desired state from now on, with one
// store watch: BoxOf names the box whose objects each event changed. The
// channel closes when ctx ends, or after a response with Err when the
// watch is lost (history compacted under a slow reader): the watcher then
// watches again and re-reads every box.
func (st *State) WatchObjects(ctx context.Context) <-chan store.WatchResponse {
	return st.s.Watch(ctx, "desired/", 0)
}

// BoxOf returns the box whose desired objects an event of WatchObjects
// changed, and false for the events of a box's bookkeeping (its revision,
// its acknowledgement, its capability), which change no object.
func BoxOf(e store.Event) (string, bool) {
	rest, ok := strings.CutPrefix(e.KV.Key, "desired/")
	if !ok {
		return "", false
	}
	box, tail, ok := strings.Cut(rest, "/")
	if !ok || box == "" || !strings.HasPrefix(tail, "obj/") {
		return "", false
	}
	return box, true
}

// RevisionOf returns the box whose revision an event of WatchObjects
// moved, and that revision: every change to a box's objects writes its
// revision in the same transaction. False for every other event.
func RevisionOf(e store.Event) (string, uint64, bool) {
	rest, ok := strings.CutPrefix(e.KV.Key, "desired/")
	if !ok || e.Type != store.EventPut {
		return "", 0, false
	}
	box, tail, ok := strings.Cut(rest, "/")
	if !ok || box == "" || tail != "rev" {
		return "", 0, false
	}
	rev, err := strconv.ParseUint(string(e.KV.Value), 10, 64)
	if err != nil {
		return "", 0, false
	}
	return box, rev, true
}
