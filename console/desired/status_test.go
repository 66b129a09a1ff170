package desired

import (
	"strings"
	"testing"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

func st(name, phase string) *edgeboxv1.ObjectStatus {
	return &edgeboxv1.ObjectStatus{Kind: edgeboxv1.KindWorkload, Name: name, Phase: phase, ObservedRevision: 1}
}

func names(t *testing.T, s *State, box string) string {
	t.Helper()
	sts, err := s.Statuses(ctx, box)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, x := range sts {
		out = append(out, x.Name+"="+x.Phase)
	}
	return strings.Join(out, ",")
}

func TestStatusReports(t *testing.T) {
	t.Parallel()
	s := newState(t)
	report := func(r *edgeboxv1.SyncStatus) {
		t.Helper()
		if err := s.ReportStatus(ctx, "b1", r); err != nil {
			t.Fatal(err)
		}
	}
	report(&edgeboxv1.SyncStatus{Full: true, Objects: []*edgeboxv1.ObjectStatus{st("a", edgeboxv1.PhaseRunning), st("b", edgeboxv1.PhaseFailed)}})
	report(&edgeboxv1.SyncStatus{Objects: []*edgeboxv1.ObjectStatus{st("c", edgeboxv1.PhasePending), st("a", edgeboxv1.PhaseRemoved)}})
	if got := names(t, s, "b1"); got != "b=Failed,c=Pending" {
		t.Fatalf("after a delta: %s", got)
	}
	report(&edgeboxv1.SyncStatus{Full: true, Objects: []*edgeboxv1.ObjectStatus{st("c", edgeboxv1.PhaseRunning)}})
	if got := names(t, s, "b1"); got != "c=Running" {
		t.Fatalf("a full report keeps only what it holds: %s", got)
	}
	if got := names(t, s, "b2"); got != "" {
		t.Fatalf("another box has statuses: %s", got)
	}
}

// A box's first report on each stream is full; back after a console
// restart, it repeats what is stored, and that costs no write.
func TestAFullReportWritesOnlyWhatChanged(t *testing.T) {
	t.Parallel()
	s := newState(t)
	rev := func() int64 {
		t.Helper()
		r, err := s.s.Revision(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	report := func(r *edgeboxv1.SyncStatus) {
		t.Helper()
		if err := s.ReportStatus(ctx, "b1", r); err != nil {
			t.Fatal(err)
		}
	}
	a, b := st("a", edgeboxv1.PhaseRunning), st("b", edgeboxv1.PhaseFailed)
	b.Ports = []string{"8080:80/tcp"}
	report(&edgeboxv1.SyncStatus{Full: true, Objects: []*edgeboxv1.ObjectStatus{a, b}})
	before := rev()
	report(&edgeboxv1.SyncStatus{Full: true, Objects: []*edgeboxv1.ObjectStatus{b, a}})
	if got := rev(); got != before {
		t.Fatalf("a full report of what is stored wrote: revision %d, was %d", got, before)
	}
	// What changed is written, what the report left out is dropped, in
	// one revision.
	c := st("c", edgeboxv1.PhasePending)
	report(&edgeboxv1.SyncStatus{Full: true, Objects: []*edgeboxv1.ObjectStatus{st("b", edgeboxv1.PhaseRunning), c}})
	if got := rev(); got != before+1 {
		t.Fatalf("a full report with changes: revision %d, want %d", got, before+1)
	}
	if got := names(t, s, "b1"); got != "b=Running,c=Pending" {
		t.Fatalf("after a full report with changes: %s", got)
	}
	report(&edgeboxv1.SyncStatus{Full: true, Objects: []*edgeboxv1.ObjectStatus{st("b", edgeboxv1.PhaseRemoved), c}})
	if got := names(t, s, "b1"); got != "c=Pending" {
		t.Fatalf("a full report's Removed was kept: %s", got)
	}
}

func TestStatusReportsAreBounded(t *testing.T) {
	t.Parallel()
	s := newState(t)
	bad := []*edgeboxv1.SyncStatus{
		{Objects: []*edgeboxv1.ObjectStatus{{Kind: "Workload", Name: "../x", Phase: edgeboxv1.PhaseRunning}}},
		{Objects: []*edgeboxv1.ObjectStatus{{Kind: "Work/load", Name: "x", Phase: edgeboxv1.PhaseRunning}}},
		{Objects: []*edgeboxv1.ObjectStatus{{Kind: "Workload", Name: "x", Phase: "Exploded"}}},
		{Objects: make([]*edgeboxv1.ObjectStatus, MaxStatusObjects+1)},
		{Events: make([]*edgeboxv1.Event, MaxStatusEvents+1)},
	}
	for i, r := range bad {
		if err := s.ReportStatus(ctx, "b1", r); err == nil {
			t.Errorf("bad report %d was accepted", i)
		}
	}
	long := strings.Repeat("é", 2000)
	if err := s.ReportStatus(ctx, "b1", &edgeboxv1.SyncStatus{Objects: []*edgeboxv1.ObjectStatus{
		{Kind: "Workload", Name: "x", Phase: edgeboxv1.PhaseFailed, Message: long}}}); err != nil {
		t.Fatal(err)
	}
	sts, _ := s.Statuses(ctx, "b1")
	if len(sts) != 1 || len(sts[0].Message) > maxMessage || !strings.HasPrefix(long, sts[0].Message) {
		t.Fatalf("a long message was not clipped to valid UTF-8: %d bytes", len(sts[0].Message))
	}
	// The event ring keeps the latest MaxEvents.
	for i := range 10 {
		evs := make([]*edgeboxv1.Event, MaxStatusEvents)
		for j := range evs {
			evs[j] = &edgeboxv1.Event{TimeUnixNano: int64(i*MaxStatusEvents + j), Reason: "Started"}
		}
		if err := s.ReportStatus(ctx, "b1", &edgeboxv1.SyncStatus{Events: evs}); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := s.Events(ctx, "b1")
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != MaxEvents || evs[len(evs)-1].TimeUnixNano != 10*MaxStatusEvents-1 {
		t.Fatalf("ring holds %d events, last %d", len(evs), evs[len(evs)-1].TimeUnixNano)
	}
}

func TestFromJSON(t *testing.T) {
	t.Parallel()
	o, err := FromJSON(edgeboxv1.KindWorkload, "robot", []byte(`{"app":"robot","release":"1.2.0","runtime":"qemu","cpu_millis":500}`))
	if err != nil || o.GetWorkload().GetCpuMillis() != 500 || edgeboxv1.KindOf(o) != edgeboxv1.KindWorkload {
		t.Fatalf("FromJSON: %v %v", o, err)
	}
	raw, err := SpecJSON(o)
	if err != nil || !strings.Contains(string(raw), `"cpu_millis":"500"`) {
		t.Fatalf("SpecJSON: %s %v", raw, err)
	}
	for _, c := range []struct{ kind, spec string }{
		{"Workload", `{"ap":"typo"}`},
		{"Workload", `not json`},
		{"Gadget", `{}`},
	} {
		if _, err := FromJSON(c.kind, "x", []byte(c.spec)); err == nil {
			t.Errorf("FromJSON(%s, %s) was accepted", c.kind, c.spec)
		}
	}
}

func TestRestartPolicyIsChecked(t *testing.T) {
	t.Parallel()
	s := newState(t)
	o, err := FromJSON(edgeboxv1.KindWorkload, "robot", []byte(`{"app":"robot","restart":"sometimes"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "b1", o); err == nil {
		t.Fatal("restart \"sometimes\" was accepted")
	}
	o.GetWorkload().Restart = "on-failure"
	if _, err := s.Put(ctx, "b1", o); err != nil {
		t.Fatal(err)
	}
}
