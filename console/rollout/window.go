// Package rollout holds what a staged rollout is made of: the waves a
// region's boxes go through (Plan), the maintenance windows that hold a
// box back (Policy), and the Machine that decides, tick by tick, which
// boxes move to the new release, which wait and why, which failed and go
// back, and when a region is through. The controller that stores
// rollouts and applies the Machine's steps as pins builds on it.
package rollout

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgebox/edgebox/errdefs"
)

// Days names the days a window applies on.
type Days string

// The days a window can name.
const (
	EveryDay Days = "every-day"
	// Workdays are Monday to Friday, less the calendar's holidays, plus
	// its extra workdays (a Saturday worked in place of a holiday).
	Workdays Days = "workdays"
	// Holidays are the other days.
	Holidays Days = "holidays"
)

// Window is a daily span of time, in its own time zone, on some days.
// A window whose To is before its From runs past midnight.
type Window struct {
	Days Days   `json:"days"`
	From string `json:"from"` // "15:00"
	To   string `json:"to"`   // "17:30"
}

// Policy says when a box may be updated: never inside a Deny window, and,
// when Allow windows are given, only inside one of them. Times are in
// Zone (an IANA name such as "Asia/Shanghai").
type Policy struct {
	Zone     string   `json:"zone"`
	Allow    []Window `json:"allow,omitempty"`
	Deny     []Window `json:"deny,omitempty"`
	Calendar Calendar `json:"calendar,omitzero"`
}

// Calendar is a tenant's working days: the weekdays it does not work and
// the weekend days it does, as dates ("2026-10-01").
type Calendar struct {
	Holidays      []string `json:"holidays,omitempty"`
	ExtraWorkdays []string `json:"extra_workdays,omitempty"`
}

// Limits on what a policy may hold.
const (
	maxWindows = 32
	maxDates   = 1000
	// horizon is how far ahead a policy must open at least once.
	horizon = 14 * 24 * time.Hour
)

func clock(s string) (int, error) {
	h, m, ok := strings.Cut(s, ":")
	if strings.Trim(h+m, "0123456789") != "" {
		ok = false // digits only: Atoi would take a sign
	}
	hh, err1 := strconv.Atoi(h)
	mm, err2 := strconv.Atoi(m)
	if !ok || err1 != nil || err2 != nil || hh < 0 || hh > 24 || mm < 0 || mm > 59 || (hh == 24 && mm != 0) || len(h) > 2 || len(m) != 2 {
		return 0, fmt.Errorf("time %q: use HH:MM, 00:00 to 24:00", trunc(s))
	}
	return hh*60 + mm, nil
}

// trunc clips a name quoted in an error.
func trunc(s string) string { return clip(s, 40) }

// clip cuts s to n bytes, on a character's boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// Validate says what is wrong with p: a bad zone, time or date, too much
// of anything, or a policy that never lets a box update within 14 days.
func (p Policy) Validate() error {
	loc, err := time.LoadLocation(p.Zone)
	if err != nil || p.Zone == "" {
		return errdefs.Invalid("maintenance policy: zone %q: use an IANA time zone such as Asia/Shanghai", trunc(p.Zone))
	}
	if len(p.Allow)+len(p.Deny) > maxWindows || len(p.Calendar.Holidays)+len(p.Calendar.ExtraWorkdays) > maxDates {
		return errdefs.Invalid("maintenance policy: at most %d windows and %d calendar dates", maxWindows, maxDates)
	}
	for _, w := range append(slices.Clone(p.Allow), p.Deny...) {
		if w.Days != EveryDay && w.Days != Workdays && w.Days != Holidays {
			return errdefs.Invalid("maintenance window days %q: use every-day, workdays or holidays", trunc(string(w.Days)))
		}
		from, err := clock(w.From)
		if err != nil {
			return errdefs.Invalid("maintenance window from: %v", err)
		}
		to, err := clock(w.To)
		if err != nil {
			return errdefs.Invalid("maintenance window to: %v", err)
		}
		if from == to {
			return errdefs.Invalid("maintenance window %s–%s is empty", w.From, w.To)
		}
	}
	for _, d := range append(slices.Clone(p.Calendar.Holidays), p.Calendar.ExtraWorkdays...) {
		if _, err := time.ParseInLocation(time.DateOnly, d, loc); err != nil {
			return errdefs.Invalid("calendar date %q: use YYYY-MM-DD", trunc(d))
		}
	}
	// A policy that never opens would hold its boxes for ever: refuse it
	// now rather than have a rollout wait without end.
	if _, ok := p.NextOpen(time.Now(), horizon); !ok {
		return errdefs.Invalid("maintenance policy never lets a box update within the next 14 days")
	}
	return nil
}

