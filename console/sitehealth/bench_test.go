package sitehealth

import (
	"context"
	"crypto/x509"
	"fmt"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/fleet"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/sitevote"
)

// BenchmarkVotes is the console's cost of taking the votes of 10,000
// boxes in sites of 5, as Service.Vote takes them from the boxes' tunnels:
// each opened, its signature checked against the voter's key, its
// counter and site checked, and tallied. At the default period of 10 s,
// 10,000 boxes send 1,000 votes a second; the benchmark reports the
// share of one core that takes (core_share_10k).
func BenchmarkVotes(b *testing.B) {
	const boxes, perSite = 10_000, 5
	var fl indexedBoxes
	for i := range boxes {
		fl = append(fl, fleet.Box{ID: fmt.Sprintf("bx-%05d", i), TenantID: "t", Region: "r", Site: fmt.Sprintf("s%d", i/perSite),
			State: fleet.StateApproved, PeerAddrs: []string{fmt.Sprintf("10.%d.%d.%d:7946", i>>16, (i>>8)&255, i&255)}})
	}
	now := time.Now()
	s := NewService(ServiceConfig{Boxes: fl, Desired: &objects{m: map[string]*edgeboxv1.DesiredObject{}},
		Online: func(string) bool { return true }, Now: func() time.Time { return now }})
	// A vote of each box, signed by its key; a second round has the next
	// counters.
	rounds := 4
	votes := make([][]*edgeboxv1.SignedVote, rounds)
	for i, box := range fl {
		k := keyOf(b)
		s.Identified(box.ID, &x509.Certificate{PublicKey: &k.PublicKey})
		for r := range rounds {
			v := &edgeboxv1.SiteVote{Voter: box.ID, Counter: uint64(r + 1), UnixNano: now.UnixNano()}
			site := i / perSite * perSite
			for j := site; j < site+perSite; j++ {
				if j != i {
					v.Peers = append(v.Peers, &edgeboxv1.PeerSeen{BoxId: fl[j].ID, Alive: true, LastHeardUnixNano: now.UnixNano()})
				}
			}
			sv, err := sitevote.Sign(k, v)
			if err != nil {
				b.Fatal(err)
			}
			votes[r] = append(votes[r], sv)
		}
	}
	ctx := context.Background()
	b.ResetTimer()
	n := 0
	for i := 0; i < b.N; i++ {
		r, box := (i/boxes)%rounds, i%boxes
		if i > 0 && i%(boxes*rounds) == 0 {
			b.StopTimer() // counters used up: start the tally again
			s.tally = NewTally(s.cfg.Tally)
			b.StartTimer()
		}
		rec, err := s.Vote(ctx, fl[box].ID, &edgeboxv1.VoteReport{Votes: []*edgeboxv1.SignedVote{votes[r][box]}})
		if err != nil || rec.GetAccepted() != 1 {
			b.Fatalf("vote %d of %s: %v %v", r, fl[box].ID, rec, err)
		}
		n++
	}
	perVote := b.Elapsed() / time.Duration(n)
	b.ReportMetric(float64(perVote.Microseconds()), "µs/vote")
	b.ReportMetric(float64(perVote)*1000/float64(time.Second), "core_share_10k")
}

// indexedBoxes is a fleet in memory for the benchmark, found by ID at once.
type indexedBoxes []fleet.Box

func (bs indexedBoxes) Boxes(ctx context.Context, tenant string) ([]fleet.Box, error) {
	return boxes(bs).Boxes(ctx, tenant)
}

func (bs indexedBoxes) BoxByID(_ context.Context, id string) (fleet.Box, error) {
	var n int
	fmt.Sscanf(id, "bx-%05d", &n)
	if n < len(bs) && bs[n].ID == id {
		return bs[n], nil
	}
	return boxes(bs).BoxByID(context.Background(), id)
}
