package console

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgebox/edgebox/console/httpapi"
	"github.com/edgebox/edgebox/console/pki"
	"github.com/edgebox/edgebox/console/presence"
	"github.com/edgebox/edgebox/console/replicas"
	"github.com/edgebox/edgebox/console/sitehealth"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/tunnel"
)

// replicaTTL is the lease under which a replica holds its boxes: how long
// a dead replica's boxes still seem held by it. A box's own tunnel finds
// the replica dead within its DeadAfter (25 s) and redials at once.
const replicaTTL = 10 * time.Second

// replication is what a console sharing an etcd cluster with others runs
// beside the rest: its place among the replicas, the listener the others
// forward calls and open streams for its boxes on, the forwarder of
// calls for theirs, and the opener of streams to any box.
type replication struct {
	set     *replicas.Set
	forward *replicas.Forwarder
	streams *replicas.Streams
	ln      net.Listener // the replica port, guarded (replicas.Guard)
	srv     *http.Server
}

// replicate joins the replicas on es when the console has a replica
// listener; nil when it runs alone. srv's sessions are held as this
// replica's.
func (c *Console) replicate(ctx context.Context, es *store.Etcd, authority *pki.Authority, srv *tunnel.Server, public string, reg prometheus.Registerer) (*replication, error) {
	cfg := c.cfg
	if cfg.ReplicaListen == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", cfg.ReplicaListen)
	if err != nil {
		return nil, fmt.Errorf("console: replica listener on %s: %w", cfg.ReplicaListen, err)
	}
	c.opened(ln.Close)
	u, err := replicaURL(cfg.ReplicaURL, ln.Addr())
	if err != nil {
		return nil, err
	}
	id := make([]byte, 6)
	rand.Read(id)
	self := replicas.Replica{ID: "r-" + hex.EncodeToString(id), Name: consoleID(public), URL: u.String()}
	cert, err := authority.ReplicaCert(self.ID, []string{u.Hostname(), "localhost", "127.0.0.1", "::1"})
	if err != nil {
		return nil, err
	}
	set, err := replicas.Start(ctx, replicas.Config{Client: es.Client(), Prefix: es.Prefix(), Self: self, TTL: replicaTTL,
		Drop:    func(box string) { go srv.Drop(box) },
		Log:     c.log.With("component", "replicas"),
		Metrics: reg})
	if err != nil {
		return nil, fmt.Errorf("console: joining the replicas: %w", err)
	}
	c.opened(set.Close)
	streams, err := replicas.NewStreams(replicas.StreamsConfig{Set: set, Local: srv, Cert: cert, Roots: authority.Pool(),
		Log: c.log.With("component", "replica-streams")})
	if err != nil {
		return nil, err
	}
	c.opened(streams.Close)
	c.log.Info("console replica", "id", self.ID, "replica_url", self.URL)
	// Strangers reaching the replica port are held to a few connections
	// in their handshake, each closed after HandshakeTimeout (the
	// server's ReadHeaderTimeout bounds the handshake too).
	guard := replicas.DefaultGuardConfig()
	guard.Metrics = reg
	tlsCfg := replicas.ListenerTLS(cert, authority.Pool())
	return &replication{set: set, ln: replicas.Guard(ln, tlsCfg, guard), streams: streams,
		forward: replicas.NewForwarder(set, cert, authority.Pool(), c.log.With("component", "replicas")),
		srv: &http.Server{TLSConfig: tlsCfg,
			ReadHeaderTimeout: cfg.HandshakeTimeout, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}}, nil
}

// replicaURL is where the other replicas reach this one: the configured
// URL, or https:// this host's name and the listener's port.
func replicaURL(configured string, addr net.Addr) (*url.URL, error) {
	if configured != "" {
		u, err := url.Parse(configured)
		if err != nil || u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return nil, fmt.Errorf("console: replica URL %q must look like https://host:port", configured)
		}
		u.Path = ""
		return u, nil
	}
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("console: naming this replica for the others: %w; give --replica-url", err)
	}
	port := strconv.Itoa(addr.(*net.TCPAddr).Port)
	return &url.URL{Scheme: "https", Host: net.JoinHostPort(host, port)}, nil
}

// onSession records a box's session coming and going as this replica's.
func (r *replication) onSession(ev tunnel.SessionEvent) {
	if r == nil {
		return
	}
	if ev.Up {
		r.set.Hold(ev.BoxID, ev.Session.Started())
	} else {
		r.set.Release(ev.BoxID, ev.Session.Started())
	}
}

