// Package agent is the box side of edgebox: enrollment, the tunnel to the
// console, the agent's gRPC service, certificate renewal and the status it
// reports. It never imports the console.
package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/edgebox/edgebox/agent/files"
	"github.com/edgebox/edgebox/agent/forward"
	"github.com/edgebox/edgebox/agent/localstore"
	"github.com/edgebox/edgebox/agent/locks"
	"github.com/edgebox/edgebox/agent/reconcile"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/session"
	"github.com/edgebox/edgebox/agent/sitepeer"
	"github.com/edgebox/edgebox/enroll"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/errdefs/errgrpc"
	"github.com/edgebox/edgebox/images/pull"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/tunnel"
	"github.com/edgebox/edgebox/usbhub"
)

// CapabilityVersion grows by one whenever the agent learns something the
// console must know about before using it. 2: image prefetches, update
// locks. 3: keys used from other boxes (UsbAssignment's export_to and
// import_from, the usbip stream kind). 4: site peers and votes (the
// SitePeers object, ConsoleService.Vote).
const CapabilityVersion = 4

// Config is the agent's configuration.
type Config struct {
	DataDir string
	Version string
	Tunnel  tunnel.Config
	// Proxy, Dial and Backoff are passed to the tunnel; nil/zero use its
	// defaults (HTTPS_PROXY, net.Dialer, 1 s to 60 s). ProxySource names
	// the setting Proxy came from, for errors (tunnel.ClientConfig).
	Proxy       tunnel.ProxyFunc
	ProxySource string
	Dial        func(ctx context.Context, network, addr string) (net.Conn, error)
	Backoff     tunnel.Backoff
	// Rejoin is the box's own rejoin window (tunnel.ClientConfig); the
	// console may advise a longer one. Zero uses tunnel.DefaultRejoin.
	Rejoin time.Duration
	// Renew says when the tunnel session is replaced by a fresh one after
	// it carried bulk data (tunnel.Renewal).
	Renew tunnel.Renewal
	// PendingRecheck is how often a box in the waiting room asks again
	// whether it was approved.
	PendingRecheck time.Duration
	// RenewRetry is the wait after a failed certificate renewal.
	RenewRetry time.Duration
	// RPCIdle is how long the agent's gRPC connection to the console stays
	// open without calls.
	RPCIdle time.Duration
	// SyncRetry is the wait before a broken Sync stream is opened again.
	SyncRetry time.Duration
	// HelloTimeout is how long the agent waits for the console to answer
	// its hello before it asks again.
	HelloTimeout time.Duration
	// UpAnswerTimeout is how long the agent waits for the console to
	// answer a stream of acks and status before it sends them again.
	UpAnswerTimeout time.Duration
	// Drivers run workloads, one per runtime; none means the box runs no
	// workloads and reports each as failed.
	Drivers []runtime.Driver
	// Reconcile is the time between reconcile passes when nothing changes.
	Reconcile time.Duration
	// USB is the box's USB inventory (sysfs, or a simulated hub); nil
	// means the box reports no keys. USBPoll is how often it is read.
	USB     usbhub.Hub
	USBPoll time.Duration
	// USBDevRoot is where the box's USB device nodes are,
	// /dev/bus/usb unless set.
	USBDevRoot string
	// KeyServer is where keys of other boxes leased to this box's
	// containers and programs are offered over USB/IP, for the kernel's
	// vhci-hcd (or usbip-win2 on Windows) to attach: 127.0.0.1:3240 (the
	// USB/IP port, on loopback only) unless set; "off" offers none.
	KeyServer string
	// SiteListen are where the box hears its site's peers (ADR 0019):
	// its LAN addresses with the probe port, UDP. None: the box takes no
	// part in site health (its peers cannot tell its line from its death).
	SiteListen []string
	// MetricsListen is the loopback address where the box's Prometheus
	// metrics are served, at /metrics (DefaultMetricsListen is the
	// command's default); "" or "off" serves none. Validate refuses any
	// other address: the metrics are for the box's own host.
	MetricsListen string
	// Hooks are for fault-injection tests; production leaves them nil.
	Hooks Hooks
}

