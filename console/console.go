package console

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/edgebox/edgebox/console/admission"
	"github.com/edgebox/edgebox/console/agentrel"
	"github.com/edgebox/edgebox/console/agentrpc"
	"github.com/edgebox/edgebox/console/alerts"
	"github.com/edgebox/edgebox/console/apps"
	"github.com/edgebox/edgebox/console/appsync"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/auth"
	"github.com/edgebox/edgebox/console/boxregistry"
	"github.com/edgebox/edgebox/console/boxsync"
	"github.com/edgebox/edgebox/console/boxvitals"
	"github.com/edgebox/edgebox/console/db"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/dist"
	"github.com/edgebox/edgebox/console/events"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/gcpace"
	"github.com/edgebox/edgebox/console/httpapi"
	"github.com/edgebox/edgebox/console/keys"
	"github.com/edgebox/edgebox/console/leader"
	"github.com/edgebox/edgebox/console/pki"
	"github.com/edgebox/edgebox/console/port"
	"github.com/edgebox/edgebox/console/presence"
	"github.com/edgebox/edgebox/console/rollout"
	"github.com/edgebox/edgebox/console/sessions"
	"github.com/edgebox/edgebox/console/sitehealth"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/console/usbbroker"
	"github.com/edgebox/edgebox/console/webui"
	"github.com/edgebox/edgebox/enroll"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/images/registry"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/tunnel"
)

// Version is the console's version, set by the build.
var Version = "dev"

// CapabilityVersion is what this console understands of agents.
const CapabilityVersion = 1

// Console is the whole console: every part, built and wired by New, run
// by Run.
type Console struct {
	cfg   Config
	log   *slog.Logger
	addr  net.Addr
	ready chan struct{} // closed when Run serves

	// The parts, set by New and never changed.
	tunnel  *tunnel.Server
	desired *desired.State
	agents  *agentrpc.Agents
	// The services Run runs, with the HTTP API the port feeds.
	port      *port.Port
	api       *http.Server
	rpc       *agentrpc.Server
	sites     *sitehealth.Service
	registry  *boxregistry.Server
	usb       *usbbroker.Broker // UKEYs carried between boxes
	sync      *boxsync.Server
	fleet     *fleet.Fleet
	presence  *presence.Tracker
	compactor *store.Compactor
	appsync   *appsync.Loop
	apps      *apps.Apps
	releases  *agentrel.Service
	admission *admission.Controller
	gcpace    *gcpace.Pacer
	remote    *sessions.Broker
	users     *auth.Users
	events    *events.Hub
	rollouts  *rollout.Service
	alerts    *alerts.Service
	elect     leader.Elector // who runs the once-only controllers
	repl      *replication   // nil unless the console is one of several replicas

	mu      sync.Mutex     // guards state and closers
	state   lifecycle      //
	closers []func() error // what New opened, in order; closed last first
}

// lifecycle is where a Console stands: built by New, running, or done
// (Run returned or Close released it).
type lifecycle int

const (
	built lifecycle = iota
	running
	done
)