// opener opens streams to boxes wherever their tunnels are: through the
// replica that holds a box when another does; local alone when the
// console runs alone.
func (r *replication) opener(local *tunnel.Server) replicas.Opener {
	if r == nil {
		return local
	}
	return r.streams
}

// held reports whether another replica holds box's tunnel.
func (r *replication) held(box string) bool { return r != nil && r.forward.Held(box) }

// serve serves the API, streams to this replica's boxes, and the site
// votes they sent, to the other replicas until ctx ends; then it cuts the
// streams it carries.
func (r *replication) serve(ctx context.Context, api http.Handler, sites *sitehealth.Service) error {
	defer r.streams.Close()
	r.srv.Handler = replicas.ServeReplicas(r.streams.Mount(serveBallots(sites, api)))
	served := make(chan error, 1)
	go func() { served <- r.srv.Serve(r.ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.srv.Shutdown(shutdownCtx); err != nil {
		r.srv.Close()
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// ballotsPath is where a replica asks another for the site votes its
// boxes sent (sitehealth.ServiceConfig.Others); only the replica
// listener serves it.
const ballotsPath = "/replica/v1/site-ballots"

// ballotsQuery and ballotsAnswer are the ask and the answer on
// ballotsPath.
type ballotsQuery struct {
	Voters []string `json:"voters"`
}

type ballotsAnswer struct {
	Ballots []sitehealth.Ballot `json:"ballots"`
}

const (
	// maxBallotsQuery bounds the body of an ask: MaxVotersAsked IDs.
	maxBallotsQuery = 2 << 20
	// maxBallotsAnswer bounds an answer read: MaxVotersAsked ballots of
	// sites of up to 64 boxes would be larger, but a replica holds a
	// share of them, and a site is a branch office of a few.
	maxBallotsAnswer = 64 << 20
	// ballotsTimeout bounds an ask of one replica.
	ballotsTimeout = 5 * time.Second
)

// ballots asks every other replica for the current votes of voters that
// reached it.
func (r *replication) ballots(ctx context.Context, voters []string) ([]sitehealth.Ballot, error) {
	if r == nil {
		return nil, nil
	}
	body, err := json.Marshal(ballotsQuery{Voters: voters})
	if err != nil {
		return nil, err
	}
	answers, err := r.forward.Ask(ctx, ballotsPath, body, ballotsTimeout, maxBallotsAnswer)
	var out []sitehealth.Ballot
	for _, b := range answers {
		var a ballotsAnswer
		if derr := json.Unmarshal(b, &a); derr != nil {
			err = errors.Join(err, fmt.Errorf("a replica's site votes: %w", derr))
			continue
		}
		out = append(out, a.Ballots...)
	}
	return out, err
}

// serveBallots answers another replica's ask for site votes on
// ballotsPath, and passes every other call to next.
func serveBallots(sites *sitehealth.Service, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != ballotsPath {
			next.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodPost {
			http.Error(w, "POST the voters", http.StatusMethodNotAllowed)
			return
		}
		var q ballotsQuery
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBallotsQuery)).Decode(&q); err != nil {
			http.Error(w, "a list of voters: "+err.Error(), http.StatusBadRequest)
			return
		}
		if len(q.Voters) > sitehealth.MaxVotersAsked {
			http.Error(w, fmt.Sprintf("%d voters; ask for at most %d at once", len(q.Voters), sitehealth.MaxVotersAsked), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(ballotsAnswer{Ballots: sites.Ballots(q.Voters)})
	})
}

// replicatedPresence is presence as the API shows it: a box whose tunnel
// another replica holds is online.
type replicatedPresence struct {
	*presence.Tracker
	r *replication
}

func (p replicatedPresence) Presence(box string) presence.Status {
	st := p.Tracker.Presence(box)
	if p.r == nil {
		return st
	}
	if st.Online {
		st.Replica = p.r.set.Self().ID
	} else if r, ok := p.r.set.Holder(box); ok {
		st.Online, st.Replica = true, r.ID
	}
	return st
}

// forwarder is what the API forwards calls for other replicas' boxes
// with; nil (no forwarding) when the console runs alone.
func (r *replication) forwarder() httpapi.Replicas {
	if r == nil {
		return nil
	}
	return r.forward
}