// Hooks let tests stop the agent at precise points.
type Hooks struct {
	// AfterStore runs after a Sync batch is on disk and before it is
	// acknowledged; an error ends the stream there, as a crash would.
	AfterStore func(rev uint64) error
	// CapabilityVersion, when set, is the capability version the agent
	// claims in Sync, to act as an older agent.
	CapabilityVersion *uint32
	// BeforeSendUp sees each batch of acks and status before it goes up,
	// and may change it.
	BeforeSendUp func(msgs []*edgeboxv1.SyncUp)
	// WipeStep runs after each step of a wipe (WipeStepMarked, …); an
	// error stops the wipe there, as a kill would.
	WipeStep func(step string) error
}

// DefaultConfig returns the defaults for dir.
func DefaultConfig(dir string) Config {
	return Config{DataDir: dir, Version: "dev", Tunnel: tunnel.DefaultConfig(), Renew: tunnel.DefaultRenewal(),
		PendingRecheck: 15 * time.Second, RenewRetry: time.Minute, RPCIdle: 30 * time.Second,
		SyncRetry: time.Second, HelloTimeout: 30 * time.Second, UpAnswerTimeout: upAnswerTimeout, Reconcile: 10 * time.Second}
}

// Validate reports what is wrong with c.
func (c Config) Validate() error {
	if c.DataDir == "" {
		return errors.New("agent: data directory is required")
	}
	if c.PendingRecheck <= 0 || c.RenewRetry <= 0 || c.RPCIdle <= 0 || c.SyncRetry <= 0 || c.Reconcile <= 0 ||
		c.HelloTimeout <= 0 || c.UpAnswerTimeout <= 0 {
		return errors.New("agent: PendingRecheck, RenewRetry, RPCIdle, SyncRetry, HelloTimeout, UpAnswerTimeout and Reconcile must be positive")
	}
	if err := checkMetricsListen(c.MetricsListen); err != nil {
		return err
	}
	return c.Tunnel.Validate()
}

// Status is what a running agent reports in status.json.
type Status struct {
	BoxID      string    `json:"box_id"`
	Name       string    `json:"name"`
	ConsoleURL string    `json:"console_url"`
	Connected  bool      `json:"connected"`
	Approved   bool      `json:"approved"`
	Since      time.Time `json:"since"` // of the current connected state
	// HelloAt is when the console last answered the box's hello; before
	// Since, it has not answered on this connection yet, and Approved is
	// what it said before.
	HelloAt      time.Time `json:"hello_at"`
	LastError    string    `json:"last_error,omitempty"`
	CertNotAfter time.Time `json:"cert_not_after"`
	PID          int       `json:"pid"`
	UpdatedAt    time.Time `json:"updated_at"`
}

// Greeted reports whether the box is connected and the console answered
// its hello on this connection, so Approved is current.
func (s Status) Greeted() bool { return s.Connected && !s.HelloAt.Before(s.Since) }

