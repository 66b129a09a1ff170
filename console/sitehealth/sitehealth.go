// Package sitehealth tells a box whose line is down from a dead one
// (ADR 0019). The boxes of a site probe each other over DTLS on their LAN
// and vote, each vote signed by its voter (package sitevote); a Tally
// takes the votes a console receives and decides, for a box without a
// tunnel, what a strict majority of its site says of it. Fewer than that
// is "unknown", never a guess.
package sitehealth

import (
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// State is what the console makes of a box.
type State string

const (
	// Online: the box's tunnel is up.
	Online State = "online"
	// DisconnectedRunning: no tunnel, but a strict majority of its site
	// hears it: the line is down, and nothing is moved away from it.
	DisconnectedRunning State = "disconnected-running"
	// Down: no tunnel, and a strict majority of its site does not hear
	// it.
	Down State = "down"
	// Unknown: no tunnel, and too few of its site voted either way.
	Unknown State = "unknown"
)

// Config says how old a vote may be and still count.
type Config struct {
	// Period is the boxes' probe period; 10 s when 0.
	Period time.Duration
	// MaxAge is the age past which a vote no longer counts for the
	// present (it still counts for history); three periods when 0.
	MaxAge time.Duration
	// MaxAhead is how far ahead of the console's clock a vote's time may
	// be; 30 s when 0.
	MaxAhead time.Duration
}

func (c Config) withDefaults() Config {
	if c.Period <= 0 {
		c.Period = 10 * time.Second
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 3 * c.Period
	}
	if c.MaxAhead <= 0 {
		c.MaxAhead = 30 * time.Second
	}
	return c
}

// Tally keeps the latest vote of each voter. It is safe for concurrent
// use.
type Tally struct {
	cfg Config
	mu  sync.Mutex
	// votes is the latest vote of each voter.
	votes map[string]ballot
	// counters is the highest counter taken from each voter, for every
	// vote, current or kept: a counter is taken once.
	counters map[string]uint64
	// ran is, for each box, the latest time a vote shows it running: its
	// own vote (a box that votes runs), or a peer's that heard it.
	ran map[string]time.Time
}

// ballot is one voter's latest vote: when it was made, and who it heard.
type ballot struct {
	at    time.Time
	alive map[string]bool
	// shared: taken from another console replica's tally (Merge), not
	// from the voter's tunnel here.
	shared bool
}

// NewTally returns an empty tally.
func NewTally(cfg Config) *Tally {
	return &Tally{cfg: cfg.withDefaults(), votes: map[string]ballot{}, counters: map[string]uint64{}, ran: map[string]time.Time{}}
}

// Ballot is a voter's latest current vote as a tally holds it, for the
// tally of another console replica: a box votes up its own tunnel, to
// the replica that holds it, and the others judge its site from what
// they are given.
type Ballot struct {
	Voter string          `json:"voter"`
	At    time.Time       `json:"at"`
	Alive map[string]bool `json:"alive"` // each peer it names: heard or not
}

// Ballots returns the current votes of voters that this tally took from
// the voters' own tunnels, not those it was given by Merge.
func (t *Tally) Ballots(voters []string, now time.Time) []Ballot {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Ballot
	for _, v := range voters {
		if b, ok := t.votes[v]; ok && !b.shared && now.Sub(b.at) <= t.cfg.MaxAge {
			out = append(out, Ballot{Voter: v, At: b.at, Alive: b.alive})
		}
	}
	return out
}

// Merge takes ballots another replica's tally gave: each replaces the
// voter's vote here when it is newer, and is current, and names at most
// MaxSiteBoxes peers. It returns how many it took.
func (t *Tally) Merge(ballots []Ballot, now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	took := 0
	for _, nb := range ballots {
		if nb.Voter == "" || now.Sub(nb.At) > t.cfg.MaxAge || nb.At.After(now.Add(t.cfg.MaxAhead)) || len(nb.Alive) > MaxSiteBoxes {
			continue
		}
		if b, ok := t.votes[nb.Voter]; ok && !nb.At.After(b.at) {
			continue
		}
		t.votes[nb.Voter] = ballot{at: nb.At, alive: maps.Clone(nb.Alive), shared: true}
		t.noteRan(nb.Voter, nb.At)
		took++
	}
	return took
}

// Kept is a vote taken for history only: made longer ago than MaxAge (a
// vote the box kept while its line was down).
var Kept = errors.New("sitehealth: kept for history")

// Take takes v, a vote whose signature the caller checked, from voter,
// the box whose tunnel carried it; site is the voter's site, every box
// in it but the voter. It returns nil for a vote that counts now, Kept
// for one that is only history, and an error saying why for one refused:
// another box's vote, a counter taken before (a replay), a time too far
// ahead, a peer outside the voter's site.
func (t *Tally) Take(voter string, site []string, v *edgeboxv1.SiteVote, now time.Time) error {
	if v.GetVoter() != voter {
		return fmt.Errorf("a vote of box %s came from box %s", v.GetVoter(), voter)
	}
	at := time.Unix(0, v.GetUnixNano())
	if at.After(now.Add(t.cfg.MaxAhead)) {
		return fmt.Errorf("the vote is from %s, %s ahead of the console's clock", at.UTC().Format(time.RFC3339), at.Sub(now).Round(time.Second))
	}
	members := make(map[string]bool, len(site))
	for _, id := range site {
		members[id] = true
	}
	alive := make(map[string]bool, len(v.GetPeers()))
	for _, p := range v.GetPeers() {
		if !members[p.GetBoxId()] {
			return fmt.Errorf("the vote names box %s, which is not of box %s's site", p.GetBoxId(), voter)
		}
		alive[p.GetBoxId()] = p.GetAlive()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if last := t.counters[voter]; v.GetCounter() <= last {
		return fmt.Errorf("vote %d of box %s was taken already (the last was %d): a replay", v.GetCounter(), voter, last)
	}
	t.counters[voter] = v.GetCounter()
	t.noteRan(voter, at)
	for _, p := range v.GetPeers() {
		if heard := time.Unix(0, p.GetLastHeardUnixNano()); p.GetLastHeardUnixNano() > 0 && !heard.After(at) {
			t.noteRan(p.GetBoxId(), heard)
		}
	}
	if now.Sub(at) > t.cfg.MaxAge {
		return Kept
	}
	if b, ok := t.votes[voter]; ok && at.Before(b.at) {
		return Kept // a newer vote counts already
	}
	t.votes[voter] = ballot{at: at, alive: alive}
	return nil
}

// noteRan notes that box ran at at, if that is later than known.
func (t *Tally) noteRan(box string, at time.Time) {
	if at.After(t.ran[box]) {
		t.ran[box] = at
	}
}

// RanUntil is the latest time a vote, current or kept, shows box running:
// its own, or a peer's that heard it. After its site was out of sight,
// the votes kept meanwhile carry it past the outage's start.
func (t *Tally) RanUntil(box string) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ran[box]
}

// Forget drops what voter said: a box revoked or moved to another site.
func (t *Tally) Forget(voter string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.votes, voter)
	delete(t.ran, voter)
}

