package sitehealth

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/sitevote"
)

// boxes is a fleet in memory.
type boxes []fleet.Box

func (bs boxes) Boxes(_ context.Context, tenant string) ([]fleet.Box, error) {
	var out []fleet.Box
	for _, b := range bs {
		if b.TenantID == tenant {
			out = append(out, b)
		}
	}
	return out, nil
}

func (bs boxes) BoxByID(_ context.Context, id string) (fleet.Box, error) {
	for _, b := range bs {
		if b.ID == id {
			return b, nil
		}
	}
	return fleet.Box{}, errdefs.NotFound("no box %q", id)
}

// objects is desired state in memory, counting writes.
type objects struct {
	mu     sync.Mutex
	m      map[string]*edgeboxv1.DesiredObject
	writes int
}

func (o *objects) Live(_ context.Context, box string) ([]*edgeboxv1.DesiredObject, uint64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if x, ok := o.m[box]; ok {
		return []*edgeboxv1.DesiredObject{x}, 1, nil
	}
	return nil, 1, nil
}

func (o *objects) Put(_ context.Context, box string, x *edgeboxv1.DesiredObject) (uint64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.m[box] = x
	o.writes++
	return 1, nil
}

func (o *objects) Delete(_ context.Context, box, _, _ string) (uint64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.m, box)
	o.writes++
	return 1, nil
}

func shop() boxes {
	box := func(id, site string, state fleet.BoxState, addr string) fleet.Box {
		b := fleet.Box{ID: id, TenantID: "t", Region: "east", Site: site, State: state}
		if addr != "" {
			b.PeerAddrs = []string{addr}
		}
		return b
	}
	return boxes{
		box("a", "shop", fleet.StateApproved, "192.168.1.1:7946"),
		box("b", "shop", fleet.StateApproved, "192.168.1.2:7946"),
		box("c", "shop", fleet.StateApproved, "192.168.1.3:7946"),
		box("d", "shop", fleet.StatePending, "192.168.1.4:7946"),
		box("e", "mall", fleet.StateApproved, "10.0.0.5:7946"),
	}
}

func TestEachBoxIsToldItsSitePeers(t *testing.T) {
	fl := shop()
	obj := &objects{m: map[string]*edgeboxv1.DesiredObject{}}
	now := time.Now()
	clock := func() time.Time { return now }
	s := NewService(ServiceConfig{Boxes: fl, Desired: obj, Online: func(string) bool { return true }, Now: clock})
	if err := s.SyncSite(context.Background(), fl[0]); err != nil {
		t.Fatal(err)
	}
	got := obj.m["a"].GetSitePeers()
	if len(got.GetPeers()) != 2 || got.GetPeers()[0].GetBoxId() != "b" || got.GetPeers()[1].GetBoxId() != "c" ||
		got.GetPeers()[0].GetAddrs()[0] != "192.168.1.2:7946" || got.GetPeriodMillis() != 10000 {
		t.Fatalf("box a's peers: %v", got)
	}
	if obj.m["d"] != nil || obj.m["e"] != nil {
		t.Fatalf("a box not approved, or of another site, was told: %v %v", obj.m["d"], obj.m["e"])
	}
	if obj.writes != 3 {
		t.Fatalf("%d writes for a site of three", obj.writes)
	}
	if err := s.SyncSite(context.Background(), fl[1]); err != nil {
		t.Fatal(err)
	}
	if obj.writes != 3 {
		t.Fatalf("the same peers written again: %d writes", obj.writes)
	}
	// A console started afresh reads what the boxes have.
	s = NewService(ServiceConfig{Boxes: fl, Desired: obj, Online: func(string) bool { return true }, Now: clock})
	s.SyncSite(context.Background(), fl[2])
	if obj.writes != 3 {
		t.Fatalf("a new console wrote the same peers again: %d writes", obj.writes)
	}
	// Box c goes: once the console reads the fleet again, the others are
	// told.
	fl[2].State = fleet.StateRevoked
	now = now.Add(sitesFresh + time.Second)
	s.SyncSite(context.Background(), fl[0])
	if p := obj.m["a"].GetSitePeers().GetPeers(); len(p) != 1 || p[0].GetBoxId() != "b" {
		t.Fatalf("box a's peers after c was revoked: %v", p)
	}
}