// New validates cfg, opens what the console keeps (the data directory's
// database and store, its PKI and registry, in the shared directory when
// there is one, and the public port's listener) and builds every part on
// them. It starts nothing: Run serves, and releases everything when it
// returns; a Console that is never run is released by Close. When New
// fails, it releases what it opened.
func New(cfg Config, log *slog.Logger) (_ *Console, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("console config: %w", err)
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	c := &Console{cfg: cfg, log: log.With("component", "console"), ready: make(chan struct{})}
	defer func() {
		if err != nil {
			c.release()
		}
	}()
	// What New opens is files, under DataDir and SharedDir, and a
	// listener; the store on etcd is dialled with its own deadline.
	ctx := context.Background()
	shared := cfg.DataDir // what replicas share: the CA, registry, agent releases, recordings
	if cfg.SharedDir != "" {
		shared = cfg.SharedDir
		if err := os.MkdirAll(shared, 0o700); err != nil {
			return nil, fmt.Errorf("console: shared directory: %w", err)
		}
	}
	if cfg.Listener != nil {
		c.opened(cfg.Listener.Close)
	}
	ln := cfg.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", cfg.Listen); err != nil {
			return nil, fmt.Errorf("console: listen on %s: %w", cfg.Listen, err)
		}
		c.opened(ln.Close)
	}
	c.addr = ln.Addr()
	public := c.publicURL(ln)
	pu, _ := enroll.ParseConsoleURL(public)
	hosts := append([]string{pu.Hostname(), "localhost", "127.0.0.1", "::1"}, cfg.ExtraHosts...)
	// A box checks the name of the address it dialled: the serving
	// certificate covers the replicas' other addresses too.
	for _, a := range cfg.AlsoAddrs {
		if h, _, err := net.SplitHostPort(a); err == nil {
			hosts = append(hosts, h)
		}
	}
	if h, err := os.Hostname(); err == nil {
		hosts = append(hosts, h)
	}
	// Consoles sharing the directory open the PKI one at a time: the
	// first makes the CA and the serving key, and all serve with them.
	authority, created, err := pki.Open(filepath.Join(shared, "pki"), dedupe(hosts))
	if err != nil {
		return nil, fmt.Errorf("console: PKI: %w", err)
	}
	if created {
		c.log.Info("created the console CA", "dir", filepath.Join(shared, "pki"))
	}
	st, err := c.openStore(ctx)
	if err != nil {
		return nil, err
	}
	promReg := prometheus.NewRegistry()
	promReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	c.elect = leader.Alone{}
	if es, ok := st.(*store.Etcd); ok {
		es.Observe(c.log.With("component", "store"), promReg)
		// Consoles sharing the cluster run the once-only controllers one
		// at a time; a dead leader's lease ends within 10 s.
		if c.elect, err = leader.NewEtcd(es.Client(), es.Prefix(), consoleID(public), 10*time.Second, promReg, c.log.With("component", "leader")); err != nil {
			return nil, err
		}
	}

	// The records: users, fleet, API tokens, audit log, all on the store.
	tokens := auth.New(st)
	now := cfg.Clock
	if now == nil {
		now = time.Now
	}
	c.users = auth.NewUsers(st, auth.NewHasher(auth.DefaultHashParams, runtime.GOMAXPROCS(0), 5*time.Second), now)
	if err := c.firstStart(ctx, tokens, c.users, authority, public); err != nil {
		return nil, err
	}
	fl, err := fleet.New(ctx, st, cfg.Clock)
	if err != nil {
		return nil, err
	}
	auditLog := audit.New(st, cfg.Clock)

	regCfg := registry.DefaultConfig(filepath.Join(shared, "registry"))
	if cfg.RegistryS3 != "" {
		if regCfg.S3, err = registry.ParseS3URL(cfg.RegistryS3); err != nil {
			return nil, fmt.Errorf("console: %w", err)
		}
		c.log.Info("registry images in a bucket", "bucket", regCfg.S3.String())
	}
	reg, err := registry.New(ctx, regCfg, c.log)
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	c.opened(reg.Close)
	registryHosts := dedupe([]string{pu.Host, enroll.HostPort(pu)})
	distDir := cfg.DistDir
	if distDir == "" {
		distDir = filepath.Join(cfg.DataDir, "dist")
	}
	downloads, err := dist.Open(distDir)
	if err != nil {
		return nil, fmt.Errorf("console: downloads in %s: %w", distDir, err)
	}
	if len(downloads.Files()) == 0 {
		c.log.Info("no agent binaries to serve; boxes cannot install with the pasted command until 'make dist' output is in the downloads directory", "dir", distDir)
	}

	// The domain: desired state, keys, apps.
	c.desired = desired.New(st)
	keyRegistry := keys.New(st, c.desired)
	catalogue := apps.New(st, c.desired, fl, reg, registryHosts, keyRegistry, c.log)
	c.apps = catalogue

	// The tunnel server tells presence and the sync server of sessions.
	// Both are set below, and sessions come only once Run serves.
	// Web pages hear what changed; at most 256 open at once.
	c.events = events.NewHub(st, fl.BoxByID, 256, c.log)
	var pres *presence.Tracker
	var syncs *boxsync.Server
	var repl *replication // set below, for a console among replicas
	// A box is online when its tunnel is up here or on another replica.
	online := func(id string) bool { return pres.Online(id) || repl.held(id) }
	// Box sessions start at the pace the console completes them.
	admCfg := cfg.Admission
	if admCfg.RateFile == "" {
		admCfg.RateFile = filepath.Join(cfg.DataDir, "admission-rate")
	}
	if c.admission, err = admission.New(admCfg, promReg, c.log); err != nil {
		return nil, err
	}
	if c.gcpace, err = gcpace.New(cfg.GCPace, c.admission.HeldBack, c.log); err != nil {
		return nil, err
	}
	// Site health hears the boxes' votes, checked against the keys their
	// tunnels came with.
	// Among replicas, it gathers the votes that reached the others.
	sitesCfg := sitehealth.ServiceConfig{Boxes: fl, Desired: c.desired,
		Online: online, Tenants: c.tenantIDs, Now: cfg.Clock,
		Tally: sitehealth.Config{Period: cfg.SitePeriod}, Metrics: promReg,
		Log: c.log.With("component", "sitehealth")}
	if _, etcd := st.(*store.Etcd); etcd && cfg.ReplicaListen != "" {
		sitesCfg.Others = func(ctx context.Context, voters []string) ([]sitehealth.Ballot, error) {
			return repl.ballots(ctx, voters)
		}
	}
	sites := sitehealth.NewService(sitesCfg)
	identify := presence.Identify(fl)
	srv, err := tunnel.NewServer(tunnel.ServerConfig{Config: cfg.Tunnel,
		Identify: func(cs tls.ConnectionState) (string, error) {
			id, err := identify(cs)
			if err == nil {
				sites.Identified(id, cs.PeerCertificates[0])
			}
			return id, err
		},
		Admit: c.admission.Admit,
		OnSession: func(ev tunnel.SessionEvent) {
			pres.OnSession(ev)
			repl.onSession(ev)
			c.events.BoxChanged(ev.BoxID)
			if !ev.Up {
				syncs.SessionEnded(ev.BoxID, ev.Session)
				if !ev.Replaced { // a box on a newer session is still in flight
					c.admission.SessionEnded(ev.BoxID)
				}
			}
		}}, c.log, tunnel.NewMetrics(promReg))
	if err != nil {
		return nil, err
	}
	c.opened(srv.Close)
	// A box revoked, here or by another replica, loses the tunnel it has;
	// one asked to wipe itself keeps it until the console that asked has
	// its answer, and that console ends it then.
	fl.OnRevoked = func(id string) {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if b, err := fl.BoxByID(ctx, id); err == nil && b.Wipe != nil && b.Wipe.Result == fleet.WipeAsked {
				return
			}
			srv.Drop(id)
		}()
	}
	if es, ok := st.(*store.Etcd); ok {
		if repl, err = c.replicate(ctx, es, authority, srv, public, promReg); err != nil {
			return nil, err
		}
	}
	c.repl = repl
	pres = presence.New(srv, fl, cfg.Tunnel, c.log)
	syncs = boxsync.New(boxsync.Config{Desired: c.desired, Approved: fl.IsApproved, Status: boxsync.KeyReports(fl, keyRegistry),
		CaughtUp: c.admission.CaughtUp, Before: cfg.Hooks.BeforeSync, Listener: srv.Listen(tunnel.KindSync), Now: cfg.Clock, Log: c.log})
	promReg.MustRegister(syncs.Metrics())
	c.tunnel, c.fleet, c.presence, c.sync = srv, fl, pres, syncs
	c.agents = agentrpc.NewAgents(srv)
	agents, err := agentrel.New(st, filepath.Join(shared, "agent-releases"), authority.SignRelease, c.desired, fl, c.log)
	if err != nil {
		return nil, fmt.Errorf("console: agent releases: %w", err)
	}
	c.releases = agents
	c.sites = sites
	vitals := boxvitals.New()
	c.rpc = agentrpc.NewServer(agentrpc.Config{Fleet: fl, PKI: authority, Apps: catalogue, Agents: agents, Sites: sites, Vitals: vitals, BoxCertTTL: cfg.BoxCertTTL,
		Rejoin:  func() time.Duration { return c.admission.Rejoin(srv.Len()) },
		Version: Version, CapabilityVersion: CapabilityVersion, BeforeHello: cfg.Hooks.BeforeHello}, srv.Listen(tunnel.KindRPC), c.log)
	c.registry = boxregistry.New(reg, c.desired, registryHosts, agents, srv.Listen(tunnel.KindRegistry), c.log)
	promReg.MustRegister(c.registry.Metrics())
	c.usb = usbbroker.New(usbbroker.Config{Keys: keyRegistry, Boxes: fl.BoxByID, Tunnel: repl.opener(srv), Listener: srv.Listen(tunnel.KindUSBIP),
		Log: c.log.With("component", "usbbroker")})
	if c.compactor, err = store.NewCompactor(st, cfg.CompactEvery, cfg.KeepRevisions, c.log); err != nil {
		return nil, err
	}
	if c.appsync, err = appsync.New(catalogue, c.tenantIDs, cfg.AppsSyncEvery, c.log, agents.SyncAll); err != nil {
		return nil, err
	}

	// The public port, and the HTTP API behind it.
	c.rollouts = rollout.New(rollout.Config{Store: st, Apps: catalogue, Agent: agents, Boxes: fl, Desired: c.desired,
		Online: online, LineDown: sites.LineDown, Every: cfg.RolloutEvery, Now: cfg.Clock, Log: c.log})
	promReg.MustRegister(c.rollouts.Collector())

	c.alerts, err = alerts.New(alerts.Config{Store: st, Tenants: c.tenantIDs,
		Facts: alerts.Facts{Boxes: fl.Boxes, Health: sites.Health, Statuses: c.desired.Statuses, Rollouts: c.rollouts.List,
			Keys: func(ctx context.Context, tenant string) ([]keys.Key, error) {
				return keyRegistry.List(ctx, tenant, keys.Filter{})
			}},
		Every: cfg.AlertEvery, RetryMin: cfg.AlertRetryMin, ConsoleURL: public, Now: cfg.Clock, Metrics: promReg,
		Log: c.log.With("component", "alerts")})
	if err != nil {
		return nil, err
	}

	remoteCfg := sessions.Config{Store: st, Agents: c.agents, Tunnel: srv, Dir: filepath.Join(shared, "recordings"),
		IdleTimeout: cfg.SessionIdleTimeout, MaxDuration: cfg.SessionMaxDuration, Now: cfg.Clock, Log: c.log}
	if repl != nil {
		// A replica starting ends only its own records left open, and
		// those of replicas that stopped; the others' sessions run on.
		remoteCfg.Replica, remoteCfg.Replicas = repl.set.Self().ID, repl.set.IDs
	}
	c.remote = sessions.New(remoteCfg)
	promReg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "edgebox", Subsystem: "remote", Name: "sessions",
		Help: "Remote maintenance sessions (shells, screens, port forwards, file copies) open now."}, func() float64 { return float64(c.remote.Live()) }))

	if c.port, err = port.New(ln, authority, srv, c.admission, cfg.Config, promReg, c.log); err != nil {
		return nil, err
	}
	c.api = &http.Server{
		Handler: httpapi.New(httpapi.Deps{
			Fleet: fl, Audit: auditLog, Tokens: tokens, Users: c.users, SessionTTL: cfg.SessionTTL,
			Throttle: auth.NewThrottle(auth.DefaultThrottleConfig, now), PKI: authority, Sessions: replicatedPresence{pres, repl}, Replicas: repl.forwarder(), Sites: sites, Vitals: vitals, Desired: c.desired, Downloads: downloads,
			Registry: reg, RegistryHosts: registryHosts, Apps: catalogue, Agents: c.agents, Keys: keyRegistry, Rollouts: c.rollouts, AgentReleases: agents,
			RemoteSessions: c.remote, Alerts: c.alerts, Latency: httpapi.NewLatency(promReg),
			ConsoleURL: public, ConsoleAlso: cfg.AlsoAddrs, BoxCertTTL: cfg.BoxCertTTL, Log: c.log,
			Metrics: promhttp.HandlerFor(promReg, promhttp.HandlerOpts{}), WebUI: webui.Handler(), Events: c.events,
		}),
		ReadHeaderTimeout: cfg.HandshakeTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(c.log.Handler(), slog.LevelDebug),
	}
	return c, nil
}

