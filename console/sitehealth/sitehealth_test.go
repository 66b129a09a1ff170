package sitehealth

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

var t0 = time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)

// voteOf is voter's vote number n at at, hearing the peers in alive and
// not those in dead.
func voteOf(voter string, n uint64, at time.Time, alive []string, dead ...string) *edgeboxv1.SiteVote {
	v := &edgeboxv1.SiteVote{Voter: voter, Counter: n, UnixNano: at.UnixNano()}
	for _, p := range alive {
		v.Peers = append(v.Peers, &edgeboxv1.PeerSeen{BoxId: p, Alive: true, LastHeardUnixNano: at.Add(-time.Second).UnixNano()})
	}
	for _, p := range dead {
		v.Peers = append(v.Peers, &edgeboxv1.PeerSeen{BoxId: p, LastHeardUnixNano: at.Add(-time.Minute).UnixNano()})
	}
	return v
}

func others(site []string, box string) []string {
	var out []string
	for _, id := range site {
		if id != box {
			out = append(out, id)
		}
	}
	return out
}

func TestAMajorityDecides(t *testing.T) {
	site := []string{"a", "b", "c", "d", "e"}
	cases := []struct {
		name   string
		alive  []string // voters that hear a
		dead   []string // voters that do not
		online bool
		want   State
	}{
		{"its tunnel is up", nil, nil, true, Online},
		{"three of five hear it", []string{"b", "c", "d"}, []string{"e"}, false, DisconnectedRunning},
		{"two of five hear it, two do not", []string{"b", "c"}, []string{"d", "e"}, false, Unknown},
		{"three of five do not", []string{"b"}, []string{"c", "d", "e"}, false, Down},
		{"nobody voted", nil, nil, false, Unknown},
	}
	for _, c := range cases {
		tl := NewTally(Config{})
		n := uint64(1)
		for _, v := range c.alive {
			if err := tl.Take(v, others(site, v), voteOf(v, n, t0, []string{"a"}), t0); err != nil {
				t.Fatal(err)
			}
		}
		for _, v := range c.dead {
			if err := tl.Take(v, others(site, v), voteOf(v, n, t0, nil, "a"), t0); err != nil {
				t.Fatal(err)
			}
		}
		if got := tl.Decide("a", c.online, site, t0.Add(5*time.Second)); got.State != c.want {
			t.Errorf("%s: %v, want %s", c.name, got, c.want)
		}
	}
}

// TestASiteOfTwoNeverDecides: the one peer of a box cannot be a strict
// majority of a site of two, whatever it says.
func TestASiteOfTwoNeverDecides(t *testing.T) {
	tl := NewTally(Config{})
	site := []string{"a", "b"}
	if err := tl.Take("b", []string{"a"}, voteOf("b", 1, t0, []string{"a"}), t0); err != nil {
		t.Fatal(err)
	}
	if got := tl.Decide("a", false, site, t0); got.State != Unknown || got.Need != 2 {
		t.Fatalf("a site of two, its other box hearing it: %v", got)
	}
	if err := tl.Take("b", []string{"a"}, voteOf("b", 2, t0, nil, "a"), t0); err != nil {
		t.Fatal(err)
	}
	if got := tl.Decide("a", false, site, t0); got.State != Unknown {
		t.Fatalf("a site of two, its other box not hearing it: %v", got)
	}
}

func TestOldVotesStopCounting(t *testing.T) {
	tl := NewTally(Config{Period: 10 * time.Second})
	site := []string{"a", "b", "c"}
	for i, v := range []string{"b", "c"} {
		if err := tl.Take(v, others(site, v), voteOf(v, uint64(i+1), t0, []string{"a"}), t0); err != nil {
			t.Fatal(err)
		}
	}
	if got := tl.Decide("a", false, site, t0.Add(29*time.Second)); got.State != DisconnectedRunning {
		t.Fatalf("votes 29 s old: %v", got)
	}
	if got := tl.Decide("a", false, site, t0.Add(31*time.Second)); got.State != Unknown {
		t.Fatalf("votes 31 s old, past three periods: %v", got)
	}
	online := func(string) bool { return false }
	if tl.SiteUnreachable(site, online, t0.Add(5*time.Second)) {
		t.Fatal("a site whose boxes voted 5 s ago called unreachable")
	}
	if !tl.SiteUnreachable(site, online, t0.Add(time.Minute)) {
		t.Fatal("a site with no tunnel and no vote for a minute not called unreachable")
	}
}

// TestRefusedVotes: a replayed vote, one carried by another box, one from
// the future, one naming a box of another site. None of them changes a
// verdict.
func TestRefusedVotes(t *testing.T) {
	tl := NewTally(Config{})
	site := []string{"a", "b", "c"}
	if err := tl.Take("b", []string{"a", "c"}, voteOf("b", 5, t0, nil, "a"), t0); err != nil {
		t.Fatal(err)
	}
	if err := tl.Take("c", []string{"a", "b"}, voteOf("c", 5, t0, nil, "a"), t0); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, from string
		v          *edgeboxv1.SiteVote
		want       string
	}{
		{"replayed", "b", voteOf("b", 5, t0.Add(time.Second), []string{"a"}), "a replay"},
		{"an older counter", "b", voteOf("b", 4, t0.Add(time.Second), []string{"a"}), "a replay"},
		{"carried by another box", "c", voteOf("b", 6, t0.Add(time.Second), []string{"a"}), "came from box c"},
		{"from the future", "b", voteOf("b", 6, t0.Add(time.Hour), []string{"a"}), "ahead of the console's clock"},
		{"naming another site's box", "b", voteOf("b", 7, t0.Add(time.Second), []string{"a", "x"}), "not of box b's site"},
	}
	for _, c := range cases {
		err := tl.Take(c.from, others(site, c.from), c.v, t0.Add(2*time.Second))
		if err == nil || errors.Is(err, Kept) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	if got := tl.Decide("a", false, site, t0.Add(3*time.Second)); got.State != Down || got.Dead != 2 {
		t.Fatalf("after the refused votes: %v, want down by the two taken", got)
	}
}

