package sitehealth

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/sitevote"
)

// ObjectName is the name of every box's SitePeers object.
const ObjectName = "site"

// MaxVotesPerReport bounds one VoteReport: a box that was cut off for
// longer sends what it kept in several.
const MaxVotesPerReport = 256

// MaxSiteBoxes is the largest site whose boxes watch each other. Every box
// of a site probes every other, and each box's SitePeers lists every
// other, so a site costs the square of its boxes: a branch office has a
// handful, and 64 cost 4,032 peer entries. A larger site (a data centre,
// or a fleet enrolled with one site name by mistake) gets no site health:
// its boxes are told of no peers and judged by their tunnels alone
// (online, or unknown while it is down), and the API says why. Before this bound, 10,000 boxes in one site
// made each box's hello rewrite 10,000 objects of 10,000 peers, and the
// console never brought that fleet online.
const MaxSiteBoxes = 64

// Boxes are the fleet's boxes, as the service reads them.
type Boxes interface {
	Boxes(ctx context.Context, tenant string) ([]fleet.Box, error)
	BoxByID(ctx context.Context, id string) (fleet.Box, error)
}

// Desired is where SitePeers objects are written.
type Desired interface {
	Live(ctx context.Context, box string) ([]*edgeboxv1.DesiredObject, uint64, error)
	Put(ctx context.Context, box string, o *edgeboxv1.DesiredObject) (uint64, error)
	Delete(ctx context.Context, box, kind, name string) (uint64, error)
}

// ServiceConfig is what a Service needs.
type ServiceConfig struct {
	Boxes   Boxes
	Desired Desired
	// Online reports whether a box's tunnel is up now.
	Online func(box string) bool
	// Tenants lists the tenants whose sites Run looks over.
	Tenants func(ctx context.Context) ([]string, error)
	// Tally says how old votes may be; its Period is also sent to the
	// boxes in their SitePeers.
	Tally Config
	Now   func() time.Time
	Log   *slog.Logger
	// Metrics, when set, registers the votes taken and refused.
	Metrics prometheus.Registerer
	// Others, set on a console among replicas, asks the other replicas
	// for the current ballots they took of voters (Tally.Ballots). A box
	// votes to the replica that holds its tunnel; every half period, Run
	// gathers the others' ballots of every site with a box that has no
	// tunnel, so that each replica judges such a box from its whole
	// site's votes. It returns what it got, and an error for the replicas
	// that did not answer.
	Others func(ctx context.Context, voters []string) ([]Ballot, error)
}

// Service is the console's side of site health: it lists each box's site
// peers in its desired state, takes the votes boxes send up their
// tunnels, and judges boxes without one.
type Service struct {
	cfg   ServiceConfig
	tally *Tally

	// Every hello takes each of the three locks below, and every look at
	// a box the first: one lock for all, in a 15,000-box storm, queued
	// the hellos and the operators' calls behind each other, over a
	// quarter of the API's busy time waiting on it.

	// mu guards sites and loading. The copies are read far more often
	// than they change, so readers share it.
	mu sync.RWMutex
	// sites are the tenants' sites, read at most every freshFor;
	// loading are the reads of them under way.
	sites   map[string]sites
	loading map[string]*load

	peersMu sync.Mutex
	// written is the SitePeers object last written to each box.
	written map[string]*edgeboxv1.SitePeers
	// tooLarge are the sites over MaxSiteBoxes whose boxes were all
	// told of no peers, and a warning logged.
	tooLarge map[siteKey]bool

	keysMu sync.Mutex
	// keys are the boxes' public keys, from the certificates their
	// tunnels came with; a box's votes are checked against it.
	keys map[string]*ecdsa.PublicKey

	// votes counts votes by what became of them: "current", "kept"
	// (history only) or "refused".
	votes *prometheus.CounterVec
}

