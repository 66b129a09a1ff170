package console

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/edgebox/edgebox/console/admission"
	"github.com/edgebox/edgebox/console/gcpace"
	"github.com/edgebox/edgebox/console/port"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/enroll"
	"github.com/edgebox/edgebox/images/registry"
	"github.com/edgebox/edgebox/tunnel"
)

// Config is the console's configuration.
type Config struct {
	// DataDir holds the CA, the database and everything else that must
	// survive a restart; with SharedDir, what is this console's own.
	DataDir string
	// SharedDir, when set, holds what console replicas sharing one store
	// must share: the CA and the serving key (pki), the registry's
	// storage, the agent release binaries and the remote session
	// recordings. It is an absolute path, made if missing, on a file
	// system every replica mounts, such as NFS, whose file locks hold
	// across machines (NFSv4, or NFSv3 with lockd): replicas starting at
	// once make one CA and one serving key under a lock there. DataDir
	// keeps the rest: the admission rate, the default DistDir, and the
	// database, which only a console without replicas (Store empty) has.
	// Empty keeps everything in DataDir.
	SharedDir string
	// Store is where the console's records live: "" for the bbolt
	// database in DataDir, or etcd://HOST:PORT[,HOST:PORT...][/PREFIX] for
	// a store on etcd (the CA, the registry and the recordings stay in
	// DataDir, or SharedDir when set).
	Store string
	// RegistryS3, when set, is the S3-compatible bucket the registry
	// keeps its images in, s3://BUCKET[/PREFIX][?region=...&endpoint=...],
	// instead of SharedDir (or DataDir); its referrers index and upload
	// key stay there.
	RegistryS3 string
	// Listen is the one public address, ":8443" by default.
	Listen string
	// Listener, when set, is the public port instead of a listener on
	// Listen: for socket activation, and for tests that make the port fail.
	// The console closes it when Run returns, or on Close.
	Listener net.Listener
	// PublicURL is how boxes and operators reach the console; it goes into
	// enrollment tokens. Default: https://<this host name>:<listen port>.
	PublicURL string
	// AlsoAddrs are the console's other addresses (host:port) for boxes:
	// its replicas, where no one name or load balancer reaches them all.
	// Enrollment tokens carry them, and a box tries PublicURL's address
	// and these in a random order. At most 8, in 160 bytes.
	AlsoAddrs []string
	// ReplicaListen, for a console on etcd, is the address the other
	// replicas sharing the cluster forward calls for this one's boxes to
	// (logs, shells, screens, port forwards, files of boxes whose tunnel
	// landed here), over TLS on which both sides show replica certificates
	// of the console CA. Empty runs no listener: the console then shares
	// its etcd with no other that serves boxes.
	ReplicaListen string
	// ReplicaURL is how the other replicas reach ReplicaListen:
	// https://HOST:PORT; empty is this host's name and the listener's port.
	ReplicaURL string
	// ExtraHosts are more names or addresses the serving certificate covers.
	ExtraHosts []string
	// BoxCertTTL is the lifetime of box certificates; boxes renew at two
	// thirds of it.
	BoxCertTTL time.Duration
	// Tunnel are the session settings.
	Tunnel tunnel.Config
	// Config are the public port's limits: box handshakes per second,
	// handshake deadlines, the handshake pools of boxes and everyone else,
	// and what one source address may hold (port.Config says each).
	port.Config
	// Out receives the first-start message with the admin token.
	Out io.Writer
	// SessionTTL is how long a browser login lasts.
	SessionTTL time.Duration
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
	// SitePeriod is how often the boxes of a site probe each other and
	// vote (ADR 0019); a vote counts for three periods. 10 s when zero.
	SitePeriod time.Duration
	// AlertEvery is how often the tenants' alert rules are evaluated (30 s
	// when 0); AlertRetryMin is the first wait before a webhook that
	// failed is tried again (5 s when 0).
	AlertEvery, AlertRetryMin time.Duration
	// RolloutEvery is how often running rollouts are moved along (2 s
	// when zero).
	RolloutEvery time.Duration
	// SessionIdleTimeout ends a remote session with no byte either way
	// for that long (30 min when zero); SessionMaxDuration ends every
	// session after it (8 h when zero).
	SessionIdleTimeout time.Duration
	SessionMaxDuration time.Duration
	// Admission paces box sessions: how many may be between their
	// handshake and their caught-up Sync stream, adapting to how fast
	// they complete, and how the rest are told when to come back.
	Admission admission.Config
	// GCPace lets the heap grow further between collections while boxes
	// are held back (gcpace).
	GCPace gcpace.Config
	// Hooks are for fault-injection tests; production leaves them nil.
	Hooks Hooks
}

