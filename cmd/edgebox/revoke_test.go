package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
)

// TestWipeSummary: 'boxes revoke --wipe' says what became of the wipe in
// words, whether the box confirmed it or not.
func TestWipeSummary(t *testing.T) {
	t.Parallel()
	asked := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	answered := asked.Add(1500 * time.Millisecond)
	cases := []struct {
		name    string
		wipe    *api.BoxWipe
		want    []string
		notWant []string
	}{
		{"confirmed", &api.BoxWipe{AskedAt: asked, AskedBy: "alice", Confirmed: true, Result: "wiped", AnsweredAt: &answered,
			WorkloadsRemoved: []string{"robot", "clock"}, KeysReleased: []string{"k-0a1b2c3d4e5f"}},
			[]string{"revoked", "wipe: confirmed by the box: 2 workloads removed (robot, clock), 1 key given back (k-0a1b2c3d4e5f)",
				"desired state and identity are erased", "enroll it with a new token", "asked by alice; took 1.5s"},
			[]string{"not confirmed"}},
		{"offline", &api.BoxWipe{AskedAt: asked, AskedBy: "alice", Result: "not confirmed: box offline", AnsweredAt: &answered},
			[]string{"revoked", "wipe: not confirmed: box offline", "may still run"}, []string{"confirmed by the box"}},
		{"unfinished", &api.BoxWipe{Result: "not confirmed: the box could not finish: removing workload robot: busy"},
			[]string{"wipe: not confirmed: the box could not finish: removing workload robot: busy"}, []string{"took"}},
		{"not recorded", nil, []string{"the console did not record it"}, []string{"confirmed by the box"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			wipeSummary(&out, api.Box{ID: "b-1", Name: "shop", State: "revoked", Wipe: tc.wipe})
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("missing %q in:\n%s", w, out.String())
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(out.String(), w) {
					t.Errorf("unexpected %q in:\n%s", w, out.String())
				}
			}
		})
	}
}