// Agent runs one box.
type Agent struct {
	cfg   Config
	log   *slog.Logger
	creds *credentials
	cert  atomic.Pointer[tls.Certificate]
	tc    *tunnel.Client

	statusMu  sync.Mutex // guards status and statusSeq
	status    Status
	statusSeq uint64        // counts the changes of status
	statusOut *statusWriter // status.json

	connected chan struct{} // one signal per session that came up
	resync    chan struct{} // the same, for the Sync stream

	local   *localstore.Store
	locks   *locks.Set
	keyHold atomic.Value // string: why UKEYs in use hold the box, "" when none
	// localKeys offers keys of other boxes to this box's containers and
	// programs (ukeys.go); set while serveKeysLocally runs.
	localKeys atomic.Pointer[localKeys]
	// remoteKeys counts the keys of other boxes imported here now: while
	// there is one, a broken tunnel is redialled without backing off, so
	// it is back within the key's resume window (keyResumeWindow).
	remoteKeys atomic.Int32
	// keysOffered counts the keys of this box offered to other boxes:
	// while there is one, the tunnel also hurries back, for the sessions
	// of those keys resume within the same window.
	keysOffered atomic.Int32
	vhciMu      sync.Mutex
	vhci        map[string]int // keys of other boxes on the box's USB bus: key ID → vhci port
	reports     *reports
	reconciler  *reconcile.Reconciler
	// suspect are keys whose holder became unhealthy, to power-cycle.
	suspectMu sync.Mutex
	suspect   map[string]bool
	// received counts desired objects taken from the console, for tests
	// and status.
	received atomic.Int64
	// syncedAt is when the Sync stream last stored what the console sent,
	// or the console took the box's whole status (Unix nanoseconds).
	syncedAt atomic.Int64
	// registry reaches the console's registry, and its agent binaries,
	// through the tunnel; consoleHost is the console's host:port.
	registry    *http.Client
	consoleHost string
	updateKick  chan struct{}
	keysKick    chan struct{} // the desired state changed: keys of other boxes may come or go
	// sessionUp is closed, and replaced, whenever a tunnel session comes
	// up: work that waits out an outage (a key of another box) starts
	// again at once.
	upMu      sync.Mutex
	sessionUp chan struct{}
	// wipe is the console's wipe of this box (wipe.go).
	wipe wipeState
	// metrics and boxMetrics are what the agent serves on loopback
	// (metrics.go), nil when it serves none; metricsAddr (a string) is
	// where, while it does. prober hears the site's peers while site
	// health runs, for the metrics.
	metrics     *prometheus.Registry
	boxMetrics  *boxCollector
	metricsAddr atomic.Value
	prober      atomic.Pointer[sitepeer.Prober]
}

// New loads the box identity from cfg.DataDir; it starts nothing.
func New(cfg Config, log *slog.Logger) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// A wipe the console asked for comes before anything else.
	if rec, err := pendingWipe(cfg.DataDir, log); err != nil {
		return nil, err
	} else if rec != nil {
		a := &Agent{cfg: cfg, log: log.With("component", "agent", "box_id", rec.BoxID), wipe: newWipeState()}
		a.wipe.pending = rec
		return a, nil
	}
	creds, err := loadCredentials(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	u, err := enroll.ParseConsoleURL(creds.ConsoleURL)
	if err != nil {
		return nil, fmt.Errorf("agent: %s: %w", identityFile, err)
	}
	a := &Agent{cfg: cfg, log: log.With("component", "agent", "box_id", creds.BoxID), creds: creds,
		connected: make(chan struct{}, 1), resync: make(chan struct{}, 1), wipe: newWipeState()}
	a.cert.Store(&creds.cert)
	var tm *tunnel.Metrics
	if !metricsOff(cfg.MetricsListen) {
		tm = a.initMetrics()
	}
	settings, err := ReadSettings(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	also := creds.Also
	if len(settings.Consoles) > 0 {
		also = settings.Consoles
	}
	tc, err := tunnel.NewClient(tunnel.ClientConfig{
		Config: cfg.Tunnel, Addr: enroll.HostPort(u), Also: also, Proxy: cfg.Proxy, ProxySource: cfg.ProxySource, Dial: cfg.Dial, Backoff: cfg.Backoff,
		Name: creds.BoxID, Renew: cfg.Renew, Metrics: tm, Rejoin: cfg.Rejoin,
		TLS: &tls.Config{
			RootCAs: creds.ca, ServerName: u.Hostname(),
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return a.cert.Load(), nil },
		},
	}, log)
	if err != nil {
		return nil, err
	}
	a.tc = tc
	tc.OnSession = a.onSession
	tc.OnDialError = func(err error) { a.setStatus(func(s *Status) { s.LastError = err.Error() }) }
	tc.Hurry = func() bool { return a.remoteKeys.Load() > 0 || a.keysOffered.Load() > 0 }
	if a.local, err = localstore.Open(cfg.DataDir); err != nil {
		return nil, err
	}
	a.reports = newReports()
	if a.locks, err = locks.Open(filepath.Join(cfg.DataDir, locksFile), nil); err != nil {
		if a.locks == nil {
			a.local.Close()
			return nil, err
		}
		a.log.Warn("update locks", "err", err) // damaged: none held
	}
	// Images from the console's registry come through the tunnel.
	registry := pull.NewClient([]string{u.Host, enroll.HostPort(u)}, func(ctx context.Context) (net.Conn, error) {
		return tc.Open(ctx, tunnel.KindRegistry, nil)
	}, nil)
	a.registry, a.consoleHost, a.updateKick = registry, u.Host, make(chan struct{}, 1)
	a.keysKick = make(chan struct{}, 1)
	a.sessionUp = make(chan struct{})
	a.reconciler, err = reconcile.New(reconcile.Config{Source: a.local, Drivers: cfg.Drivers, Reporter: a.reports,
		Log: a.log, Interval: cfg.Reconcile, Registry: registry,
		ImageRecord: filepath.Join(cfg.DataDir, "images.json"), Devices: a.devicesFor, SuspectKeys: a.suspectKeys, Holding: a.holding})
	if err != nil {
		a.local.Close()
		return nil, err
	}
	a.statusOut = &statusWriter{path: filepath.Join(cfg.DataDir, statusFile), skip: a.wipe.active.Load,
		warn: func(err error) { a.log.Warn("writing status", "err", err) }}
	a.status = Status{BoxID: creds.BoxID, Name: creds.Name, ConsoleURL: creds.ConsoleURL,
		CertNotAfter: creds.leaf.NotAfter, PID: os.Getpid(), Since: time.Now().UTC()}
	return a, nil
}

