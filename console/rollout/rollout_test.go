package rollout

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/errdefs"
)

func boxes(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("bx-%03d", i)
	}
	return out
}

func TestPlanSplitsARegionIntoGrowingWaves(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n     int
		sizes []string
		want  []int // boxes per wave
	}{
		{200, nil, []int{1, 19, 80, 100}},
		{10, nil, []int{1, 4, 5}}, // 10 % of 10 is one box: that wave adds nothing
		{1, nil, []int{1}},
		{0, nil, nil},
		{7, []string{"2", "3", "100%"}, []int{2, 1, 4}},
		{100, []string{"33.3%", "100%"}, []int{34, 66}},
	} {
		sizes, err := ParseWaves(tc.sizes)
		if err != nil {
			t.Fatal(err)
		}
		var got []int
		seen := map[string]bool{}
		for _, w := range Plan(boxes(tc.n), sizes) {
			got = append(got, len(w))
			for _, b := range w {
				if seen[b] {
					t.Errorf("%d boxes, %v: %s in two waves", tc.n, tc.sizes, b)
				}
				seen[b] = true
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) || len(seen) != tc.n {
			t.Errorf("%d boxes, %v: waves %v (%d boxes), want %v", tc.n, tc.sizes, got, len(seen), tc.want)
		}
	}
}

func TestAbsurdWavesAreRefused(t *testing.T) {
	t.Parallel()
	for _, in := range [][]string{
		{"0", "100%"}, {"-1", "100%"}, {"150%"}, {"0%", "100%"}, {"NaN%", "100%"}, {"1", "50%"},
		{"50%", "10%", "100%"}, {"5", "2", "100%"}, {"ten", "100%"}, {strings.Repeat("1,", 30)},
		make([]string, 21),
	} {
		if len(in) == 1 && strings.Contains(in[0], ",") {
			in = strings.Split(strings.TrimSuffix(in[0], ","), ",")
		}
		if _, err := ParseWaves(in); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("waves %q: %v, want refused", in, err)
		}
	}
}

var bank = Policy{Zone: "Asia/Shanghai",
	Deny:     []Window{{Days: Workdays, From: "15:00", To: "17:30"}},
	Allow:    []Window{{Days: EveryDay, From: "22:00", To: "06:00"}, {Days: Holidays, From: "00:00", To: "24:00"}},
	Calendar: Calendar{Holidays: []string{"2026-10-01"}, ExtraWorkdays: []string{"2026-10-10"}}}

func TestMaintenanceWindowsInTheirOwnZone(t *testing.T) {
	t.Parallel()
	if err := bank.Validate(); err != nil {
		t.Fatal(err)
	}
	sh, _ := time.LoadLocation("Asia/Shanghai")
	at := func(s string) time.Time {
		tm, err := time.ParseInLocation("2006-01-02 15:04", s, sh)
		if err != nil {
			t.Fatal(err)
		}
		return tm.UTC() // the policy reads it in its own zone
	}
	for when, want := range map[string]bool{
		"2026-11-24 16:00": false, // a Tuesday afternoon: statements are fetched
		"2026-11-24 12:00": false, // a Tuesday noon: outside the night window
		"2026-11-24 23:30": true,  // the night window
		"2026-11-25 05:59": true,  // the night window, past midnight
		"2026-11-25 06:00": false,
		"2026-11-28 16:00": true,  // a Saturday: a holiday, open all day
		"2026-10-01 16:00": true,  // National Day, a Thursday, a holiday
		"2026-10-10 16:00": false, // a Saturday worked in its place
		"2026-10-10 12:00": false,
	} {
		ok, why := bank.Open(at(when))
		if ok != want {
			t.Errorf("%s: open %v (%s), want %v", when, ok, why, want)
		}
		if !ok && why == "" {
			t.Errorf("%s: closed without saying why", when)
		}
	}
	// A night window on working days runs past midnight from the working
	// day it starts on.
	nights := Policy{Zone: "Asia/Shanghai", Allow: []Window{{Days: Workdays, From: "22:00", To: "06:00"}}}
	for when, want := range map[string]bool{
		"2026-11-27 23:00": true,  // Friday night
		"2026-11-28 01:00": true,  // Saturday morning, Friday's window
		"2026-11-28 23:00": false, // Saturday night
		"2026-11-30 01:00": false, // Monday morning, Sunday's window
		"2026-11-30 23:00": true,  // Monday night
	} {
		if ok, _ := nights.Open(at(when)); ok != want {
			t.Errorf("workday nights, %s: open %v, want %v", when, ok, want)
		}
	}
	if _, err := clock("+7:00"); err == nil {
		t.Error("a signed hour was taken")
	}
	next, ok := bank.NextOpen(at("2026-11-24 16:00"), 24*time.Hour)
	if !ok || !next.Equal(at("2026-11-24 22:00")) {
		t.Errorf("next open after a Tuesday 16:00: %v %v, want 22:00 that day", next.In(sh), ok)
	}
}

func TestAPolicyThatNeverOpensIsRefused(t *testing.T) {
	t.Parallel()
	for name, p := range map[string]Policy{
		"never":        {Zone: "UTC", Deny: []Window{{Days: EveryDay, From: "00:00", To: "24:00"}}},
		"allow a deny": {Zone: "UTC", Allow: []Window{{Days: Workdays, From: "01:00", To: "02:00"}}, Deny: []Window{{Days: EveryDay, From: "00:00", To: "03:00"}}},
		"bad zone":     {Zone: "Mars/Olympus"},
		"no zone":      {},
		"bad time":     {Zone: "UTC", Deny: []Window{{Days: EveryDay, From: "25:00", To: "03:00"}}},
		"empty window": {Zone: "UTC", Deny: []Window{{Days: EveryDay, From: "03:00", To: "03:00"}}},
		"bad days":     {Zone: "UTC", Deny: []Window{{Days: "sundays", From: "01:00", To: "03:00"}}},
		"bad date":     {Zone: "UTC", Calendar: Calendar{Holidays: []string{"2026-13-01"}}},
	} {
		if err := p.Validate(); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v, want refused", name, err)
		}
	}
}