// Verdict is a decision with its grounds.
type Verdict struct {
	State State
	// Alive and Dead count the current votes that hear the box and that
	// do not; Need is a strict majority of its site.
	Alive, Dead, Need int
}

func (v Verdict) String() string {
	if v.State == Online {
		return string(v.State)
	}
	return fmt.Sprintf("%s (%d of the site hear it, %d do not, %d needed)", v.State, v.Alive, v.Dead, v.Need)
}

// Decide judges box, whose tunnel is up or not (online); site is every
// box of its site, box included. A strict majority is of the whole site,
// so a site of two can never decide on a box without its tunnel.
func (t *Tally) Decide(box string, online bool, site []string, now time.Time) Verdict {
	need := len(site)/2 + 1
	if online {
		return Verdict{State: Online, Need: need}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	v := Verdict{State: Unknown, Need: need}
	for _, voter := range site {
		if voter == box {
			continue
		}
		b, ok := t.votes[voter]
		if !ok || now.Sub(b.at) > t.cfg.MaxAge {
			continue
		}
		alive, heard := b.alive[box]
		switch {
		case !heard:
		case alive:
			v.Alive++
		default:
			v.Dead++
		}
	}
	switch {
	case v.Alive >= need:
		v.State = DisconnectedRunning
	case v.Dead >= need:
		v.State = Down
	}
	return v
}

// SiteUnreachable reports whether the console has nothing to go on for a
// site: none of its boxes has a tunnel, and none has voted within MaxAge.
// Its boxes are then "unknown", and the site "unreachable" (its line,
// most likely), never "down".
func (t *Tally) SiteUnreachable(site []string, online func(string) bool, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range site {
		if online(id) {
			return false
		}
		if b, ok := t.votes[id]; ok && now.Sub(b.at) <= t.cfg.MaxAge {
			return false
		}
	}
	return len(site) > 0
}