func keyOf(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestVotesAreCheckedAgainstTheVotersKey(t *testing.T) {
	fl := shop()
	online := map[string]bool{"b": true, "c": true}
	now := time.Now()
	reg := prometheus.NewRegistry()
	s := NewService(ServiceConfig{Boxes: fl, Desired: &objects{m: map[string]*edgeboxv1.DesiredObject{}},
		Online: func(id string) bool { return online[id] }, Now: func() time.Time { return now }, Metrics: reg,
		Tenants: func(context.Context) ([]string, error) { return []string{"t"}, nil }})
	ctx := context.Background()
	kb, kc := keyOf(t), keyOf(t)
	sign := func(k *ecdsa.PrivateKey, v *edgeboxv1.SiteVote) *edgeboxv1.SignedVote {
		sv, err := sitevote.Sign(k, v)
		if err != nil {
			t.Fatal(err)
		}
		return sv
	}
	vb := voteOf("b", 1, now, []string{"a"})
	if _, err := s.Vote(ctx, "b", &edgeboxv1.VoteReport{Votes: []*edgeboxv1.SignedVote{sign(kb, vb)}}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a vote before the console knew the box's key: %v", err)
	}
	s.Identified("b", &x509.Certificate{PublicKey: &kb.PublicKey})
	s.Identified("c", &x509.Certificate{PublicKey: &kc.PublicKey})
	r, err := s.Vote(ctx, "b", &edgeboxv1.VoteReport{Votes: []*edgeboxv1.SignedVote{
		sign(kb, vb),
		sign(kc, voteOf("b", 2, now, []string{"a"})), // forged: c's key
		sign(kb, vb), // replayed
		sign(kb, voteOf("b", 3, now, []string{"a", "e"})), // e is of another site
		{Vote: []byte{0xff}, Signature: []byte{1}},        // not a vote
	}})
	if err != nil {
		t.Fatal(err)
	}
	if r.GetAccepted() != 1 || len(r.GetRefused()) != 4 {
		t.Fatalf("receipt: %v", r)
	}
	for i, want := range []string{"not the voter's", "a replay", "not of box b's site", "sitevote"} {
		if !strings.Contains(r.GetRefused()[i], want) {
			t.Errorf("refusal %d: %q, want %q", i, r.GetRefused()[i], want)
		}
	}
	if _, err := s.Vote(ctx, "c", &edgeboxv1.VoteReport{Votes: []*edgeboxv1.SignedVote{sign(kc, voteOf("c", 1, now, []string{"a"}))}}); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Verdict(ctx, fl[0]); v.State != DisconnectedRunning {
		t.Fatalf("box a, heard by b and c of a site of three: %v", v)
	}
	counts := map[string]float64{}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "edgebox_site_votes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			counts[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	if counts["current"] != 2 || counts["refused"] != 4 {
		t.Fatalf("edgebox_site_votes_total: %v, want 2 current and 4 refused", counts)
	}
	// edgebox_boxes: a is disconnected-running (b and c hear it), b and c
	// online, d pending; e is alone in its site and offline: unknown.
	states := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "edgebox_boxes" {
			continue
		}
		for _, m := range mf.GetMetric() {
			states[m.GetLabel()[1].GetValue()] += m.GetGauge().GetValue()
		}
	}
	if want := map[string]float64{"disconnected-running": 1, "online": 2, "pending": 1, "unknown": 1}; fmt.Sprint(states) != fmt.Sprint(want) {
		t.Fatalf("edgebox_boxes by state: %v, want %v", states, want)
	}
	if _, err := s.Vote(ctx, "d", &edgeboxv1.VoteReport{}); !errors.Is(err, errdefs.ErrPermission) {
		t.Fatalf("a box not approved voted: %v", err)
	}
	many := &edgeboxv1.VoteReport{Votes: make([]*edgeboxv1.SignedVote, MaxVotesPerReport+1)}
	if _, err := s.Vote(ctx, "b", many); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a report of %d votes: %v", len(many.Votes), err)
	}
}