// Hooks let tests slow or fail the console at precise points of a box's
// session. Each runs in the goroutine that serves the box, with the
// context of its call or stream, and must be safe for concurrent use.
type Hooks struct {
	// BeforeHello runs before the console answers a box's hello; an
	// error fails the hello with that error.
	BeforeHello func(ctx context.Context, box string) error
	// BeforeSync runs before the console begins a box's new Sync stream
	// (its catch-up), and before it handles a stream of the box's acks
	// and status; an error ends that stream as a failure of the console
	// would.
	BeforeSync func(ctx context.Context, box string) error
}

// consoleListenBacklog is how many streams of one kind may wait for the
// console's service of that kind.
const consoleListenBacklog = 8192

// DefaultConfig returns the defaults; DataDir defaults to the user's data
// directory.
func DefaultConfig() Config {
	tun := tunnel.DefaultConfig()
	// A listener of the console takes the streams of every box: a fleet
	// sending its acks at once after a restart must not find it full, and
	// a waiting stream costs one pointer.
	tun.ListenBacklog = consoleListenBacklog
	// Every box pings the console every PingInterval; the console pings a
	// box only when it stops hearing it, and once a minute for its RTT.
	tun.RTTEvery = time.Minute
	return Config{
		DataDir:       defaultDataDir(),
		Listen:        ":8443",
		BoxCertTTL:    30 * 24 * time.Hour,
		Tunnel:        tun,
		Config:        port.DefaultConfig(),
		Out:           os.Stdout,
		CompactEvery:  5 * time.Minute,
		KeepRevisions: 100_000,
		AppsSyncEvery: time.Minute,
		Admission:     admission.DefaultConfig(),
		GCPace:        gcpace.DefaultConfig(),
		SessionTTL:    12 * time.Hour,
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
	if c.SharedDir != "" && !filepath.IsAbs(c.SharedDir) {
		errs = append(errs, fmt.Errorf("--shared %q: the shared directory must be an absolute path", c.SharedDir))
	}
	if c.Store != "" {
		if _, err := store.ParseEtcdURL(c.Store); err != nil {
			errs = append(errs, err)
		}
	}
	if c.RegistryS3 != "" {
		if _, err := registry.ParseS3URL(c.RegistryS3); err != nil {
			errs = append(errs, fmt.Errorf("--registry-s3: %w", err))
		}
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen address %q: %v", c.Listen, err))
	}
	if c.PublicURL != "" {
		if _, err := enroll.ParseConsoleURL(c.PublicURL); err != nil {
			errs = append(errs, fmt.Errorf("public URL: %v", err))
		}
	}
	if err := enroll.ValidateAlso(c.AlsoAddrs); err != nil {
		errs = append(errs, fmt.Errorf("--also-addr: %v", err))
	}
	if c.SessionTTL < time.Minute || c.SessionTTL > 30*24*time.Hour {
		errs = append(errs, errors.New("browser session lifetime must be from 1m to 720h"))
	}
	if c.BoxCertTTL < 5*time.Second {
		errs = append(errs, errors.New("box certificate lifetime must be at least 5s"))
	}
	if err := c.Config.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Admission.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.GCPace.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.CompactEvery <= 0 || c.KeepRevisions <= 0 || c.AppsSyncEvery <= 0 {
		errs = append(errs, errors.New("CompactEvery, KeepRevisions and AppsSyncEvery must be positive"))
	}
	if err := c.Tunnel.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