// Identity returns who this box is; nobody for an agent that New found
// part way through a wipe.
func (a *Agent) Identity() Identity {
	if a.creds == nil {
		return Identity{}
	}
	return a.creds.Identity
}

// Tunnel returns the agent's tunnel client, for more stream kinds.
func (a *Agent) Tunnel() *tunnel.Client { return a.tc }

// Status returns the agent's current status.
func (a *Agent) Status() Status {
	a.statusMu.Lock()
	defer a.statusMu.Unlock()
	return a.status
}

func (a *Agent) setStatus(f func(*Status)) {
	a.statusMu.Lock()
	f(&a.status)
	a.status.UpdatedAt = time.Now().UTC()
	a.statusSeq++
	s, seq := a.status, a.statusSeq
	a.statusMu.Unlock()
	a.statusOut.put(s, seq)
}

func (a *Agent) onSession(_ *tunnel.Session, up bool) {
	if !up {
		a.wipe.sessionDown()
	}
	if up {
		for _, ch := range []chan struct{}{a.connected, a.resync} {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
	a.setStatus(func(s *Status) {
		if s.Connected != up {
			s.Since = time.Now().UTC()
		}
		s.Connected = up
	})
	if up { // after the status says so: who wakes finds the box connected
		a.upMu.Lock()
		close(a.sessionUp)
		a.sessionUp = make(chan struct{})
		a.upMu.Unlock()
	}
}

// nextSession is closed when the next tunnel session comes up.
func (a *Agent) nextSession() <-chan struct{} {
	a.upMu.Lock()
	defer a.upMu.Unlock()
	return a.sessionUp
}

// Run connects to the console and serves until ctx ends, then returns
// nil; until the console wiped the box: then it returns a *WipedError
// (ErrWiped); or until one of its services failed: then it returns that
// failure.
func (a *Agent) Run(ctx context.Context) error {
	if a.wipe.pending != nil {
		return a.finishWipe(ctx)
	}
	// A staged new version of the agent ends the run with ErrRestart.
	ctx, restartFor := context.WithCancelCause(ctx)
	defer restartFor(nil)
	rpc := grpc.NewServer(grpc.MaxRecvMsgSize(4<<20), grpc.ReadBufferSize(0), grpc.SharedWriteBuffer(true))
	edgeboxv1.RegisterAgentServiceServer(rpc, &agentService{version: a.cfg.Version, drivers: a.cfg.Drivers, wipe: a.askWipe,
		sessions: session.New(session.Config{Drivers: a.cfg.Drivers, Log: a.log}),
		files:    &files.Server{VolumeDir: VolumeDir(a.cfg.DataDir)}})
	console, err := grpc.NewClient("passthrough:///console",
		grpc.WithTransportCredentials(insecure.NewCredentials()),     // the tunnel is the mTLS
		grpc.WithReadBufferSize(0), grpc.WithSharedWriteBuffer(true), // tunnel streams are buffered
		// Without calls (none while a Sync stream is open) the connection
		// and its tunnel stream go away.
		grpc.WithIdleTimeout(a.cfg.RPCIdle),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return a.tc.Open(ctx, tunnel.KindRPC, nil)
		}))
	if err != nil {
		return err
	}
	defer console.Close()
	client := edgeboxv1.NewConsoleServiceClient(console)

	// The services run under one group. The first to fail ends the
	// group's context, as the end of ctx and the end of a wipe do; a
	// service that stops after that was asked to, and its result is not a
	// failure. Then they stop in this order:
	//  1. the tunnel client drops its session, which closes its stream
	//     listeners (it follows the group's context);
	//  2. the agent RPC stops serving the console (rpc.Stop);
	//  3. the work that changes the box (reconciler, USB watch, hello,
	//     renewal, sync) stops, and Run waits for it; workloads keep
	//     running, as they do through any restart of the agent;
	//  4. Run waits for the rest of the group (the tunnel, the wipe);
	//  5. the status says disconnected, and the local store closes.
	g, gctx := errgroup.WithContext(ctx)
	// work is what changes the box; a wipe stops it first.
	workCtx, stopWork := context.WithCancel(gctx)
	defer stopWork()
	failed := func(what string, err error) error {
		if gctx.Err() != nil {
			return nil // asked to stop, or stopped after another's failure
		}
		if err == nil {
			err = errors.New("stopped by itself")
		}
		return fmt.Errorf("agent: %s: %w", what, err)
	}

	a.setStatus(func(*Status) {})
	var work sync.WaitGroup
	runWork := func(f func(context.Context)) {
		work.Add(1)
		g.Go(func() error { defer work.Done(); f(workCtx); return nil })
	}
	// Workloads come back from the local store first, whether or not the
	// console can be reached.
	runWork(a.reconciler.Run)
	if a.cfg.USB != nil {
		poll := a.cfg.USBPoll
		if poll <= 0 {
			poll = 500 * time.Millisecond
		}
		runWork(func(ctx context.Context) { a.watchUSB(ctx, a.cfg.USB, poll) })
	}
	if ln, addr, err := locks.Listen(filepath.Join(a.cfg.DataDir, apiDir)); err != nil {
		a.log.Warn("the local API is not served: workloads cannot take update locks", "err", err)
	} else {
		a.log.Debug("local API", "address", addr)
		runWork(func(ctx context.Context) {
			if err := locks.Serve(ctx, ln, a.locks, a.log); err != nil {
				a.log.Warn("local API stopped", "err", err)
			}
		})
	}
	runWork(a.reportLocks)
	if a.cfg.USB != nil {
		runWork(func(ctx context.Context) { a.watchKeyUse(ctx, 2*time.Second) })
		runWork(func(ctx context.Context) { a.serveKeyExports(ctx, a.tc.Listen(tunnel.KindUSBIP)) })
	}
	runWork(a.importKeys)
	runWork(func(ctx context.Context) { a.updateLoop(ctx, func() { restartFor(ErrRestart) }) })
	g.Go(func() error { return failed("tunnel", a.tc.Run(gctx)) })
	g.Go(func() error { return failed("serving the console's RPCs", rpc.Serve(a.tc.Listen(tunnel.KindRPC))) })
	runWork(func(ctx context.Context) {
		if err := forward.Serve(ctx, a.tc.Listen(tunnel.KindForward), forward.Config{Log: a.log}); err != nil {
			a.log.Warn("port forwards stopped", "err", err)
		}
	})
	runWork(func(ctx context.Context) {
		if err := forward.ServeScreens(ctx, a.tc.Listen(tunnel.KindVNC), a.screen, forward.Config{Log: a.log}); err != nil {
			a.log.Warn("VM screens stopped", "err", err)
		}
	})
	runWork(func(ctx context.Context) { a.helloLoop(ctx, client) })
	runWork(func(ctx context.Context) { a.renewLoop(ctx, client) })
	if len(a.cfg.SiteListen) > 0 {
		runWork(func(ctx context.Context) { a.siteHealth(ctx, client) })
	}
	runWork(func(ctx context.Context) { a.reportVitals(ctx, client) })
	if a.metrics != nil {
		runWork(a.serveMetrics)
	}
	runWork(a.syncLoop)
	g.Go(func() error {
		a.wipeLoop(gctx, func() { stopWork(); work.Wait() })
		select {
		case <-a.wipe.done:
		default:
			return nil // ctx ended before any wipe was asked for
		}
		// A finished wipe ends the agent, whatever else happened.
		a.afterWipe(gctx)
		return a.wipeErr()
	})
	a.log.Info("agent running", "console", a.creds.ConsoleURL, "name", a.creds.Name)

	<-gctx.Done()
	rpc.Stop()
	stopWork()
	work.Wait()
	err = g.Wait()
	a.setStatus(func(s *Status) { s.Connected = false })
	a.statusOut.close()
	a.local.Close()
	if err == nil && errors.Is(context.Cause(ctx), ErrRestart) {
		a.log.Info("agent stopped to run its new version")
		return ErrRestart
	}
	switch {
	case errors.Is(err, ErrWiped) || a.wipe.active.Load() && err != nil:
		a.log.Warn("agent stopped: wiped", "err", err)
	case err != nil:
		a.log.Error("agent stopped", "err", err)
	default:
		a.log.Info("agent stopped")
	}
	return err
}

