package reconcile

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/fake"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// lockedBook is a book safe for a running reconciler.
type lockedBook struct {
	mu sync.Mutex
	b  book
}

func (l *lockedBook) Report(s *edgeboxv1.ObjectStatus) { l.mu.Lock(); l.b.Report(s); l.mu.Unlock() }
func (l *lockedBook) Event(e *edgeboxv1.Event)         { l.mu.Lock(); l.b.Event(e); l.mu.Unlock() }
func (l *lockedBook) get(name string) (*edgeboxv1.ObjectStatus, map[string]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.status[name], l.b.reasons()
}

// TestUnhealthyWorkloadIsRestarted: an HTTP probe that starts failing
// makes the workload unhealthy after its threshold, and it is restarted;
// with restart "never" it stays up, reported unhealthy.
func TestUnhealthyWorkloadIsRestarted(t *testing.T) {
	t.Parallel()
	var ok atomic.Bool
	ok.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !ok.Load() {
			http.Error(w, "stuck", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	src := &source{objs: map[string]*edgeboxv1.DesiredObject{}}
	probe := &edgeboxv1.Probe{Http: srv.URL, PeriodSeconds: 1, FailureThreshold: 2}
	for _, name := range []string{"robot", "patient"} {
		restart := ""
		if name == "patient" {
			restart = "never"
		}
		src.rev++
		src.objs[name] = &edgeboxv1.DesiredObject{Kind: edgeboxv1.KindWorkload, Name: name, Revision: src.rev,
			Spec: &edgeboxv1.DesiredObject_Workload{Workload: &edgeboxv1.Workload{App: name, Runtime: "containerd",
				Restart: restart, Probes: []*edgeboxv1.Probe{probe}}}}
	}
	d := fake.New("containerd")
	b := &lockedBook{b: book{status: map[string]*edgeboxv1.ObjectStatus{}}}
	r, err := New(Config{Source: src, Drivers: []runtime.Driver{d}, Reporter: b, Interval: 100 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				st, ev := b.get("robot")
				t.Fatalf("timed out waiting for %s: %v %v", what, st, ev)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	wait("healthy", func() bool {
		st, _ := b.get("robot")
		return st.GetHealth() == "healthy" && st.GetPhase() == "Running"
	})
	starts := d.Calls("start")
	ok.Store(false)
	wait("restarted for being unhealthy", func() bool {
		_, ev := b.get("robot")
		return ev["Unhealthy"] > 0 && d.Calls("start") > starts
	})
	wait("patient reported unhealthy and left running", func() bool {
		st, _ := b.get("patient")
		return st.GetHealth() == "unhealthy" && st.GetPhase() == "Running"
	})
	ok.Store(true)
	wait("healthy again", func() bool {
		st, _ := b.get("robot")
		return st.GetHealth() == "healthy"
	})
}
