package httpapi

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// TestWipeResult: what a box answers to a wipe, or why it does not, becomes
// the box's record; the answer is checked and bounded, since it comes from
// the network.
func TestWipeResult(t *testing.T) {
	t.Parallel()
	many := make([]string, 100)
	for i := range many {
		many[i] = fmt.Sprintf("problem %d", i)
	}
	cases := []struct {
		name       string
		resp       *edgeboxv1.WipeResponse
		err        error
		confirmed  bool
		result     string // prefix
		workloads  []string
		keys       []string
		nProblems  int
		maxProblem int
	}{
		{name: "wiped", resp: &edgeboxv1.WipeResponse{Wiped: true, WorkloadsRemoved: []string{"robot"}, KeysReleased: []string{"k-0a1b2c3d4e5f"}},
			confirmed: true, result: "wiped", workloads: []string{"robot"}, keys: []string{"k-0a1b2c3d4e5f"}},
		{name: "offline", err: errdefs.Unavailable("box offline"), result: "not confirmed: box offline"},
		{name: "timed out", err: fmt.Errorf("%w: still wiping", context.DeadlineExceeded), result: "not confirmed: timed out after 30s"},
		{name: "old agent", err: errdefs.Unavailable("the box's agent is too old to wipe itself"), result: "not confirmed: the box's agent is too old"},
		{name: "unfinished", resp: &edgeboxv1.WipeResponse{WorkloadsRemoved: []string{"a"}, Problems: []string{"removing workload b: busy"}},
			result: "not confirmed: the box could not finish: removing workload b: busy", workloads: []string{"a"}, nProblems: 1},
		{name: "wiped, yet problems", resp: &edgeboxv1.WipeResponse{Wiped: true, Problems: []string{"x"}},
			result: "not confirmed: the box could not finish: x", nProblems: 1},
		{name: "says nothing", resp: &edgeboxv1.WipeResponse{}, result: "not confirmed: the box answered without saying it is wiped"},
		{name: "bad names and keys are dropped", resp: &edgeboxv1.WipeResponse{Wiped: true,
			WorkloadsRemoved: []string{"robot", "../etc", strings.Repeat("a", 300), "Bad Name"},
			KeysReleased:     []string{"k-0a1b2c3d4e5f", "k-../x", "robot", "k-" + strings.Repeat("0", 200)}},
			confirmed: true, result: "wiped", workloads: []string{"robot"}, keys: []string{"k-0a1b2c3d4e5f"}},
		{name: "problems bounded", resp: &edgeboxv1.WipeResponse{Problems: append([]string{strings.Repeat("x", 5000) + "\x1b[31m"}, many...)},
			result: "not confirmed: the box could not finish: ", nProblems: maxWipeProblems, maxProblem: maxWipeText + 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := wipeResult(tc.resp, tc.err, 30*time.Second)
			if w.Confirmed != tc.confirmed || !strings.HasPrefix(w.Result, tc.result) {
				t.Errorf("confirmed %v, result %q; want %v, %q…", w.Confirmed, w.Result, tc.confirmed, tc.result)
			}
			if !slices.Equal(w.WorkloadsRemoved, tc.workloads) || !slices.Equal(w.KeysReleased, tc.keys) {
				t.Errorf("workloads %q keys %q; want %q %q", w.WorkloadsRemoved, w.KeysReleased, tc.workloads, tc.keys)
			}
			if len(w.Problems) != tc.nProblems {
				t.Errorf("%d problems, want %d", len(w.Problems), tc.nProblems)
			}
			for _, p := range append(w.Problems, w.Result) {
				if tc.maxProblem > 0 && len(p) > tc.maxProblem+len("not confirmed: the box could not finish: ") {
					t.Errorf("a text of %d bytes was kept", len(p))
				}
				if strings.ContainsAny(p, "\x1b\n\r") {
					t.Errorf("control characters kept: %q", p)
				}
			}
		})
	}
}

func TestWipeTimeout(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 30 * time.Second, true},
		{"1s", time.Second, true},
		{"10m", 10 * time.Minute, true},
		{"500ms", 0, false},
		{"11m", 0, false},
		{"-5s", 0, false},
		{"30", 0, false},
	}
	for _, tc := range cases {
		got, err := wipeTimeout(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("wipeTimeout(%q) = %v, %v", tc.in, got, err)
		}
	}
}