// openStore opens the store cfg.Store names: the bbolt database in the
// data directory (with what older consoles kept beside it moved in), or
// the etcd cluster, which must answer within 10 s.
func (c *Console) openStore(ctx context.Context) (store.Store, error) {
	if c.cfg.Store != "" {
		t, err := store.ParseEtcdURL(c.cfg.Store)
		if err != nil {
			return nil, err
		}
		st, err := store.DialEtcd(ctx, t, 10*time.Second)
		if err != nil {
			return nil, fmt.Errorf("console: %w", err)
		}
		c.opened(st.Close)
		c.log.Info("the console's records are on etcd", "endpoints", strings.Join(t.Endpoints, ","), "prefix", t.Prefix)
		return st, nil
	}
	bdb, err := db.Open(c.cfg.DataDir)
	if err != nil {
		return nil, err
	}
	c.opened(bdb.Close)
	st, err := store.OpenBolt(bdb)
	if err != nil {
		return nil, err
	}
	c.opened(st.Close)
	return st, db.MoveToStore(ctx, bdb, st)
}

// consoleID names this console in its leader elections: its public URL,
// host and process.
func consoleID(public string) string {
	h, _ := os.Hostname()
	return fmt.Sprintf("%s (%s, pid %d)", public, h, os.Getpid())
}