// TestKeptVotesAreHistory: votes a box kept while its line was down come
// in order once it is back; they are taken (their counters used up) but
// only the current one counts now.
func TestKeptVotesAreHistory(t *testing.T) {
	tl := NewTally(Config{})
	site := []string{"a", "b", "c"}
	now := t0.Add(10 * time.Minute)
	for i := range 5 {
		err := tl.Take("b", []string{"a", "c"}, voteOf("b", uint64(i+1), t0.Add(time.Duration(i)*time.Minute), []string{"a", "c"}), now)
		if !errors.Is(err, Kept) {
			t.Fatalf("a vote kept %d minutes: %v", 10-i, err)
		}
	}
	if got := tl.Decide("a", false, site, now); got.Alive != 0 {
		t.Fatalf("kept votes counted now: %v", got)
	}
	if err := tl.Take("b", []string{"a", "c"}, voteOf("b", 6, now, []string{"a", "c"}), now); err != nil {
		t.Fatal(err)
	}
	if err := tl.Take("b", []string{"a", "c"}, voteOf("b", 3, t0.Add(2*time.Minute), []string{"a"}), now); err == nil || errors.Is(err, Kept) {
		t.Fatalf("a kept vote replayed: %v", err)
	}
	if got := tl.Decide("a", false, site, now); got.Alive != 1 {
		t.Fatalf("the current vote: %v", got)
	}
}

// TestTalliesOfReplicasShareBallots: the votes of a site reach two
// replicas, one each. Neither alone has a majority; each, given the
// other's ballots, decides as one tally of all the votes would. What a
// tally was given it does not give on, and a given ballot that is stale,
// from the future, older than the one held or naming too many peers is
// not taken.
func TestTalliesOfReplicasShareBallots(t *testing.T) {
	site := []string{"a", "b", "c", "d", "e"}
	here, there := NewTally(Config{}), NewTally(Config{})
	for i, v := range []string{"b", "c"} {
		if err := here.Take(v, others(site, v), voteOf(v, uint64(i+1), t0, []string{"a"}), t0); err != nil {
			t.Fatal(err)
		}
	}
	if err := there.Take("d", others(site, "d"), voteOf("d", 1, t0, []string{"a"}), t0); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(time.Second)
	for name, tl := range map[string]*Tally{"here": here, "there": there} {
		if got := tl.Decide("a", false, site, now); got.State != Unknown {
			t.Fatalf("%s alone: %v, want unknown", name, got)
		}
	}
	fromHere, fromThere := here.Ballots(site, now), there.Ballots(site, now)
	if len(fromHere) != 2 || len(fromThere) != 1 {
		t.Fatalf("ballots: %d here, %d there; want 2 and 1", len(fromHere), len(fromThere))
	}
	if n := here.Merge(fromThere, now); n != 1 {
		t.Fatalf("here took %d of there's ballots, want 1", n)
	}
	if n := there.Merge(fromHere, now); n != 2 {
		t.Fatalf("there took %d of here's ballots, want 2", n)
	}
	for name, tl := range map[string]*Tally{"here": here, "there": there} {
		if got := tl.Decide("a", false, site, now); got.State != DisconnectedRunning || got.Alive != 3 {
			t.Fatalf("%s with the other's ballots: %v, want disconnected-running by 3", name, got)
		}
		if got := tl.RanUntil("d"); !got.Equal(t0) {
			t.Fatalf("%s: d ran until %v, want %v", name, got, t0)
		}
	}
	if got := there.Ballots(site, now); len(got) != 1 || got[0].Voter != "d" {
		t.Fatalf("there gives on what it was given: %+v", got)
	}

	// Not taken: stale, from the future, no newer than held, too many peers.
	many := map[string]bool{}
	for i := range MaxSiteBoxes + 1 {
		many[fmt.Sprint("p", i)] = true
	}
	bad := []Ballot{
		{Voter: "e", At: now.Add(-time.Minute), Alive: map[string]bool{"a": false}},
		{Voter: "e", At: now.Add(time.Hour), Alive: map[string]bool{"a": false}},
		{Voter: "b", At: t0, Alive: map[string]bool{"a": false}},
		{Voter: "e", At: now, Alive: many},
		{Voter: "", At: now, Alive: map[string]bool{"a": false}},
	}
	if n := there.Merge(bad, now); n != 0 {
		t.Fatalf("took %d bad ballots", n)
	}
	if got := there.Decide("a", false, site, now); got.Alive != 3 || got.Dead != 0 {
		t.Fatalf("after the bad ballots: %v", got)
	}
	// A newer ballot replaces the one held, and a vote of the box older
	// than it is history.
	if n := there.Merge([]Ballot{{Voter: "b", At: now, Alive: map[string]bool{"a": false}}}, now); n != 1 {
		t.Fatal("a newer ballot not taken")
	}
	if err := there.Take("b", others(site, "b"), voteOf("b", 9, t0.Add(500*time.Millisecond), []string{"a"}), now); !errors.Is(err, Kept) {
		t.Fatalf("a vote older than the ballot given: %v, want kept", err)
	}
	if got := there.Decide("a", false, site, now); got.Alive != 2 || got.Dead != 1 {
		t.Fatalf("after b's newer ballot: %v", got)
	}
}