// TestASiteTooLargeIsNotWatched fills one site past MaxSiteBoxes, one
// hello at a time, as a fleet enrolled with one site name comes online:
// up to the bound every box is told of its peers; past it, nobody is, each
// box is judged by its tunnel alone and the API says why, and each hello
// costs a bounded number of writes instead of one per box of the site.
func TestASiteTooLargeIsNotWatched(t *testing.T) {
	const n = 3 * MaxSiteBoxes
	fl := make(boxes, 0, n)
	for i := range n {
		fl = append(fl, fleet.Box{ID: fmt.Sprintf("bx-%04d", i), TenantID: "t", Region: "east", Site: "hall",
			State: fleet.StateApproved, PeerAddrs: []string{fmt.Sprintf("10.0.%d.%d:7946", i/200, i%200+1)}})
	}
	obj := &objects{m: map[string]*edgeboxv1.DesiredObject{}}
	now := time.Now()
	var online sync.Map
	s := NewService(ServiceConfig{Boxes: &growing{all: fl}, Desired: obj, Now: func() time.Time { return now },
		Online: func(id string) bool { _, ok := online.Load(id); return ok }})
	ctx := context.Background()
	maxWrites := 0
	for i, b := range fl {
		growingTo(s, i+1)
		online.Store(b.ID, true)
		before := obj.writes
		if err := s.SyncSite(ctx, b); err != nil {
			t.Fatal(err)
		}
		maxWrites = max(maxWrites, obj.writes-before)
		if i+1 == MaxSiteBoxes {
			if peers := len(obj.m[b.ID].GetSitePeers().GetPeers()); peers != MaxSiteBoxes-1 {
				t.Fatalf("at %d boxes, the last is told of %d peers, want %d", i+1, peers, MaxSiteBoxes-1)
			}
		}
		now = now.Add(time.Millisecond) // the copy of the site stays fresh: hellos patch it
	}
	if len(obj.m) != 0 {
		t.Fatalf("%d boxes of a site of %d still have site peers", len(obj.m), n)
	}
	if maxWrites > MaxSiteBoxes+1 {
		t.Fatalf("one hello wrote %d objects", maxWrites)
	}
	online.Delete(fl[0].ID)
	state, detail := s.Health(ctx, fl[0])
	if state != Unknown || !strings.Contains(detail, "larger than the 64 site health watches") {
		t.Fatalf("a box offline in a site too large: %v %q", state, detail)
	}
	if state, detail := s.Health(ctx, fl[1]); state != Online || detail != "" {
		t.Fatalf("a box online in a site too large: %v %q", state, detail)
	}
	if _, err := s.Vote(ctx, fl[1].ID, &edgeboxv1.VoteReport{}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a vote from a site too large: %v", err)
	}

	// A hello in a site too large costs what it costs in a small one:
	// no copy of the site, no look at each of its boxes.
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, b := range fl[:100] {
		if err := s.SyncSite(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / 100; per > 16<<10 {
		t.Fatalf("a hello in a site of %d boxes allocated %d bytes", n, per)
	}
}

// growing is a fleet whose first n boxes have enrolled.
type growing struct {
	mu  sync.Mutex
	all boxes
	n   int
}

func (g *growing) Boxes(ctx context.Context, tenant string) ([]fleet.Box, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.all[:g.n].Boxes(ctx, tenant)
}

func (g *growing) BoxByID(ctx context.Context, id string) (fleet.Box, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.all[:g.n].BoxByID(ctx, id)
}

func growingTo(s *Service, n int) {
	g := s.cfg.Boxes.(*growing)
	g.mu.Lock()
	g.n = n
	g.mu.Unlock()
}

// counting is a fleet that counts its reads of a whole tenant, each slow.
type counting struct {
	boxes
	mu    sync.Mutex
	reads int
	slow  time.Duration // each read's time; 20 ms when 0
}

func (c *counting) Boxes(ctx context.Context, tenant string) ([]fleet.Box, error) {
	c.mu.Lock()
	c.reads++
	c.mu.Unlock()
	time.Sleep(cmp.Or(c.slow, 20*time.Millisecond))
	return c.boxes.Boxes(ctx, tenant)
}

// TestOneReadOfTheFleetAtATime: a fleet saying hello all at once, with no
// copy of its sites and then with one gone stale, reads the fleet once
// each time, not once per hello.
func TestOneReadOfTheFleetAtATime(t *testing.T) {
	fl := &counting{boxes: shop()}
	now := time.Now()
	var clock sync.Mutex
	s := NewService(ServiceConfig{Boxes: fl, Desired: &objects{m: map[string]*edgeboxv1.DesiredObject{}},
		Online: func(string) bool { return false },
		Now:    func() time.Time { clock.Lock(); defer clock.Unlock(); return now }})
	hellos := func() {
		var wg sync.WaitGroup
		for i := range 200 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := s.siteOf(context.Background(), fl.boxes[i%3]); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
	}
	hellos()
	if fl.reads != 1 {
		t.Fatalf("200 hellos with no copy read the fleet %d times", fl.reads)
	}
	clock.Lock()
	now = now.Add(time.Minute)
	clock.Unlock()
	hellos()
	if fl.reads != 2 {
		t.Fatalf("200 hellos with a stale copy read the fleet %d times in all", fl.reads)
	}
}

// TestASlowReadIsKeptLonger: a copy of the sites that took long to read
// serves readShare times as long as its read took before it is read
// again, so a starved console with a large fleet does not spend itself on
// reading it.
func TestASlowReadIsKeptLonger(t *testing.T) {
	fl := &counting{boxes: shop(), slow: 200 * time.Millisecond}
	now := time.Now()
	s := NewService(ServiceConfig{Boxes: fl, Desired: &objects{m: map[string]*edgeboxv1.DesiredObject{}},
		Online: func(string) bool { return false }, Now: func() time.Time { return now }})
	read := func() {
		t.Helper()
		if _, err := s.siteOf(context.Background(), fl.boxes[0]); err != nil {
			t.Fatal(err)
		}
	}
	read()
	now = now.Add(sitesFresh + time.Second) // stale for a fast read
	read()
	if fl.reads != 1 {
		t.Fatalf("a copy that took 200 ms to read was read again after %v: %d reads", sitesFresh+time.Second, fl.reads)
	}
	now = now.Add(readShare*fl.slow - sitesFresh) // past readShare times its read
	read()
	if fl.reads != 2 {
		t.Fatalf("a copy %v old was not read again: %d reads", readShare*fl.slow+time.Second, fl.reads)
	}
}

// TestReplicasAskOnlyForSitesWithABoxOffline: a replica asks the others
// for the votes of a site only while a box of it has no tunnel, and
// judges that box from what they give; a box alone in its site is never
// asked for.
func TestReplicasAskOnlyForSitesWithABoxOffline(t *testing.T) {
	fl := append(shop(), fleet.Box{ID: "f", TenantID: "t", Region: "east", Site: "kiosk", State: fleet.StateApproved})
	now := t0
	var mu sync.Mutex
	offline := map[string]bool{}
	var asked [][]string
	s := NewService(ServiceConfig{Boxes: fl, Desired: &objects{m: map[string]*edgeboxv1.DesiredObject{}}, Now: func() time.Time { return now },
		Tenants: func(context.Context) ([]string, error) { return []string{"t"}, nil },
		Online: func(id string) bool {
			mu.Lock()
			defer mu.Unlock()
			return !offline[id]
		},
		Others: func(_ context.Context, voters []string) ([]Ballot, error) {
			asked = append(asked, voters)
			return []Ballot{
				{Voter: "b", At: now, Alive: map[string]bool{"a": true, "c": true}},
				{Voter: "c", At: now, Alive: map[string]bool{"a": true, "b": true}},
			}, errors.New("replica r-x did not answer")
		}})
	if err := s.share(context.Background()); err != nil || len(asked) != 0 {
		t.Fatalf("with every box online: asked %v, %v", asked, err)
	}
	mu.Lock()
	offline["a"], offline["e"], offline["f"] = true, true, true
	mu.Unlock()
	err := s.share(context.Background())
	if err == nil || !strings.Contains(err.Error(), "r-x") {
		t.Fatalf("the error of a replica that did not answer: %v", err)
	}
	if len(asked) != 1 || strings.Join(asked[0], ",") != "a,b,c" {
		t.Fatalf("asked for %v; want the shop's three boxes, not the mall's or the kiosk's lone box", asked)
	}
	if st, why := s.Health(context.Background(), fl[0]); st != DisconnectedRunning {
		t.Fatalf("box a from the others' ballots: %s (%s)", st, why)
	}
}

// countedBoxes counts the reads of a whole tenant's boxes.
type countedBoxes struct {
	boxes
	mu    sync.Mutex
	reads int
}

func (c *countedBoxes) Boxes(ctx context.Context, tenant string) ([]fleet.Box, error) {
	c.mu.Lock()
	c.reads++
	c.mu.Unlock()
	return c.boxes.Boxes(ctx, tenant)
}

// TestWarmReadsTheSitesBeforeTheFirstCall: a console reads its tenants'
// sites as it starts; the first hellos and calls after it find them read.
func TestWarmReadsTheSitesBeforeTheFirstCall(t *testing.T) {
	fl := &countedBoxes{boxes: shop()}
	now := t0
	s := NewService(ServiceConfig{Boxes: fl, Desired: &objects{m: map[string]*edgeboxv1.DesiredObject{}}, Now: func() time.Time { return now },
		Tenants: func(context.Context) ([]string, error) { return []string{"t"}, nil },
		Online:  func(string) bool { return true }})
	if err := s.Warm(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fl.reads != 1 {
		t.Fatalf("%d reads of the fleet to warm one tenant", fl.reads)
	}
	for _, b := range fl.boxes {
		s.Health(context.Background(), b)
	}
	if err := s.SyncSite(context.Background(), fl.boxes[0]); err != nil {
		t.Fatal(err)
	}
	if fl.reads != 1 {
		t.Fatalf("%d reads of the fleet after the warm one, within its freshness", fl.reads-1)
	}
}

// TestABoxTheCopyMissesHasItReadAgain: the copy of the sites was read
// before the shop's boxes were enrolled. The first hello of one of them
// reads it again, so its peers are told of the whole shop at once, not of
// the boxes that said hello here; a hello of a box the copy knows reads
// nothing, nor does a box the copy misses while the copy is younger than
// readShare times its read.
func TestABoxTheCopyMissesHasItReadAgain(t *testing.T) {
	fl := &countedBoxes{}
	obj := &objects{m: map[string]*edgeboxv1.DesiredObject{}}
	now := t0
	s := NewService(ServiceConfig{Boxes: fl, Desired: obj, Now: func() time.Time { return now },
		Tenants: func(context.Context) ([]string, error) { return []string{"t"}, nil },
		Online:  func(string) bool { return true }})
	if err := s.Warm(context.Background()); err != nil {
		t.Fatal(err)
	}
	fl.boxes = shop()
	now = now.Add(time.Second) // the read's length is far less
	if err := s.SyncSite(context.Background(), fl.boxes[0]); err != nil {
		t.Fatal(err)
	}
	if p := obj.m["a"].GetSitePeers().GetPeers(); len(p) != 2 || p[0].GetBoxId() != "b" || p[1].GetBoxId() != "c" {
		t.Fatalf("box a's peers: %v; want b and c", p)
	}
	if err := s.SyncSite(context.Background(), fl.boxes[1]); err != nil {
		t.Fatal(err)
	}
	if fl.reads != 2 {
		t.Fatalf("%d reads of the fleet; want the warm one and one for the box it missed", fl.reads)
	}
	if err := s.SyncSite(context.Background(), fl.boxes[3]); err != nil { // pending: in no site
		t.Fatal(err)
	}
	if fl.reads != 2 {
		t.Fatal("a pending box's hello read the fleet again")
	}
	// A copy that took long to read is not read again at once.
	s.mu.Lock()
	c := s.sites["t"]
	c.took = time.Second
	s.sites["t"] = c
	s.mu.Unlock()
	fl.boxes = append(fl.boxes, fleet.Box{ID: "g", TenantID: "t", Region: "east", Site: "shop", State: fleet.StateApproved, PeerAddrs: []string{"192.168.1.7:7946"}})
	if err := s.SyncSite(context.Background(), fl.boxes[len(fl.boxes)-1]); err != nil {
		t.Fatal(err)
	}
	if fl.reads != 2 {
		t.Fatal("a copy read 1 s after a read of 1 s was read again")
	}
	if p := obj.m["a"].GetSitePeers().GetPeers(); len(p) != 3 {
		t.Fatalf("box a's peers after g's hello: %v; want g patched in", p)
	}
}
