package console

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/edgebox/edgebox/console/apps"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/auth"
	"github.com/edgebox/edgebox/console/db"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/dist"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/httpapi"
	"github.com/edgebox/edgebox/console/keys"
	"github.com/edgebox/edgebox/console/pki"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/enroll"
	"github.com/edgebox/edgebox/images/registry"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/tunnel"
)

// Version is the console's version, set by the build.
var Version = "dev"

// CapabilityVersion is what this console understands of agents.
const CapabilityVersion = 1

// Config is the console's configuration.
type Config struct {
	// DataDir holds the CA, the database and everything else that must
	// survive a restart.
	DataDir string
	// Listen is the one public address, ":8443" by default.
	Listen string
	// Listener, when set, is the public port instead of a listener on
	// Listen: for socket activation, and for tests that make the port fail.
	// Run closes it when it returns.
	Listener net.Listener
	// PublicURL is how boxes and operators reach the console; it goes into
	// enrollment tokens. Default: https://<this host name>:<listen port>.
	PublicURL string
	// ExtraHosts are more names or addresses the serving certificate covers.
	ExtraHosts []string
	// BoxCertTTL is the lifetime of box certificates; boxes renew at two
	// thirds of it.
	BoxCertTTL time.Duration
	// Tunnel are the session settings.
	Tunnel tunnel.Config
	// HandshakeRate and HandshakeBurst limit new box sessions per second,
	// so 10,000 boxes returning at once do not take the API down with them.
	HandshakeRate  float64
	HandshakeBurst int
	// HandshakeTimeout bounds a TLS handshake from accept to its end,
	// against slowloris clients.
	HandshakeTimeout time.Duration
	// HelloTimeout bounds the wait from accept to a complete ClientHello
	// (never longer than HandshakeTimeout). Until its ClientHello is in, a
	// connection holds no handshake slot. It runs while the console is
	// busy too: at 5 s a 2,000-box storm on two loaded cores lost 125
	// boxes' connections to it (docs/benchmarks.md), so it is 10 s.
	HelloTimeout time.Duration
	// MaxHandshakes bounds handshakes in progress from clients that do not
	// offer the tunnel protocol (operators, enrolling boxes, registry
	// clients); MaxBoxHandshakes those from clients that do. Neither kind
	// can take the other's slots; past them a ClientHello is refused.
	MaxHandshakes    int
	MaxBoxHandshakes int
	// MaxConnsPerAddr bounds the connections one source address (an IPv6
	// /64) holds open on the public port, box sessions aside, and
	// MaxHandshakesPerAddr its handshakes in progress.
	MaxConnsPerAddr      int
	MaxHandshakesPerAddr int
	// MaxIdle bounds connections that have not sent their ClientHello.
	// Past it, or past MaxConnsPerAddr for one address, the oldest such
	// connection is closed to make room for the new one.
	MaxIdle int
	// Out receives the first-start message with the admin token.
	Out io.Writer
	// Clock tells the time for token expiry; nil is time.Now. Tests move it.
	Clock func() time.Time
	// DistDir holds the agent binaries and SHA256SUMS served at /dl/ to
	// installing boxes; empty is <DataDir>/dist.
	DistDir string
	// CompactEvery is how often the store forgets old history, keeping
	// the last KeepRevisions revisions for watches that lag.
	CompactEvery  time.Duration
	KeepRevisions int64
	// AppsSyncEvery is how often every box is checked against the app
	// pins, behind the syncs that deploys and hellos make at once.
	AppsSyncEvery time.Duration
}

// DefaultConfig returns the defaults; DataDir defaults to the user's data
// directory.
func DefaultConfig() Config {
	return Config{
		DataDir:          defaultDataDir(),
		Listen:           ":8443",
		BoxCertTTL:       30 * 24 * time.Hour,
		Tunnel:           tunnel.DefaultConfig(),
		HandshakeRate:    500,
		HandshakeBurst:   200,
		HandshakeTimeout: 10 * time.Second,
		HelloTimeout:     10 * time.Second,
		MaxHandshakes:    1024,
		MaxBoxHandshakes: 4096,
		Out:              os.Stdout,
		CompactEvery:     5 * time.Minute,
		KeepRevisions:    100_000,
		AppsSyncEvery:    time.Minute,
		// One address may be an office or a site's NAT with operators
		// and boxes behind it; boxes' sessions do not count.
		MaxConnsPerAddr:      256,
		MaxHandshakesPerAddr: 128,
		MaxIdle:              4096,
	}
}

