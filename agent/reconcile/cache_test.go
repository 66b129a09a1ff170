package reconcile

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/fake"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// TestImageCacheKeepsCurrentAndPrevious: across releases 1, 2, 3 of a
// workload the cache keeps the images of the running and the previous
// release; an image the agent did not pull is never removed; a workload
// that goes takes its images with it. The record survives a restart.
func TestImageCacheKeepsCurrentAndPrevious(t *testing.T) {
	t.Parallel()
	src := &source{objs: map[string]*edgeboxv1.DesiredObject{}}
	d := fake.New("containerd")
	d.TrackImages()
	ctx := context.Background()
	d.Pull(ctx, "imported", nil, nil) // from a USB stick, not by the agent
	record := filepath.Join(t.TempDir(), "images.json")
	newRec := func() *Reconciler {
		r, err := New(Config{Source: src, Drivers: []runtime.Driver{d}, Reporter: &lockedBook{b: book{status: map[string]*edgeboxv1.ObjectStatus{}}},
			Log: slog.New(slog.NewTextHandler(io.Discard, nil)), ImageRecord: record})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := newRec()
	put := func(name, image string) {
		src.rev++
		src.objs[name] = &edgeboxv1.DesiredObject{Kind: edgeboxv1.KindWorkload, Name: name, Revision: src.rev,
			Spec: &edgeboxv1.DesiredObject_Workload{Workload: &edgeboxv1.Workload{App: name, Runtime: "containerd", Image: image}}}
	}
	// converge passes until the workloads run their images.
	converge := func() {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			pass(t, r)
			if len(d.Running()) == len(src.objs) {
				done := true
				for name, o := range src.objs {
					if ok, _ := d.HasImage(ctx, o.GetWorkload().GetImage()); !ok || r.images.current(name) != o.GetWorkload().GetImage() {
						done = false
					}
				}
				if done {
					pass(t, r)
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("did not converge: %v", d)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	images := func() []string { l, _ := d.Images(ctx); return l }

	put("robot", "img-1")
	put("other", "img-x")
	converge()
	put("robot", "img-2")
	converge()
	if got, want := images(), []string{"img-1", "img-2", "img-x", "imported"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after release 2: %v, want %v", got, want)
	}
	r = newRec() // the record is on disk
	put("robot", "img-3")
	converge()
	if got, want := images(), []string{"img-2", "img-3", "img-x", "imported"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after release 3: %v, want %v", got, want)
	}
	src.del("other")
	pass(t, r)
	if got, want := images(), []string{"img-2", "img-3", "imported"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after removing other: %v, want %v", got, want)
	}
}

// TestPrefetchKeepsItsImage: an ImagePrefetch object brings its image to
// disk while the workload runs its own, reports it, and keeps it from the
// cache's clean-up until the object goes.
func TestPrefetchKeepsItsImage(t *testing.T) {
	t.Parallel()
	src := &source{objs: map[string]*edgeboxv1.DesiredObject{}}
	d := fake.New("containerd")
	d.TrackImages()
	ctx := context.Background()
	rep := &lockedBook{b: book{status: map[string]*edgeboxv1.ObjectStatus{}}}
	r, err := New(Config{Source: src, Drivers: []runtime.Driver{d}, Reporter: rep,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), ImageRecord: filepath.Join(t.TempDir(), "images.json")})
	if err != nil {
		t.Fatal(err)
	}
	put := func(name string, o *edgeboxv1.DesiredObject) {
		src.mu.Lock()
		src.rev++
		o.Name, o.Revision = name, src.rev
		src.objs[name] = o
		src.mu.Unlock()
	}
	workload := func(image string) *edgeboxv1.DesiredObject {
		return &edgeboxv1.DesiredObject{Kind: edgeboxv1.KindWorkload,
			Spec: &edgeboxv1.DesiredObject_Workload{Workload: &edgeboxv1.Workload{App: "robot", Runtime: "containerd", Image: image}}}
	}
	until := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for pass(t, r); !ok(); pass(t, r) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 5 s; images %v", what, func() []string { l, _ := d.Images(ctx); return l }())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	has := func(img string) bool { ok, _ := d.HasImage(ctx, img); return ok }
	put("robot", workload("img-1"))
	until("robot on img-1", func() bool { return len(d.Running()) == 1 && r.images.current("robot") == "img-1" })
	put("rollout-1", &edgeboxv1.DesiredObject{Kind: edgeboxv1.KindImagePrefetch,
		Spec: &edgeboxv1.DesiredObject_ImagePrefetch{ImagePrefetch: &edgeboxv1.ImagePrefetch{Runtime: "containerd", Image: "img-9"}}})
	until("img-9 fetched", func() bool {
		s, _ := rep.get("rollout-1")
		return has("img-9") && s != nil && s.GetPhase() == edgeboxv1.PhaseRunning
	})
	if r.images.current("robot") != "img-1" {
		t.Fatalf("the prefetch changed what robot runs: %s", r.images.current("robot"))
	}
	put("robot", workload("img-2"))
	until("robot on img-2", func() bool { return r.images.current("robot") == "img-2" })
	put("robot", workload("img-3"))
	until("robot on img-3, img-1 gone", func() bool { return r.images.current("robot") == "img-3" && !has("img-1") })
	if !has("img-9") {
		t.Fatal("the cache removed the prefetched image")
	}
	src.del("rollout-1")
	until("img-9 gone with its prefetch", func() bool { s, _ := rep.get("rollout-1"); return !has("img-9") && s == nil })
}