// helloLoop reports the host facts on every connect, and keeps asking
// while the box waits for approval.
func (a *Agent) helloLoop(ctx context.Context, c edgeboxv1.ConsoleServiceClient) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.connected:
		}
		for {
			approved, err := a.hello(ctx, c)
			if ctx.Err() != nil {
				return
			}
			if err == nil && approved {
				break
			}
			if err == nil {
				a.log.Info("waiting for an operator to approve this box", "box_id", a.creds.BoxID)
			}
			select {
			case <-ctx.Done():
				return
			case <-a.connected:
			case <-time.After(a.cfg.PendingRecheck):
			}
		}
	}
}

func (a *Agent) hello(ctx context.Context, c edgeboxv1.ConsoleServiceClient) (bool, error) {
	hctx, cancel := context.WithTimeout(ctx, a.cfg.HelloTimeout)
	defer cancel()
	info := hostFacts(a.cfg.Version)
	info.LanAddrs = a.cfg.SiteListen
	resp, err := c.Hello(hctx, &edgeboxv1.HelloRequest{CapabilityVersion: CapabilityVersion, Info: info})
	if err = errgrpc.ToNative(err); err != nil {
		a.log.Warn("hello failed", "err", err)
		a.setStatus(func(s *Status) { s.LastError = err.Error() })
		return false, err
	}
	a.setStatus(func(s *Status) {
		s.Approved, s.Name, s.LastError, s.HelloAt = resp.Approved, resp.Name, "", time.Now().UTC()
	})
	a.tc.AdviseRejoin(msDuration(resp.GetRejoinWindowMs()))
	return resp.Approved, nil
}