func defaultDataDir() string {
	if d, err := os.UserConfigDir(); err == nil {
		return filepath.Join(d, "edgebox", "console")
	}
	return filepath.Join(os.TempDir(), "edgebox-console")
}

// Validate reports what is wrong with c.
func (c Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("data directory is required"))
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen address %q: %v", c.Listen, err))
	}
	if c.PublicURL != "" {
		if _, err := enroll.ParseConsoleURL(c.PublicURL); err != nil {
			errs = append(errs, fmt.Errorf("public URL: %v", err))
		}
	}
	if c.BoxCertTTL < 5*time.Second {
		errs = append(errs, errors.New("box certificate lifetime must be at least 5s"))
	}
	if c.HandshakeRate <= 0 || c.HandshakeBurst <= 0 || c.HandshakeTimeout <= 0 || c.HelloTimeout <= 0 ||
		c.MaxHandshakes <= 0 || c.MaxBoxHandshakes <= 0 {
		errs = append(errs, errors.New("handshake limits must be positive"))
	}
	if c.MaxConnsPerAddr <= 0 || c.MaxHandshakesPerAddr <= 0 || c.MaxIdle <= 0 {
		errs = append(errs, errors.New("MaxConnsPerAddr, MaxHandshakesPerAddr and MaxIdle must be positive"))
	}
	if c.CompactEvery <= 0 || c.KeepRevisions <= 0 || c.AppsSyncEvery <= 0 {
		errs = append(errs, errors.New("CompactEvery, KeepRevisions and AppsSyncEvery must be positive"))
	}
	if err := c.Tunnel.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Console is a running console's parts.
type Console struct {
	cfg     Config
	log     *slog.Logger
	reg     *prometheus.Registry
	metrics *tunnel.Metrics
	admit   *admission // the public port's books

	ready chan struct{} // closed when the port listens
	addr  net.Addr      // set before ready closes

	// Set up by Run, read after ready.
	fleet    *fleet.Fleet
	tunnel   *tunnel.Server
	presence *presence
	desired  *desired.State
}

// New validates cfg; it starts nothing.
func New(cfg Config, log *slog.Logger) (*Console, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("console config: %w", err)
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &Console{cfg: cfg, log: log.With("component", "console"), reg: reg,
		metrics: tunnel.NewMetrics(reg), admit: newAdmission(limitsOf(cfg), reg), ready: make(chan struct{})}, nil
}

// Ready is closed once the console listens; Addr is valid then.
func (c *Console) Ready() <-chan struct{} { return c.ready }

// Addr is the address the console listens on.
func (c *Console) Addr() net.Addr { return c.addr }

// Tunnel returns the tunnel server, valid after Ready.
func (c *Console) Tunnel() *tunnel.Server { return c.tunnel }

// Desired returns the boxes' desired state, valid after Ready.
func (c *Console) Desired() *desired.State { return c.desired }

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