// NewService returns a service with no votes yet.
func NewService(cfg ServiceConfig) *Service {
	cfg.Tally = cfg.Tally.withDefaults()
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Service{cfg: cfg, tally: NewTally(cfg.Tally), keys: map[string]*ecdsa.PublicKey{},
		written: map[string]*edgeboxv1.SitePeers{}, sites: map[string]sites{}, loading: map[string]*load{}, tooLarge: map[siteKey]bool{},
		votes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "edgebox", Subsystem: "site", Name: "votes_total",
			Help: "Site health votes the boxes sent, by what became of them: current, kept (history only) or refused."}, []string{"result"})}
	for _, r := range []string{"current", "kept", "refused"} {
		s.votes.WithLabelValues(r) // each shown from the start, at 0
	}
	if cfg.Metrics != nil {
		cfg.Metrics.MustRegister(s.votes, s.Collector())
	}
	return s
}

// Identified notes the certificate a box's tunnel came with: its votes
// are checked against its key.
func (s *Service) Identified(box string, cert *x509.Certificate) {
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return
	}
	s.keysMu.Lock()
	s.keys[box] = pub
	s.keysMu.Unlock()
}

// sitesFresh is how long a tenant's sites are read from a copy: votes
// come from every box every period, and each needs the voter's site.
const sitesFresh = 2 * time.Second

// readShare bounds the time spent reading a tenant's sites again: a copy
// serves at least readShare times as long as its read took, so reads take
// at most 2 % of the console's time. A fleet of 5,000 boxes took 0.1 s
// to read on a busy console, and was read every sitesFresh through a storm
// (for the API's health of a box and each metrics scrape), a sixth of the
// console's CPU. Hellos patch their own boxes into the copy meanwhile.
const readShare = 50

// freshFor is how long c serves before it is read again.
func (c sites) freshFor() time.Duration { return max(sitesFresh, readShare*c.took) }

// freshAt reports whether c still serves at now.
func (c sites) freshAt(now time.Time) bool { return now.Sub(c.at) <= c.freshFor() && !now.Before(c.at) }

// sites are one tenant's approved boxes by site, each site sorted by ID.
type sites struct {
	at   time.Time
	took time.Duration // how long the read of it took
	by   map[siteKey][]fleet.Box
	// others counts the boxes not approved, by region and state.
	others map[[2]string]int
	// where is the site of each approved box.
	where map[string]siteKey
}

type siteKey struct{ region, site string }

// siteOf lists the approved boxes of b's site, b included (when it is
// approved), sorted by ID.
func (s *Service) siteOf(ctx context.Context, b fleet.Box) ([]fleet.Box, error) {
	return s.readSite(ctx, b, false)
}

// readSite is siteOf, reading the fleet again when reread is set.
//
// One read of a tenant's fleet runs at a time. While it runs, callers
// with a copy, however old, take the copy; callers without one (or that
// asked for a reread) wait for it. Every hello of a fleet coming back asks
// for its site: before, each one whose copy had aged read the whole
// fleet, hundreds at once, and a console with 10,000 boxes spent its CPU
// and gigabytes of memory on reads of the same records.
func (s *Service) readSite(ctx context.Context, b fleet.Box, reread bool) ([]fleet.Box, error) {
	k := siteKey{b.Region, b.Site}
	var site []fleet.Box
	err := s.withSites(ctx, b.TenantID, reread, func(c sites) { site = c.by[k] })
	return site, err
}