// msDuration is a count of milliseconds from the console.
func msDuration(ms uint32) time.Duration { return time.Duration(ms) * time.Millisecond }

// renewLoop renews the box certificate at two thirds of its lifetime.
func (a *Agent) renewLoop(ctx context.Context, c edgeboxv1.ConsoleServiceClient) {
	for {
		leaf := a.cert.Load().Leaf
		wait := time.Until(renewAt(leaf))
		t := time.NewTimer(max(wait, 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if err := a.renew(ctx, c); err != nil {
			a.log.Warn("certificate renewal failed; retrying", "err", err, "in", a.cfg.RenewRetry, "expires", leaf.NotAfter)
			select {
			case <-ctx.Done():
				return
			case <-time.After(a.cfg.RenewRetry):
			}
		}
	}
}

func (a *Agent) renew(ctx context.Context, c edgeboxv1.ConsoleServiceClient) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	csrPEM, err := makeCSR(key, a.creds.BoxID)
	if err != nil {
		return err
	}
	blk, _ := pem.Decode(csrPEM)
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	resp, err := c.Renew(rctx, &edgeboxv1.RenewRequest{Csr: blk.Bytes})
	if err = errgrpc.ToNative(err); err != nil {
		return err
	}
	certPEM := resp.GetCertificatePem()
	cblk, _ := pem.Decode(certPEM)
	if cblk == nil {
		return errors.New("console sent no certificate")
	}
	leaf, err := x509.ParseCertificate(cblk.Bytes)
	if err != nil {
		return err
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: a.creds.ca, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("renewed certificate does not chain to the pinned CA: %w", err)
	}
	if err := saveKeyAndCert(a.cfg.DataDir, key, certPEM); err != nil {
		return err
	}
	a.cert.Store(&tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf})
	a.setStatus(func(s *Status) { s.CertNotAfter = leaf.NotAfter })
	a.log.Info("certificate renewed", "not_after", leaf.NotAfter)
	return nil
}