// Run opens the data directory and serves until ctx ends or one of its
// services fails, then shuts down in order: no new connections, sessions
// dropped, database closed. It returns nil when ctx ended it, else the
// first failure.
func (c *Console) Run(ctx context.Context) error {
	if c.cfg.Listener != nil {
		defer c.cfg.Listener.Close()
	}
	bdb, err := db.Open(c.cfg.DataDir)
	if err != nil {
		return err
	}
	defer bdb.Close()
	ln := c.cfg.Listener
	if ln == nil {
		if ln, err = net.Listen("tcp", c.cfg.Listen); err != nil {
			return fmt.Errorf("console: listen on %s: %w", c.cfg.Listen, err)
		}
	}
	defer ln.Close()
	public := c.publicURL(ln)
	pu, _ := enroll.ParseConsoleURL(public)
	hosts := append([]string{pu.Hostname(), "localhost", "127.0.0.1", "::1"}, c.cfg.ExtraHosts...)
	if h, err := os.Hostname(); err == nil {
		hosts = append(hosts, h)
	}
	authority, created, err := pki.Open(filepath.Join(c.cfg.DataDir, "pki"), dedupe(hosts))
	if err != nil {
		return fmt.Errorf("console: PKI: %w", err)
	}
	if created {
		c.log.Info("created the console CA", "dir", filepath.Join(c.cfg.DataDir, "pki"))
	}
	if err := c.firstStart(bdb, authority, public); err != nil {
		return err
	}
	fl, err := fleet.New(bdb, c.cfg.Clock)
	if err != nil {
		return err
	}
	c.fleet = fl
	st, err := store.OpenBolt(bdb)
	if err != nil {
		return err
	}
	defer st.Close()
	auditLog := audit.New(st, c.cfg.Clock)
	c.desired = desired.New(st)

	srv, err := tunnel.NewServer(tunnel.ServerConfig{Config: c.cfg.Tunnel, Identify: c.identify}, c.log, c.metrics)
	if err != nil {
		return err
	}
	c.tunnel = srv
	c.presence = newPresence(srv, fl, c.cfg.Tunnel, c.log)

	// gRPC's 32 KiB read buffer per connection would be most of an idle
	// box's cost; tunnel streams are buffered already. The write buffer is
	// shared and released after each flush.
	rpc := grpc.NewServer(grpc.MaxRecvMsgSize(1<<20), grpc.ReadBufferSize(0), grpc.SharedWriteBuffer(true))
	reg, err := registry.Open(ctx, filepath.Join(c.cfg.DataDir, "registry"), c.log)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	defer reg.Close()
	registryHosts := dedupe([]string{pu.Host, enroll.HostPort(pu)})
	boxRegistry := boxRegistryServer(reg, c.desired, registryHosts)
	catalogue := apps.New(st, c.desired, fl, reg, registryHosts, c.log)

	edgeboxv1.RegisterConsoleServiceServer(rpc, &consoleService{fleet: fl, pki: authority, ttl: c.cfg.BoxCertTTL,
		log: c.log, presence: c.presence, apps: catalogue})
	keyRegistry := keys.New(st, c.desired)
	catalogue.LeaseKeysWith(keyRegistry)
	syncs := newSyncServer(c.desired, fl.IsApproved, func(ctx context.Context, box string, st *edgeboxv1.SyncStatus) error {
		return keyReports(ctx, fl, keyRegistry, box, st)
	}, c.log)
	srv.OnSession = func(ev tunnel.SessionEvent) {
		c.presence.onSession(ev)
		if !ev.Up {
			syncs.sessionEnded(ev.BoxID, ev.Session)
		}
	}

	distDir := c.cfg.DistDir
	if distDir == "" {
		distDir = filepath.Join(c.cfg.DataDir, "dist")
	}
	downloads, err := dist.Open(distDir)
	if err != nil {
		return fmt.Errorf("console: downloads in %s: %w", distDir, err)
	}
	if len(downloads.Files()) == 0 {
		c.log.Info("no agent binaries to serve; boxes cannot install with the pasted command until 'make dist' output is in the downloads directory", "dir", distDir)
	}

	handler := httpapi.New(httpapi.Deps{
		Fleet: fl, Audit: auditLog, Tokens: auth.New(bdb), PKI: authority, Sessions: c.presence, Desired: c.desired, Downloads: downloads,
		Registry: reg, RegistryHosts: registryHosts, Apps: catalogue, Agents: agents{c}, Keys: keyRegistry,
		ConsoleURL: public, BoxCertTTL: c.cfg.BoxCertTTL, Log: c.log,
		Metrics: promhttp.HandlerFor(c.reg, promhttp.HandlerOpts{}),
	})
	p := newPort(ln, authority, srv, c.admit, c.cfg, c.log)
	hs := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: c.cfg.HandshakeTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(c.log.Handler(), slog.LevelDebug),
	}

	c.addr = ln.Addr()
	close(c.ready)
	c.log.Info("console up", "listen", ln.Addr().String(), "url", public, "data", c.cfg.DataDir)

	// The services run under one group. The first to fail ends the
	// group's context, as the end of ctx does; a service that stops after
	// that was asked to (http.ErrServerClosed, grpc.ErrServerStopped,
	// net.ErrClosed), and its result is not a failure. Then they stop in
	// this order, each once the one before no longer hands it work:
	//  1. the public port stops accepting (ln.Close), and the API drains
	//     its requests for up to 5 s;
	//  2. the box registry and the agent RPC stop serving tunnel streams;
	//  3. the tunnel server says goodbye to every box and drops its session
	//     (its stream listeners close, which ends the sync server);
	//  4. connection handlers, the hub, presence, compaction and app sync
	//     end with the group's context; presence writes its last times;
	//  5. on return, the registry, the store and the database close
	//     (deferred above).
	// Run returns the first failure, or nil when ctx ended it.
	g, gctx := errgroup.WithContext(ctx)
	failed := func(what string, err error) error {
		if gctx.Err() != nil {
			return nil // asked to stop, or stopped after another's failure
		}
		if err == nil {
			err = errors.New("stopped by itself")
		}
		return fmt.Errorf("console: %s: %w", what, err)
	}
	loop := func(f func(context.Context)) { g.Go(func() error { f(gctx); return nil }) }
	desiredChanges := syncs.hub.watch(gctx, st) // before any Sync stream can start
	loop(func(ctx context.Context) { syncs.hub.run(ctx, st, desiredChanges, c.log) })
	g.Go(func() error { return failed("public port", p.serve(gctx)) })
	g.Go(func() error {
		err := hs.Serve(p.http)
		if errors.Is(err, net.ErrClosed) {
			return nil // the port stopped handing connections; its result says why
		}
		return failed("HTTP API", err)
	})
	g.Go(func() error { return failed("agent RPC", rpc.Serve(srv.Listen(tunnel.KindRPC))) })
	g.Go(func() error { return failed("box registry", boxRegistry.Serve(srv.Listen(tunnel.KindRegistry))) })
	loop(func(ctx context.Context) { syncs.serve(ctx, srv.Listen(tunnel.KindSync)) })
	loop(c.presence.run)
	loop(func(ctx context.Context) { compactLoop(ctx, st, c.cfg.CompactEvery, c.cfg.KeepRevisions, c.log) })
	loop(func(ctx context.Context) { appsLoop(ctx, catalogue, c.cfg.AppsSyncEvery, c.log) })

	<-gctx.Done()
	ln.Close()
	shutdownCtx, done := context.WithTimeout(context.Background(), 5*time.Second)
	hs.Shutdown(shutdownCtx)
	done()
	boxRegistry.Close()
	rpc.Stop()
	srv.Close()
	p.wait()
	err = g.Wait()
	c.presence.flush()
	if err != nil {
		c.log.Error("console stopped", "err", err)
		return err
	}
	c.log.Info("console stopped")
	return nil
}

// firstStart creates the admin API token when there is none and prints it
// once, with the CA fingerprint operators pin.
func (c *Console) firstStart(bdb *bolt.DB, a *pki.Authority, public string) error {
	toks := auth.New(bdb)
	anyTok, err := toks.Any()
	if err != nil || anyTok {
		return err
	}
	text, err := toks.Create(auth.APIToken{Name: "admin", TenantID: fleet.DefaultTenant, Role: "admin", CreatedAt: time.Now().UTC()})
	if err != nil {
		return err
	}
	h := a.CAHash()
	fmt.Fprintf(c.cfg.Out, `edgebox console initialised in %s
  console URL:  %s
  CA sha256:    %x
  admin token:  %s
This token is shown once. Log in with:
  edgebox login %s --token %s --ca-sha256 %x
`, c.cfg.DataDir, public, h, text, public, text, h)
	return nil
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