// Ready is closed once Run serves.
func (c *Console) Ready() <-chan struct{} { return c.ready }

// Addr is the address the console listens on.
func (c *Console) Addr() net.Addr { return c.addr }

// Tunnel returns the tunnel server.
func (c *Console) Tunnel() *tunnel.Server { return c.tunnel }

// Desired returns the boxes' desired state.
func (c *Console) Desired() *desired.State { return c.desired }

// PingAgent calls a box's AgentService.Ping: a full round trip through the
// tunnel, the agent's gRPC server and back.
func (c *Console) PingAgent(ctx context.Context, boxID string, payload []byte) (*edgeboxv1.PingResponse, error) {
	return c.agents.Ping(ctx, boxID, payload)
}

// Run serves until ctx ends or one of its services fails, then stops them
// in order and releases what New opened. It returns nil when ctx ended it,
// else the first failure. A Console runs once.
func (c *Console) Run(ctx context.Context) error {
	if err := c.begin(); err != nil {
		return err
	}
	defer c.release()

	// The services run under one group. The first to fail ends the
	// group's context, as the end of ctx does. Then they stop in stages,
	// each stage once the one before no longer hands it work:
	//  1. the public port stops accepting and closes its listener, its
	//     handshakes in progress end, and the HTTP API drains its
	//     requests for up to 5 s;
	//  2. the agent RPC, the box registry, the UKEY broker and the sync
	//     server stop serving tunnel streams (the sync server closes
	//     every box's stream, and its hub stops watching; the broker
	//     cuts the keys it carries);
	//  3. the tunnel server says goodbye to every box and drops its
	//     session;
	//  4. the fleet's revocation watch, presence, compaction, app sync,
	//     the watches of app catalogues and agent pins, rollouts and
	//     alerts end; presence writes the last-seen times of
	//     the sessions that ended;
	//  5. on return, what New opened closes: the tunnel server's
	//     listeners, the registry, the store, the database, the listener.
	// A service returns nil when its stage's context ends; returning
	// before that, with nil or an error, is a failure. Run returns the
	// first failure, or nil when ctx ended it.
	g, gctx := errgroup.WithContext(ctx)
	edge, streams, loops := newStage(), newStage(), newStage()
	start := func(s *stage, what string, run func(context.Context) error) {
		s.wg.Add(1)
		g.Go(func() error {
			defer s.wg.Done()
			err := run(s.ctx)
			if err == nil && s.ctx.Err() == nil {
				err = errors.New("stopped by itself")
			}
			if err != nil {
				return fmt.Errorf("console: %s: %w", what, err)
			}
			return nil
		})
	}
	// Before the first box or operator is served: see Warm.
	warmCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	if err := c.sites.Warm(warmCtx); err != nil && ctx.Err() == nil {
		c.log.Warn("the boxes' sites not read at the start; the first hellos and calls read them", "err", err)
	}
	cancel()
	close(c.ready)
	c.log.Info("console up", "listen", c.addr.String(), "data", c.cfg.DataDir, "shared", c.cfg.SharedDir)
	start(edge, "public port", c.port.Run)
	start(edge, "HTTP API", c.serveAPI)
	start(edge, "remote sessions", c.remote.Run)
	if c.repl != nil {
		// The other replicas forward calls for this one's boxes until its
		// tunnels are closed (stage 3), so it stops with the loops.
		start(loops, "replica listener", func(ctx context.Context) error { return c.repl.serve(ctx, c.api.Handler, c.sites) })
	}
	start(streams, "agent RPC", c.rpc.Run)
	start(streams, "box registry", c.registry.Run)
	start(streams, "UKEY broker", c.usb.Run)
	start(streams, "sync server", c.sync.Run)
	start(loops, "fleet", c.fleet.Run)
	start(loops, "presence", c.presence.Run)
	// The controllers that must run once among consoles sharing a store
	// run where this console leads.
	once := func(name string, run func(context.Context) error) func(context.Context) error {
		return func(ctx context.Context) error { return c.elect.Lead(ctx, name, run) }
	}
	start(loops, "compaction", once("compaction", c.compactor.Run))
	start(loops, "app sync", once("app-sync", c.appsync.Run))
	start(loops, "app catalogues", c.apps.Run)
	start(loops, "agent pins", c.releases.Run)
	start(loops, "site peers", c.sites.Run)
	start(loops, "rollouts", once("rollouts", c.rollouts.Run))
	start(loops, "alerts", once("alerts", c.alerts.Run))
	start(loops, "admission", c.admission.Run)
	start(loops, "gc pace", c.gcpace.Run)
	start(loops, "events", c.events.Run)
	start(loops, "session sweep", func(ctx context.Context) error { return c.users.RunSweeper(ctx, 10*time.Minute, c.log) })

	<-gctx.Done()
	edge.stop()
	streams.stop()
	c.tunnel.Close()
	loops.stop()
	err := g.Wait()
	flushCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	c.presence.Flush(flushCtx)
	cancel()
	if err != nil {
		c.log.Error("console stopped", "err", err)
		return err
	}
	c.log.Info("console stopped")
	return nil
}

