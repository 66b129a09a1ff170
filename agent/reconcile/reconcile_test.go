package reconcile

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/fake"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// source is a desired state held in memory.
type source struct {
	mu   sync.Mutex
	objs map[string]*edgeboxv1.DesiredObject
	rev  uint64
}

func (s *source) put(name, rt, release string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rev++
	s.objs[name] = &edgeboxv1.DesiredObject{Kind: edgeboxv1.KindWorkload, Name: name, Revision: s.rev,
		Spec: &edgeboxv1.DesiredObject_Workload{Workload: &edgeboxv1.Workload{App: name, Release: release, Runtime: rt}}}
}

func (s *source) del(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.objs, name)
}

func (s *source) Objects(kind string) ([]*edgeboxv1.DesiredObject, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*edgeboxv1.DesiredObject
	for _, o := range s.objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// book records reports.
type book struct {
	status map[string]*edgeboxv1.ObjectStatus
	events []*edgeboxv1.Event
}

func (b *book) Report(s *edgeboxv1.ObjectStatus) {
	if s.Phase == "Removed" {
		delete(b.status, s.Name)
		return
	}
	b.status[s.Name] = s
}
func (b *book) Event(e *edgeboxv1.Event) { b.events = append(b.events, e) }

func (b *book) reasons() map[string]int {
	m := map[string]int{}
	for _, e := range b.events {
		m[e.Reason]++
	}
	return m
}

func setup(t *testing.T) (*Reconciler, *source, *fake.Driver, *book) {
	t.Helper()
	src := &source{objs: map[string]*edgeboxv1.DesiredObject{}}
	d := fake.New("containerd")
	b := &book{status: map[string]*edgeboxv1.ObjectStatus{}}
	r, err := New(Config{Source: src, Drivers: []runtime.Driver{d}, Reporter: b, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return r, src, d, b
}

func pass(t *testing.T, r *Reconciler) {
	t.Helper()
	if err := r.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestConvergesAndIsIdempotent(t *testing.T) {
	t.Parallel()
	r, src, d, b := setup(t)
	src.put("a", "containerd", "1")
	src.put("b", "containerd", "1")
	pass(t, r)
	if got := d.Running(); len(got) != 2 {
		t.Fatalf("running %v, want a and b", got)
	}
	if b.status["a"].GetPhase() != "Running" || b.status["a"].GetObservedRevision() != 1 {
		t.Fatalf("status of a: %v", b.status["a"])
	}
	calls := d.Calls("create") + d.Calls("start") + d.Calls("stop") + d.Calls("remove")
	pass(t, r)
	pass(t, r)
	if again := d.Calls("create") + d.Calls("start") + d.Calls("stop") + d.Calls("remove"); again != calls {
		t.Fatalf("passes over a converged box changed something: %d driver calls, then %d", calls, again)
	}
}

func TestReplacesRestartsAndRemoves(t *testing.T) {
	t.Parallel()
	r, src, d, b := setup(t)
	src.put("a", "containerd", "1")
	src.put("b", "containerd", "1")
	pass(t, r)

	src.put("a", "containerd", "2") // a new release replaces the instance
	d.Crash("b", 137)               // b died
	pass(t, r)
	if n := d.Creates("a", runtime.NewSpec("a", src.objs["a"].GetWorkload()).Hash); n != 1 {
		t.Fatalf("release 2 of a created %d times", n)
	}
	if got := d.Running(); len(got) != 2 {
		t.Fatalf("running %v after a replace and a restart", got)
	}
	if rs := b.reasons(); rs["Replacing"] != 1 || rs["Restarted"] != 1 {
		t.Fatalf("events %v: want one Replacing and one Restarted", rs)
	}
	if b.status["a"].GetObservedRevision() != 3 {
		t.Fatalf("a observed revision %d, want 3", b.status["a"].GetObservedRevision())
	}

	src.del("b")
	pass(t, r)
	if got := d.Running(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("running %v after b left the desired state", got)
	}
	if _, ok := b.status["b"]; ok {
		t.Fatal("b's status stayed after it was removed")
	}
}

func TestFailuresStayWithTheirWorkload(t *testing.T) {
	t.Parallel()
	r, src, d, b := setup(t)
	src.put("good", "containerd", "1")
	src.put("bad", "containerd", "1")
	src.put("vm", "qemu", "1")
	d.FailOn("start", "bad", errors.New("image is corrupt"))
	pass(t, r)
	if got := d.Running(); len(got) != 1 || got[0] != "good" {
		t.Fatalf("running %v, want only good", got)
	}
	if s := b.status["bad"]; s.GetPhase() != "Failed" || s.GetMessage() != "image is corrupt" {
		t.Fatalf("status of bad: %v", s)
	}
	if s := b.status["vm"]; s.GetPhase() != "Failed" || s.GetMessage() == "" {
		t.Fatalf("a workload of a runtime the box lacks: %v", s)
	}
	d.FailOn("start", "bad", nil)
	pass(t, r)
	if s := b.status["bad"]; s.GetPhase() != "Running" {
		t.Fatalf("after the fault cleared, bad is %v", s)
	}
}

func TestListFailureRemovesNothing(t *testing.T) {
	t.Parallel()
	r, src, d, b := setup(t)
	src.put("a", "containerd", "1")
	pass(t, r)
	d.FailOn("list", "*", errors.New("containerd is restarting"))
	src.put("b", "containerd", "1")
	if err := r.Once(context.Background()); err == nil {
		t.Fatal("a pass whose driver cannot list reported no error")
	}
	if d.Calls("remove") != 0 || d.Calls("create") != 1 {
		t.Fatalf("with the runtime unreadable the reconciler acted: %s", d)
	}
	if b.status["b"].GetPhase() != "Failed" {
		t.Fatalf("b: %v", b.status["b"])
	}
}

func TestTwoDriversForOneRuntimeAreRefused(t *testing.T) {
	t.Parallel()
	_, err := New(Config{Source: &source{}, Reporter: &book{}, Log: slog.Default(),
		Drivers: []runtime.Driver{fake.New("qemu"), fake.New("qemu")}})
	if err == nil {
		t.Fatal("two qemu drivers were accepted")
	}
}

func TestRestartPoliciesAndBackOff(t *testing.T) {
	t.Parallel()
	src := &source{objs: map[string]*edgeboxv1.DesiredObject{}}
	d := fake.New("containerd")
	b := &book{status: map[string]*edgeboxv1.ObjectStatus{}}
	now := time.Unix(1_000_000, 0)
	r, err := New(Config{Source: src, Drivers: []runtime.Driver{d}, Reporter: b, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	put := func(name, policy string) {
		src.put(name, "containerd", "1")
		src.objs[name].GetWorkload().Restart = policy
	}
	put("always", "")
	put("once", "never")
	put("job", "on-failure")
	pass(t, r)
	running := func(name string) bool {
		for _, n := range d.Running() {
			if n == name {
				return true
			}
		}
		return false
	}

	d.Crash("once", 1)
	d.Crash("job", 0)
	d.Crash("always", 1)
	pass(t, r)
	if running("once") || b.status["once"].GetPhase() != "Stopped" {
		t.Fatalf("never: running %v, status %v", running("once"), b.status["once"])
	}
	if running("job") || b.status["job"].GetPhase() != "Stopped" {
		t.Fatalf("on-failure after exit 0: running %v, status %v", running("job"), b.status["job"])
	}
	if !running("always") {
		t.Fatal("the first crash was not restarted at once")
	}

	// It dies again: 10 s, then 20 s, before the next restarts.
	for _, wait := range []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second} {
		d.Crash("always", 1)
		pass(t, r)
		if running("always") || b.status["always"].GetPhase() != "Pending" {
			t.Fatalf("restarted without waiting %v: status %v", wait, b.status["always"])
		}
		now = now.Add(wait - time.Second)
		pass(t, r)
		if running("always") {
			t.Fatalf("restarted before %v", wait)
		}
		now = now.Add(time.Second)
		pass(t, r)
		if !running("always") {
			t.Fatalf("not restarted after %v", wait)
		}
	}
	if b.reasons()["BackOff"] != 3 {
		t.Fatalf("events %v", b.reasons())
	}
	if n := b.status["always"].GetRestarts(); n != 4 {
		t.Fatalf("restarts reported %d, want 4", n)
	}
	// After running for a while, a crash restarts at once again.
	pass(t, r)
	now = now.Add(stableAfter + time.Second)
	pass(t, r)
	d.Crash("always", 1)
	pass(t, r)
	if !running("always") {
		t.Fatal("a workload that ran stably was not forgiven its old crashes")
	}
	d.Crash("job", 3)
	pass(t, r)
	if !running("job") {
		t.Fatal("on-failure did not restart after a failure")
	}
}
