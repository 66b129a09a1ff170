package rollout

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// scrape returns what reg serves, each series as name{label="value",...}.
func scrape(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			out[mf.GetName()+"{"+strings.Join(ls, ",")+"}"] = m.GetGauge().GetValue()
		}
	}
	return out
}

// wantProgress is what the metrics say of r as the store has it: its
// boxes by phase, 1 for its state, and the rollouts by state.
func wantProgress(r Rollout, active bool) map[string]float64 {
	want := map[string]float64{}
	for _, st := range states {
		want[fmt.Sprintf("edgebox_rollouts{state=%q}", st)] = 0
	}
	if !active {
		return want
	}
	want[fmt.Sprintf("edgebox_rollouts{state=%q}", r.State)] = 1
	series := func(name, label, value string) string {
		ls := map[string]string{"app": r.App, "rollout": r.ID, "tenant": r.TenantID, label: value}
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(ls)) {
			kv = append(kv, fmt.Sprintf("%s=%q", k, ls[k]))
		}
		return name + "{" + strings.Join(kv, ",") + "}"
	}
	for _, ph := range phases {
		want[series("edgebox_rollout_boxes", "phase", string(ph))] = 0
	}
	for _, g := range r.Machine.Regions {
		for _, b := range g.Boxes {
			want[series("edgebox_rollout_boxes", "phase", string(b.Phase))]++
		}
	}
	for _, st := range states {
		v := 0.0
		if st == r.State {
			v = 1
		}
		want[series("edgebox_rollout_state", "state", string(st))] = v
	}
	return want
}

// TestRolloutMetrics: a rollout's progress and state are served as the
// controller leaves them at each look, pause and end included, and the
// rollout leaves the metrics once it is over.
func TestRolloutMetrics(t *testing.T) {
	e := newEnv(t, map[string]int{"north": 4})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(e.svc.Collector())
	check := func(when string, r Rollout, active bool) {
		t.Helper()
		got, want := scrape(t, reg), wantProgress(r, active)
		if !maps.Equal(got, want) {
			for _, k := range slices.Sorted(maps.Keys(want)) {
				if got[k] != want[k] {
					t.Errorf("%s: %s = %g, want %g", when, k, got[k], want[k])
				}
			}
			for _, k := range slices.Sorted(maps.Keys(got)) {
				if _, ok := want[k]; !ok {
					t.Errorf("%s: %s = %g served, want none", when, k, got[k])
				}
			}
		}
	}
	check("before any rollout", Rollout{}, false)

	r, err := e.svc.Create(e.ctx, e.op, Request{App: "robot", From: "1", To: "2", Scope: Scope{Regions: []string{"north"}},
		Settings: Settings{Waves: []Size{{Boxes: 1}, {Percent: 100}}, MaxUnavailable: 4, Gate: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	e.step()
	r = e.get(r.ID)
	check("after the first look", r, true)
	if n := scrape(t, reg)[fmt.Sprintf("edgebox_rollout_boxes{app=\"robot\",phase=\"waiting\",rollout=%q,tenant=\"bank\"}", r.ID)]; n != 3 {
		t.Errorf("after the first look, %g boxes waiting, want the three of the second wave", n)
	}

	if _, err := e.svc.Pause(e.ctx, e.op, r.ID, "lunch"); err != nil {
		t.Fatal(err)
	}
	e.step()
	r = e.get(r.ID)
	if r.State != Paused {
		t.Fatalf("rollout %s, want paused", r.State)
	}
	check("paused", r, true)
	if _, err := e.svc.Resume(e.ctx, e.op, r.ID); err != nil {
		t.Fatal(err)
	}

	for i := 0; i < 20 && !r.State.over(); i++ {
		e.step()
		r = e.get(r.ID)
		check(fmt.Sprintf("look %d", i), r, true)
	}
	if r.State != Finished {
		t.Fatalf("rollout %s: %s", r.State, r.Reason)
	}
	e.step()
	check("the look after the end", r, false)
}
