package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/edgebox/edgebox/agent/sitepeer"
	"github.com/edgebox/edgebox/errdefs/errgrpc"
	"github.com/edgebox/edgebox/internal/atomicfile"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/sitevote"
)

const (
	// counterFile holds the highest vote counter the box may have used.
	counterFile = "vote-counter"
	// counterBlock is how many counters one write of counterFile
	// reserves: a box writes it once per this many votes, and after a
	// crash skips what it had reserved and not used.
	counterBlock = 10_000
	// maxKeptVotes bounds the votes kept while the console cannot be
	// reached: at the default period, the last five and a half hours.
	maxKeptVotes = 2000
	// voteBatch is how many kept votes go up in one report.
	voteBatch = 256
	// defaultSitePeriod is the probe period while the console names none.
	defaultSitePeriod = 10 * time.Second
)

// siteHealth is the box's side of site health (ADR 0019): it hears the
// peers the console lists in the SitePeers object and answers them
// (sitepeer), and each period signs a vote on whom it heard and sends it
// up the tunnel. Votes that cannot go up are kept, oldest dropped past
// maxKeptVotes, and sent in order once the console is back: they show
// what the site saw while its line was down.
func (a *Agent) siteHealth(ctx context.Context, c edgeboxv1.ConsoleServiceClient) {
	counter, err := openCounter(filepath.Join(a.cfg.DataDir, counterFile))
	if err != nil {
		a.log.Warn("site health is off: its vote counter cannot be kept", "err", err)
		return
	}
	var (
		want    *edgeboxv1.SitePeers
		prober  *sitepeer.Prober
		stop    = func() {}
		period  = defaultSitePeriod
		kept    []*edgeboxv1.SignedVote
		nextVot time.Time
	)
	defer func() { stop(); a.prober.Store(nil) }()
	start := func(p time.Duration) {
		stop()
		prober = sitepeer.New(sitepeer.Config{Self: a.creds.BoxID, Cert: func() *tls.Certificate { return a.cert.Load() },
			CA: a.creds.ca, Listen: a.cfg.SiteListen, Period: p, Log: a.log.With("component", "sitepeer")})
		a.prober.Store(prober)
		pctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := prober.Run(pctx); err != nil {
				a.log.Warn("site peers are not heard", "err", err)
			}
		}()
		stop = func() { cancel(); <-done }
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if got := a.sitePeers(); !proto.Equal(got, want) {
			want = got
			p := time.Duration(want.GetPeriodMillis()) * time.Millisecond
			if p <= 0 {
				p = defaultSitePeriod
			}
			if prober == nil || p != period {
				period = p
				start(period) // the first time, or the period changed
			}
			var peers []sitepeer.Peer
			for _, sp := range want.GetPeers() {
				peers = append(peers, sitepeer.Peer{ID: sp.GetBoxId(), Addrs: sp.GetAddrs()})
			}
			prober.SetPeers(peers)
			nextVot = time.Now().Add(period) // a vote once the peers had a period to be heard
		}
		if prober != nil && len(want.GetPeers()) > 0 && !time.Now().Before(nextVot) {
			nextVot = time.Now().Add(period)
			if sv, err := a.vote(counter, prober.Seen()); err != nil {
				a.log.Warn("a site vote could not be made", "err", err)
			} else {
				kept = append(kept, sv)
				if len(kept) > maxKeptVotes {
					kept = slices.Delete(kept, 0, len(kept)-maxKeptVotes)
				}
			}
			kept = a.sendVotes(ctx, c, kept, period)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// sitePeers is the SitePeers object the box holds, nil when none.
func (a *Agent) sitePeers() *edgeboxv1.SitePeers {
	objs, err := a.local.Objects(edgeboxv1.KindSitePeers)
	if err != nil {
		return nil
	}
	for _, o := range objs {
		if p := o.GetSitePeers(); p != nil {
			return p
		}
	}
	return nil
}

// vote signs what the box hears now with its key.
func (a *Agent) vote(counter *voteCounter, seen []*edgeboxv1.PeerSeen) (*edgeboxv1.SignedVote, error) {
	key, ok := a.cert.Load().PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, errors.New("the box key is not ECDSA")
	}
	n, err := counter.next()
	if err != nil {
		return nil, err
	}
	return sitevote.Sign(key, &edgeboxv1.SiteVote{Voter: a.creds.BoxID, Counter: n, UnixNano: time.Now().UnixNano(), Peers: seen})
}

// sendVotes sends the kept votes up in order, as many as the console
// takes before a call fails, and returns those still to send. A vote the
// console refused is not sent again: it said why, and the box logs it.
func (a *Agent) sendVotes(ctx context.Context, c edgeboxv1.ConsoleServiceClient, kept []*edgeboxv1.SignedVote, period time.Duration) []*edgeboxv1.SignedVote {
	for len(kept) > 0 && a.isConnected() {
		n := min(len(kept), voteBatch)
		cctx, cancel := context.WithTimeout(ctx, period)
		r, err := c.Vote(cctx, &edgeboxv1.VoteReport{Votes: kept[:n]})
		cancel()
		if err = errgrpc.ToNative(err); err != nil {
			a.log.Debug("site votes kept for later", "kept", len(kept), "err", err)
			return kept
		}
		if len(r.GetRefused()) > 0 {
			a.log.Warn("the console refused site votes", "refused", len(r.GetRefused()), "first", r.GetRefused()[0])
		}
		kept = kept[n:]
	}
	return kept
}

// isConnected reports whether the tunnel is up, as the status says.
func (a *Agent) isConnected() bool {
	a.statusMu.Lock()
	defer a.statusMu.Unlock()
	return a.status.Connected
}

// voteCounter hands out vote counters that rise across restarts: it
// reserves them a block at a time in a file, so a crash skips counters
// but never repeats one.
type voteCounter struct {
	path    string
	at, end uint64
}

func openCounter(path string) (*voteCounter, error) {
	var end uint64
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		if end, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return &voteCounter{path: path, at: end + 1, end: end}, nil
}

func (c *voteCounter) next() (uint64, error) {
	if c.at > c.end {
		end := c.end + counterBlock
		if err := atomicfile.Write(c.path, []byte(strconv.FormatUint(end, 10)+"\n")); err != nil {
			return 0, err
		}
		c.end = end
	}
	n := c.at
	c.at++
	return n, nil
}