// Close releases what New opened, for a Console that never ran; after
// Run it does nothing. It is an error while Run runs: end Run's context.
func (c *Console) Close() error {
	c.mu.Lock()
	state := c.state
	c.mu.Unlock()
	if state == running {
		return errors.New("console: Close while Run runs; end Run's context instead")
	}
	return c.release()
}

// begin marks the Console running, once.
func (c *Console) begin() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != built {
		return errors.New("console: Run after Run or Close; a Console runs once")
	}
	c.state = running
	return nil
}

// opened notes something New opened, for release to close.
func (c *Console) opened(close func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closers = append(c.closers, close)
}

// release closes what New opened, last first, once.
func (c *Console) release() error {
	c.mu.Lock()
	closers := c.closers
	c.closers, c.state = nil, done
	c.mu.Unlock()
	var errs []error
	for i := len(closers) - 1; i >= 0; i-- {
		if err := closers[i](); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// stage is a set of services that stop together.
type stage struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newStage() *stage {
	ctx, cancel := context.WithCancel(context.Background())
	return &stage{ctx: ctx, cancel: cancel}
}

// stop ends the stage's context and waits for its services.
func (s *stage) stop() {
	s.cancel()
	s.wg.Wait()
}

// serveAPI serves the HTTP API on the port's HTTP connections until ctx
// ends, then drains its requests for up to 5 s.
func (c *Console) serveAPI(ctx context.Context) error {
	served := make(chan error, 1)
	go func() { served <- c.api.Serve(c.port.HTTP()) }()
	returned := false
	select {
	case err := <-served:
		if !errors.Is(err, net.ErrClosed) {
			c.api.Close()
			return err
		}
		// The port stopped handing connections on; its own result says
		// why. The API drains what it has when its stage stops.
		returned = true
		<-ctx.Done()
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.api.Shutdown(shutdownCtx); err != nil {
		c.api.Close()
	}
	if !returned {
		<-served
	}
	return nil
}

func (c *Console) publicURL(ln net.Listener) string {
	if c.cfg.PublicURL != "" {
		return strings.TrimRight(c.cfg.PublicURL, "/")
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	host, _, _ := net.SplitHostPort(c.cfg.Listen)
	if host == "" || host == "0.0.0.0" || host == "::" {
		if h, err := os.Hostname(); err == nil && h != "" {
			host = h
		} else {
			host = "localhost"
		}
	}
	return "https://" + net.JoinHostPort(host, port)
}

// tenantIDs lists every tenant's ID.
func (c *Console) tenantIDs(ctx context.Context) ([]string, error) {
	ts, err := c.users.Tenants(ctx)
	ids := make([]string, len(ts))
	for i, t := range ts {
		ids[i] = t.ID
	}
	return ids, err
}

// firstStart creates the admin user when there is none, with a random
// password, and on a new console an API token of that user; it prints
// them once, with the CA fingerprint operators pin. A console from before
// users keeps its tokens, and gains the admin user.
//
// It prints before it stores: killed after printing, the next start finds
// no user and prints new credentials; killed after storing, they were
// printed. Storing first would leave, killed before the print, an admin
// whose password nobody has. Of consoles that share a store and start at
// once, one stores its admin user; the others find it made and say that
// what they printed was not stored.
func (c *Console) firstStart(ctx context.Context, toks *auth.Tokens, users *auth.Users, a *pki.Authority, public string) error {
	anyUser, err := users.Any(ctx)
	if err != nil || anyUser {
		return err
	}
	anyTok, err := toks.Any(ctx)
	if err != nil {
		return err
	}
	pw := make([]byte, 15)
	rand.Read(pw)
	password := base64.RawURLEncoding.EncodeToString(pw)
	h := a.CAHash()
	text := auth.NewTokenText()
	if anyTok {
		fmt.Fprintf(c.cfg.Out, `edgebox console: users arrived; the admin user was made
  user:      admin
  password:  %s
This password is shown once; change it with 'edgebox user passwd admin'.
`, password)
	} else {
		fmt.Fprintf(c.cfg.Out, `edgebox console initialised in %s
  console URL:  %s
  CA sha256:    %x
  admin user:   admin
  password:     %s
  admin token:  %s
The password and token are shown once. Open %s in a browser, or log in with:
  edgebox login %s --token %s --ca-sha256 %x
`, c.cfg.DataDir, public, h, password, text, public, public, text, h)
	}
	by := audit.Actor{TenantID: auth.ConsoleTenant, Name: "console"}
	admin, err := users.Create(ctx, by, "admin", password, auth.ConsoleTenant, auth.Admin)
	if errors.Is(err, errdefs.ErrConflict) {
		// Another console on the store, started at the same time, made
		// the admin user first and printed its credentials.
		fmt.Fprintf(c.cfg.Out, "edgebox console: another console on this store made the admin user at the same time and printed its password and token; the ones above were not stored.\n")
		return nil
	}
	if err != nil {
		return err
	}
	if anyTok {
		return nil
	}
	// Killed before this, the console starts without the printed token;
	// the printed password logs in and makes one.
	return toks.Store(ctx, text, auth.APIToken{Name: "admin", User: "admin", UserID: admin.ID, CreatedAt: time.Now().UTC()})
}

func dedupe(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if s != "" && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