// ReadStatus reads the status the agent in dir last wrote.
func ReadStatus(dir string) (Status, error) {
	var s Status
	raw, err := os.ReadFile(filepath.Join(dir, statusFile))
	if errors.Is(err, os.ErrNotExist) {
		if _, ierr := os.Stat(filepath.Join(dir, identityFile)); ierr != nil {
			return s, wipedStatus(dir)
		}
		return s, errors.New("the agent has not run yet; start it with 'edgebox-agent run'")
	} else if err != nil {
		return s, err
	}
	if len(raw) == 0 {
		return s, errors.New("the agent has not reported since the box lost power; it writes its status again when it runs")
	}
	return s, json.Unmarshal(raw, &s)
}

type agentService struct {
	edgeboxv1.UnimplementedAgentServiceServer
	version string
	drivers []runtime.Driver
	wipe    func(ctx context.Context, reason string) (*edgeboxv1.WipeResponse, error)
	// sessions serves the console's remote shells and commands; files
	// its file copies.
	sessions *session.Server
	files    *files.Server
}

// StatFile serves a file copy's look at a path.
func (s *agentService) StatFile(ctx context.Context, r *edgeboxv1.FileRequest) (*edgeboxv1.FileInfo, error) {
	return s.files.Stat(ctx, r)
}

// ReadFile serves a file copy from the box.
func (s *agentService) ReadFile(r *edgeboxv1.FileRequest, stream edgeboxv1.AgentService_ReadFileServer) error {
	return s.files.Read(r, stream.Send)
}

// WriteFile serves a file copy to the box.
func (s *agentService) WriteFile(stream edgeboxv1.AgentService_WriteFileServer) error {
	info, err := s.files.Write(stream.Recv)
	if err != nil {
		return err
	}
	return stream.SendAndClose(info)
}

// Exec serves a remote maintenance session.
func (s *agentService) Exec(stream edgeboxv1.AgentService_ExecServer) error {
	return s.sessions.Exec(stream)
}

func (s *agentService) Ping(ctx context.Context, r *edgeboxv1.PingRequest) (*edgeboxv1.PingResponse, error) {
	p := r.GetPayload()
	if len(p) > 1024 {
		p = p[:1024]
	}
	return &edgeboxv1.PingResponse{Payload: p, AgentTimeUnixNano: time.Now().UnixNano()}, nil
}

func (s *agentService) Info(ctx context.Context, _ *edgeboxv1.InfoRequest) (*edgeboxv1.BoxInfo, error) {
	return hostFacts(s.version), nil
}

// screen finds a running VM's VNC socket among the box's drivers.
func (a *Agent) screen(workload string) (string, error) {
	for _, d := range a.cfg.Drivers {
		sc, ok := d.(interface {
			Consoles(name string) (vnc, serial string, err error)
		})
		if !ok {
			continue
		}
		if _, err := d.Inspect(context.Background(), workload); err != nil {
			continue
		}
		vnc, _, err := sc.Consoles(workload)
		return vnc, err
	}
	return "", errdefs.NotFound("no VM %q runs on this box", workload)
}