// withSites calls f, with s.mu held, with the copy of tenant's sites,
// reading them again when the copy is older than its freshFor or reread is
// set: see readSite. f must neither change c nor keep c.by: patchSite
// changes it.
func (s *Service) withSites(ctx context.Context, tenant string, reread bool, f func(c sites)) error {
	if !reread && s.withCopy(tenant, f) {
		return nil
	}
	for {
		now := s.cfg.Now()
		s.mu.Lock()
		c, serves := s.servable(tenant, now)
		l, loading := s.loading[tenant]
		switch {
		case serves && !reread: // read since withCopy looked
			f(c)
			s.mu.Unlock()
			return nil
		case loading: // no copy, or a reread: the read under way serves
			s.mu.Unlock()
			select {
			case <-l.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			if l.err != nil && !errors.Is(l.err, context.Canceled) && !errors.Is(l.err, context.DeadlineExceeded) {
				return l.err
			}
			// The read ended with its caller, whose box went: this
			// caller's own read, or the copy it left, serves.
			reread = reread && l.err != nil
			continue
		}
		l = &load{done: make(chan struct{})}
		s.loading[tenant] = l
		s.mu.Unlock()
		c, l.err = s.readSites(ctx, tenant, now)
		s.mu.Lock()
		if l.err == nil {
			s.sites[tenant] = c
			f(c)
		}
		delete(s.loading, tenant)
		s.mu.Unlock()
		close(l.done)
		return l.err
	}
}

// withCopy calls f, sharing s.mu with other readers, with the copy of
// tenant's sites if it is fresh, or if a read of them is under way; it
// reports whether it did. This is withSites's way for all but a few
// callers.
func (s *Service) withCopy(tenant string, f func(c sites)) bool {
	now := s.cfg.Now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	c, serves := s.servable(tenant, now)
	if serves {
		f(c)
	}
	return serves
}

// servable returns the copy of tenant's sites and whether it serves at
// now: it is fresh, or a read of the tenant is under way. s.mu must be
// held, shared or not.
func (s *Service) servable(tenant string, now time.Time) (sites, bool) {
	c, ok := s.sites[tenant]
	_, loading := s.loading[tenant]
	return c, ok && (loading || c.freshAt(now))
}

// load is a read of a tenant's sites under way.
type load struct {
	done chan struct{} // closed when it ended
	err  error         // set before done is closed
}

// readSites reads a tenant's approved boxes by site.
func (s *Service) readSites(ctx context.Context, tenant string, now time.Time) (sites, error) {
	began := time.Now()
	all, err := s.cfg.Boxes.Boxes(ctx, tenant)
	if err != nil {
		return sites{}, err
	}
	c := sites{at: now, by: map[siteKey][]fleet.Box{}, others: map[[2]string]int{}, where: map[string]siteKey{}}
	for _, o := range all {
		if o.State == fleet.StateApproved {
			k := siteKey{o.Region, o.Site}
			c.by[k] = append(c.by[k], o)
			c.where[o.ID] = k
		} else {
			c.others[[2]string{o.Region, string(o.State)}]++
		}
	}
	for _, site := range c.by {
		slices.SortFunc(site, func(x, y fleet.Box) int { return strings.Compare(x.ID, y.ID) })
	}
	c.took = time.Since(began)
	return c, nil
}

// Warm reads every tenant's sites. Until a tenant's are read, each hello
// of its boxes and each API call on one waits for that first read: run at
// a start under a returning fleet, it competes for the CPU with thousands
// of sessions, and the first calls of an operator waited 10 s for it.
func (s *Service) Warm(ctx context.Context) error {
	return s.eachTenant(ctx, func(sites) {})
}

// eachTenant calls f, as withSites does, with the copy of every tenant's
// sites, read where there is none or it aged. A tenant whose sites cannot
// be read is named in the error, and the others are still seen.
func (s *Service) eachTenant(ctx context.Context, f func(c sites)) error {
	if s.cfg.Tenants == nil {
		return nil
	}
	tenants, err := s.cfg.Tenants(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range tenants {
		if err := s.withSites(ctx, t, false, f); err != nil {
			errs = append(errs, fmt.Errorf("tenant %s: %w", t, err))
		}
	}
	return errors.Join(errs...)
}

// patchSite puts b, as its hello just recorded it, into the copy of its
// tenant's sites, or takes it out when it is not approved, and returns its
// site. A hello changes only its own box: reading the whole tenant again
// for each would cost a fleet coming back the square of its size.
//
// An approved box the copy does not know was approved (or enrolled) since
// it was read, and so may others of its site have been, their hellos
// served by another replica or still to come: the copy is read again
// first, unless it was read less than readShare times its read's length
// ago (a fleet enrolled all at once would read it without end). The peers
// told to a site come from the copy, and a copy read as the console
// started (Warm) would otherwise miss every box enrolled in its first
// seconds until the sweep.
func (s *Service) patchSite(ctx context.Context, b fleet.Box) ([]fleet.Box, error) {
	if _, err := s.siteOf(ctx, b); err != nil { // a copy, fresh enough
		return nil, err
	}
	if b.State == fleet.StateApproved {
		s.mu.RLock()
		c := s.sites[b.TenantID]
		_, known := c.where[b.ID]
		aged := s.cfg.Now().Sub(c.at) >= readShare*c.took
		s.mu.RUnlock()
		if !known && aged {
			if _, err := s.readSite(ctx, b, true); err != nil {
				return nil, err
			}
		}
	}
	k := siteKey{b.Region, b.Site}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.sites[b.TenantID]
	if c.by == nil {
		return nil, nil
	}
	// A box that moved leaves its old site. Readers may hold the old
	// slices: a patched site is a new one.
	if old, ok := c.where[b.ID]; ok && old != k {
		c.by[old] = slices.DeleteFunc(slices.Clone(c.by[old]), func(o fleet.Box) bool { return o.ID == b.ID })
	}
	delete(c.where, b.ID)
	site := slices.DeleteFunc(slices.Clone(c.by[k]), func(o fleet.Box) bool { return o.ID == b.ID })
	if b.State == fleet.StateApproved {
		i, _ := slices.BinarySearchFunc(site, b.ID, func(o fleet.Box, id string) int { return strings.Compare(o.ID, id) })
		site = slices.Insert(site, i, b)
		c.where[b.ID] = k
	}
	c.by[k] = site
	return site, nil
}

func ids(boxes []fleet.Box) []string {
	out := make([]string, len(boxes))
	for i, b := range boxes {
		out[i] = b.ID
	}
	return out
}

// Vote takes the votes of a report from box, whose tunnel carried it,
// and says which it refused and why. Each vote must be the box's own,
// signed by the key of its tunnel's certificate, with a counter not
// taken before, naming only boxes of its site.
func (s *Service) Vote(ctx context.Context, box string, r *edgeboxv1.VoteReport) (*edgeboxv1.VoteReceipt, error) {
	if n := len(r.GetVotes()); n > MaxVotesPerReport {
		return nil, errdefs.Invalid("a report of %d votes; send at most %d at once", n, MaxVotesPerReport)
	}
	b, err := s.cfg.Boxes.BoxByID(ctx, box)
	if err != nil {
		return nil, err
	}
	if b.State != fleet.StateApproved {
		return nil, errdefs.Permission("box %s is %s and cannot vote", box, b.State)
	}
	site, err := s.siteOf(ctx, b)
	if err != nil {
		return nil, err
	}
	if len(site) > MaxSiteBoxes {
		return nil, errdefs.Invalid("site %s has %d boxes; site health watches sites of at most %d", b.Site, len(site), MaxSiteBoxes)
	}
	s.keysMu.Lock()
	key := s.keys[box]
	s.keysMu.Unlock()
	if key == nil {
		return nil, errdefs.Unavailable("the console has no key of box %s yet; vote again on a new session", box)
	}
	// Each vote is opened and its signature checked once; a vote that
	// fails either is refused.
	votes := make([]*edgeboxv1.SiteVote, len(r.GetVotes()))
	why := make([]error, len(votes))
	for i, sv := range r.GetVotes() {
		votes[i], why[i] = sitevote.Open(sv)
		if why[i] == nil {
			why[i] = sitevote.VerifyKey(sv, key)
		}
	}
	peers := slices.DeleteFunc(ids(site), func(id string) bool { return id == box })
	if namesOthers(votes, why, peers) { // a box joined since the console last read the site
		if site, err = s.readSite(ctx, b, true); err != nil {
			return nil, err
		}
		peers = slices.DeleteFunc(ids(site), func(id string) bool { return id == box })
	}
	receipt := &edgeboxv1.VoteReceipt{}
	now := s.cfg.Now()
	for i, v := range votes {
		err := why[i]
		if err == nil {
			err = s.tally.Take(box, peers, v, now)
		}
		switch {
		case err == nil:
			receipt.Accepted++
			s.votes.WithLabelValues("current").Inc()
		case errors.Is(err, Kept):
			receipt.Accepted++
			s.votes.WithLabelValues("kept").Inc()
		default:
			receipt.Refused = append(receipt.Refused, fmt.Sprintf("vote %d: %v", i, err))
			s.votes.WithLabelValues("refused").Inc()
		}
	}
	if len(receipt.Refused) > 0 {
		s.cfg.Log.Warn("site votes refused", "box_id", box, "refused", len(receipt.Refused), "first", receipt.Refused[0])
	}
	return receipt, nil
}

// namesOthers reports whether a vote that opened and verified names a
// box not in peers: the site is read again before the votes are taken.
func namesOthers(votes []*edgeboxv1.SiteVote, why []error, peers []string) bool {
	for i, v := range votes {
		if why[i] != nil {
			continue
		}
		for _, p := range v.GetPeers() {
			if !slices.Contains(peers, p.GetBoxId()) {
				return true
			}
		}
	}
	return false
}

// Verdict judges box b now.
func (s *Service) Verdict(ctx context.Context, b fleet.Box) (Verdict, error) {
	site, err := s.siteOf(ctx, b)
	if err != nil {
		return Verdict{}, err
	}
	if len(site) > MaxSiteBoxes {
		return s.tally.Decide(b.ID, s.cfg.Online(b.ID), []string{b.ID}, s.cfg.Now()), nil
	}
	return s.tally.Decide(b.ID, s.cfg.Online(b.ID), ids(site), s.cfg.Now()), nil
}

// Health is what the API says of box b: its state, and for a box without
// a tunnel, the grounds ("2 of its site of 3 hear it", "its whole site is
// out of sight").
func (s *Service) Health(ctx context.Context, b fleet.Box) (State, string) {
	return s.judge(ctx, b, true)
}

// judge is Health; without detail it leaves the grounds empty, for a look
// at every box that counts states alone.
func (s *Service) judge(ctx context.Context, b fleet.Box, detail bool) (State, string) {
	site, err := s.siteOf(ctx, b)
	return s.judgeIn(b, site, err, detail)
}

// judgeIn is judge with b's site (or the error reading it) at hand.
func (s *Service) judgeIn(b fleet.Box, site []fleet.Box, err error, detail bool) (State, string) {
	why := func(format string, args ...any) string {
		if !detail {
			return ""
		}
		return fmt.Sprintf(format, args...)
	}
	online := s.cfg.Online(b.ID)
	switch {
	case online && (err != nil || len(site) < 2 || len(site) > MaxSiteBoxes):
		return Online, ""
	case err != nil:
		return Unknown, why("the console cannot read the box's site: %v", err)
	case len(site) > MaxSiteBoxes:
		return Unknown, why("its site of %d boxes is larger than the %d site health watches: judged by its tunnel alone", len(site), MaxSiteBoxes)
	case online && !detail:
		return Online, "" // its site's votes only make the grounds
	case online:
		// What its site says of it now, should its line go.
		v := s.tally.Decide(b.ID, false, ids(site), s.cfg.Now())
		return Online, why("%d of the %d boxes of its site hear it, %d do not", v.Alive, len(site), v.Dead)
	}
	now := s.cfg.Now()
	if len(site) > 1 && s.tally.SiteUnreachable(ids(site), s.cfg.Online, now) {
		return Unknown, why("site unreachable: none of the %d boxes of site %s has a tunnel or voted lately", len(site), b.Site)
	}
	v := s.tally.Decide(b.ID, false, ids(site), now)
	return v.State, why("%d of the %d boxes of its site hear it, %d do not; %d decide", v.Alive, len(site), v.Dead, v.Need)
}

// RanUntil is the latest time the votes of b's site show it running
// (zero: none do).
func (s *Service) RanUntil(id string) time.Time { return s.tally.RanUntil(id) }

// LineDown reports whether box id has no tunnel but runs, as a strict
// majority of its site hears it: nothing is moved away from it, and a
// rollout neither fails it nor tells it anything.
func (s *Service) LineDown(id string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := s.cfg.Boxes.BoxByID(ctx, id)
	if err != nil {
		return false
	}
	v, err := s.Verdict(ctx, b)
	return err == nil && v.State == DisconnectedRunning
}

// SiteUnreachable reports whether b's whole site is out of the console's
// sight: no box of it has a tunnel or voted lately.
func (s *Service) SiteUnreachable(ctx context.Context, b fleet.Box) (bool, error) {
	site, err := s.siteOf(ctx, b)
	if err != nil {
		return false, err
	}
	return len(site) > 1 && s.tally.SiteUnreachable(ids(site), s.cfg.Online, s.cfg.Now()), nil
}

// SyncSite writes the SitePeers object of every box of b's site: the
// other boxes with their probe addresses. A box alone in its site, or
// whose peers took no probes, has none.
func (s *Service) SyncSite(ctx context.Context, b fleet.Box) error {
	// A site too large already stays so whatever b's hello changed: its
	// boxes cost no copy of the site each.
	site, err := s.siteOf(ctx, b)
	if err != nil {
		return err
	}
	if len(site) > MaxSiteBoxes {
		return s.unwatch(ctx, b, site)
	}
	// b is as its hello says now; the others as the copy has them, at
	// at most freshFor old, and the sweep catches up with the rest.
	if site, err = s.patchSite(ctx, b); err != nil {
		return err
	}
	if len(site) > MaxSiteBoxes {
		return s.unwatch(ctx, b, site)
	}
	s.peersMu.Lock()
	delete(s.tooLarge, siteKey{b.Region, b.Site})
	s.peersMu.Unlock()
	var errs []error
	for _, box := range site {
		want := &edgeboxv1.SitePeers{PeriodMillis: uint32(s.cfg.Tally.Period / time.Millisecond)}
		for _, o := range site {
			if o.ID != box.ID && len(o.PeerAddrs) > 0 {
				want.Peers = append(want.Peers, &edgeboxv1.SitePeer{BoxId: o.ID, Addrs: o.PeerAddrs})
			}
		}
		if len(want.Peers) == 0 || len(box.PeerAddrs) == 0 {
			want = nil
		}
		if err := s.write(ctx, box.ID, want); err != nil {
			errs = append(errs, fmt.Errorf("box %s: %w", box.ID, err))
		}
	}
	return errors.Join(errs...)
}

// unwatch takes the SitePeers object from b, a box of a site too large
// for site health. The first time the site is found too large, it takes it
// from every box of the site told of peers before, and logs it; after that
// only from b, so that a hello costs the same in a site of any size.
func (s *Service) unwatch(ctx context.Context, b fleet.Box, site []fleet.Box) error {
	k := siteKey{b.Region, b.Site}
	s.peersMu.Lock()
	first := !s.tooLarge[k]
	s.tooLarge[k] = true
	var told []string
	for i := 0; first && i < len(site); i++ {
		if o := site[i]; o.ID != b.ID && s.written[o.ID] != nil {
			told = append(told, o.ID)
		}
	}
	s.peersMu.Unlock()
	if first {
		s.cfg.Log.Warn("site too large for site health: its boxes are told of no peers and judged by their tunnels alone",
			"tenant", b.TenantID, "region", b.Region, "site", b.Site, "boxes", len(site), "max", MaxSiteBoxes)
	}
	var errs []error
	for _, id := range append(told, b.ID) {
		if err := s.write(ctx, id, nil); err != nil {
			errs = append(errs, fmt.Errorf("box %s: %w", id, err))
		}
	}
	if len(errs) > 0 && first {
		s.peersMu.Lock()
		delete(s.tooLarge, k) // the next hello of the site tries them again
		s.peersMu.Unlock()
	}
	return errors.Join(errs...)
}

// SweepEvery is how often Run looks over every site: a box revoked,
// moved to another site or approved changes its site's peers without a
// hello from the site.
const SweepEvery = time.Minute

// Run keeps every site's SitePeers objects up to date, and among
// replicas gathers the others' ballots (ServiceConfig.Others), until ctx
// ends.
func (s *Service) Run(ctx context.Context) error {
	t := time.NewTicker(SweepEvery)
	defer t.Stop()
	var shares <-chan time.Time
	if s.cfg.Others != nil {
		st := time.NewTicker(s.shareEvery())
		defer st.Stop()
		shares = st.C
	}
	failing := false // logged once until the others answer again
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := s.sweep(ctx); err != nil && ctx.Err() == nil {
				s.cfg.Log.Warn("site peers not brought up to date; trying again in a minute", "err", err)
			}
		case <-shares:
			err := s.share(ctx)
			switch {
			case err != nil && ctx.Err() == nil && !failing:
				failing = true
				s.cfg.Log.Warn("site votes held by other console replicas not read; boxes without a tunnel are judged from the votes that reached this one until they are", "err", err)
			case err == nil && failing:
				failing = false
				s.cfg.Log.Info("site votes held by other console replicas read again")
			}
		}
	}
}