// compiled is a policy ready to answer many times: its zone loaded, its
// windows in minutes, its calendar as sets.
type compiled struct {
	p                 Policy
	loc               *time.Location
	holidays, workday map[string]bool
}

func (p Policy) compile() (compiled, error) {
	loc, err := time.LoadLocation(p.Zone)
	if err != nil || p.Zone == "" {
		return compiled{}, fmt.Errorf("zone %q is unknown", trunc(p.Zone))
	}
	c := compiled{p: p, loc: loc, holidays: map[string]bool{}, workday: map[string]bool{}}
	for _, d := range p.Calendar.Holidays {
		c.holidays[d] = true
	}
	for _, d := range p.Calendar.ExtraWorkdays {
		c.workday[d] = true
	}
	return c, nil
}

// isWorkday reports whether the date of t (in the policy's zone) is a
// working day by the calendar.
func (c compiled) isWorkday(t time.Time) bool {
	d := t.Format(time.DateOnly)
	if c.workday[d] {
		return true
	}
	if c.holidays[d] {
		return false
	}
	wd := t.Weekday()
	return wd != time.Saturday && wd != time.Sunday
}

// in reports whether t (in the policy's zone) falls in w.
func (c compiled) in(w Window, t time.Time) bool {
	from, _ := clock(w.From)
	to, _ := clock(w.To)
	m := t.Hour()*60 + t.Minute()
	day := t
	inside := false
	switch {
	case from < to:
		inside = m >= from && m < to
	case m >= from: // past midnight: tonight's part
		inside = true
	case m < to: // past midnight: this morning's part, of yesterday's window
		inside = true
		day = t.AddDate(0, 0, -1)
	}
	if !inside {
		return false
	}
	switch w.Days {
	case Workdays:
		return c.isWorkday(day)
	case Holidays:
		return !c.isWorkday(day)
	}
	return true
}

func (c compiled) open(t time.Time) (bool, string) {
	lt := t.In(c.loc)
	for _, w := range c.p.Deny {
		if c.in(w, lt) {
			return false, fmt.Sprintf("inside a no-update window (%s %s–%s, %s)", w.Days, w.From, w.To, c.p.Zone)
		}
	}
	if len(c.p.Allow) == 0 {
		return true, ""
	}
	for _, w := range c.p.Allow {
		if c.in(w, lt) {
			return true, ""
		}
	}
	return false, fmt.Sprintf("outside its maintenance windows (%s)", c.p.Zone)
}

// Open reports whether a box may be updated at t, and if not, why.
func (p Policy) Open(t time.Time) (bool, string) {
	c, err := p.compile()
	if err != nil {
		return false, "its maintenance policy's " + err.Error()
	}
	return c.open(t)
}

// NextOpen returns the first minute from t on, within within, when a box
// may be updated; ok is false when there is none.
func (p Policy) NextOpen(t time.Time, within time.Duration) (time.Time, bool) {
	c, err := p.compile()
	if err != nil {
		return time.Time{}, false
	}
	if r := t.Truncate(time.Minute); r.Before(t) {
		t = r.Add(time.Minute) // the first whole minute not before t
	}
	for end := t.Add(within); !t.After(end); t = t.Add(time.Minute) {
		if ok, _ := c.open(t); ok {
			return t, true
		}
	}
	return time.Time{}, false
}