// shareEvery is how often a replica gathers the others' ballots: half a
// probe period, so a box whose line went is judged from its whole site
// at most that much later than by the replica its peers vote to.
func (s *Service) shareEvery() time.Duration { return s.cfg.Tally.Period / 2 }

// MaxVotersAsked bounds the voters asked of the others in one round: the
// sites of 10,000 boxes without a tunnel, in a storm, stay under it.
const MaxVotersAsked = 20_000

// share merges the other replicas' ballots of the voters of every site
// with an approved box that has no tunnel: only such a box is judged from
// its site's votes.
func (s *Service) share(ctx context.Context) error {
	voters, err := s.voters(ctx)
	if err != nil || len(voters) == 0 {
		return err
	}
	if len(voters) > MaxVotersAsked {
		voters = voters[:MaxVotersAsked]
	}
	ballots, err := s.cfg.Others(ctx, voters)
	s.tally.Merge(ballots, s.cfg.Now()) // what came, even if a replica did not answer
	return err
}

// voters lists the boxes of every watched site that has an approved box
// without a tunnel.
func (s *Service) voters(ctx context.Context) ([]string, error) {
	var watched [][]fleet.Box
	if err := s.eachTenant(ctx, func(c sites) {
		for _, site := range c.by { // patchSite replaces a site's slice, never changes it
			if len(site) >= 2 && len(site) <= MaxSiteBoxes {
				watched = append(watched, site)
			}
		}
	}); err != nil {
		return nil, err
	}
	// Online is asked outside s.mu, which withSites holds around f.
	var voters []string
	for _, site := range watched {
		if slices.ContainsFunc(site, func(b fleet.Box) bool { return !s.cfg.Online(b.ID) }) {
			voters = append(voters, ids(site)...)
		}
	}
	return voters, nil
}

// Ballots are the current votes of voters that reached this replica:
// what another replica's Others asks for.
func (s *Service) Ballots(voters []string) []Ballot { return s.tally.Ballots(voters, s.cfg.Now()) }

// sweep syncs every site that has a box with probe addresses, or a box
// told of peers before.
func (s *Service) sweep(ctx context.Context) error {
	if s.cfg.Tenants == nil {
		return nil
	}
	tenants, err := s.cfg.Tenants(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range tenants {
		all, err := s.cfg.Boxes.Boxes(ctx, t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		done := map[siteKey]bool{}
		for _, b := range all {
			k := siteKey{b.Region, b.Site}
			s.peersMu.Lock()
			told := s.written[b.ID] != nil
			s.peersMu.Unlock()
			switch {
			case b.State != fleet.StateApproved:
				s.tally.Forget(b.ID)
				if told {
					if err := s.write(ctx, b.ID, nil); err != nil {
						errs = append(errs, err)
					}
				}
			case !done[k] && (len(b.PeerAddrs) > 0 || told):
				done[k] = true
				if err := s.SyncSite(ctx, b); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// write makes box's SitePeers object want (none when nil), unless it is
// that already.
func (s *Service) write(ctx context.Context, box string, want *edgeboxv1.SitePeers) error {
	s.peersMu.Lock()
	have, known := s.written[box]
	s.peersMu.Unlock()
	if !known {
		live, _, err := s.cfg.Desired.Live(ctx, box)
		if err != nil {
			return err
		}
		for _, o := range live {
			if o.GetSitePeers() != nil && o.GetName() == ObjectName {
				have = o.GetSitePeers()
			}
		}
	}
	if proto.Equal(have, want) {
		if !known {
			s.remember(box, want)
		}
		return nil
	}
	var err error
	if want == nil {
		_, err = s.cfg.Desired.Delete(ctx, box, edgeboxv1.KindSitePeers, ObjectName)
	} else {
		_, err = s.cfg.Desired.Put(ctx, box, &edgeboxv1.DesiredObject{Kind: edgeboxv1.KindSitePeers, Name: ObjectName,
			Spec: &edgeboxv1.DesiredObject_SitePeers{SitePeers: want}})
	}
	if err != nil {
		return err
	}
	s.remember(box, want)
	return nil
}

func (s *Service) remember(box string, p *edgeboxv1.SitePeers) {
	s.peersMu.Lock()
	s.written[box] = p
	s.peersMu.Unlock()
}

// Collector is edgebox_boxes by region and state, counted at each scrape:
// approved boxes by health (online, disconnected-running, down,
// unknown), the others by their state (pending, revoked).
func (s *Service) Collector() prometheus.Collector { return boxStates{s} }

type boxStates struct{ s *Service }

var boxesDesc = prometheus.NewDesc("edgebox_boxes", "Boxes by region and state: approved ones by health (online, disconnected-running, down, unknown), the others as pending or revoked.",
	[]string{"region", "state"}, nil)

func (b boxStates) Describe(ch chan<- *prometheus.Desc) { ch <- boxesDesc }

func (b boxStates) Collect(ch chan<- prometheus.Metric) {
	if b.s.cfg.Tenants == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tenants, err := b.s.cfg.Tenants(ctx)
	if err != nil {
		b.s.cfg.Log.Warn("boxes by state not counted", "err", err)
		return
	}
	// From the copy of each tenant's sites, as every other look at the
	// boxes: a scrape reads no record, however large the fleet.
	type key struct{ region, state string }
	counts := map[key]int{}
	for _, t := range tenants {
		var approved [][]fleet.Box
		err := b.s.withSites(ctx, t, false, func(c sites) {
			for _, site := range c.by { // patchSite replaces a site's slice, never changes it
				approved = append(approved, site)
			}
			for k, n := range c.others {
				counts[key{k[0], k[1]}] += n
			}
		})
		if err != nil {
			b.s.cfg.Log.Warn("boxes by state not counted", "tenant", t, "err", err)
			continue
		}
		for _, site := range approved {
			for _, box := range site {
				st, _ := b.s.judgeIn(box, site, nil, false)
				counts[key{box.Region, string(st)}]++
			}
		}
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(boxesDesc, prometheus.GaugeValue, float64(n), k.region, k.state)
	}
}
