// Package registry is the console's OCI registry: distribution v3 as a
// library, filesystem storage in the console's data directory, or in the
// directory its replicas share, or an S3-compatible bucket. Operators push and pull on the console's
// public port with their API token; boxes pull through the tunnel's
// "registry" streams with their certificate, and only what their desired
// state references.
//
// In front of distribution, serve checks every path (a malformed name is a
// 400 NAME_INVALID, never a 500), serves what distribution v3 lacks or
// cannot scope to a caller (the referrers API of the distribution spec
// v1.1 and the catalog), and gives each request body an idle deadline
// that moves with its progress. Abandoned upload sessions are purged by
// the time since their last write.
package registry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/distribution/distribution/v3"
	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	"github.com/distribution/distribution/v3/registry/storage"
	storagedriver "github.com/distribution/distribution/v3/registry/storage/driver"
	"github.com/distribution/distribution/v3/registry/storage/driver/factory"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem" // the "filesystem" driver
	_ "github.com/distribution/distribution/v3/registry/storage/driver/s3-aws"     // the "s3" driver
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sirupsen/logrus"

	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/internal/atomicfile"
	"github.com/edgebox/edgebox/internal/filelock"
)

// Registry is the console's image store and its two doors.
type Registry struct {
	cfg      Config
	app      *handlers.App
	ns       distribution.Namespace // reads for resolving tags and access checks
	driver   storagedriver.StorageDriver
	referrer *referrerIndex
	log      *slog.Logger

	deadlineWarn sync.Once // noDeadlines has warned

	refsMu sync.Mutex
	refs   map[digest.Digest][]v1.Descriptor // a manifest's references; content never changes

	// stop ends the upload purger; purged is closed when it has ended.
	stop      chan struct{}
	purged    chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// maxCachedManifests bounds the reference cache; past it the cache starts
// over.
const maxCachedManifests = 4096

// Config is where the registry keeps its data and how it treats slow and
// abandoned uploads.
type Config struct {
	// Dir holds the registry's storage, its referrers index and the key
	// that signs upload state, made under a lock on Dir/lock. Registries
	// of console replicas may share it.
	Dir string
	// BodyIdle is how long a request body may send nothing before the
	// request is cut. Each byte that arrives gives the body this long
	// again, so a slow upload that moves survives however long it takes,
	// and one that stalls holds its connection no longer than this. A
	// mobile link's handover stalls for seconds, not tens of seconds.
	BodyIdle time.Duration
	// UploadIdle is how long an upload session may go without a byte
	// before it counts as abandoned and its data is removed. It is
	// measured from the session's last write, not its start, so a long
	// upload that moves is never purged.
	UploadIdle time.Duration
	// PurgeEvery is how often abandoned upload sessions are looked for.
	PurgeEvery time.Duration
	// S3, when set, keeps the images (blobs and manifests) in an
	// S3-compatible bucket instead of under Dir; the referrers index and
	// the upload key stay in Dir.
	S3 *S3
}

// DefaultConfig is the registry's configuration for data in dir.
func DefaultConfig(dir string) Config {
	return Config{Dir: dir, BodyIdle: 30 * time.Second, UploadIdle: 3 * time.Hour, PurgeEvery: 15 * time.Minute}
}

// Validate reports the first setting that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Dir == "":
		return errdefs.Invalid("registry: no data directory")
	case c.BodyIdle <= 0:
		return errdefs.Invalid("registry: BodyIdle must be positive, not %s", c.BodyIdle)
	case c.UploadIdle <= 0 || c.PurgeEvery <= 0:
		return errdefs.Invalid("registry: UploadIdle and PurgeEvery must be positive, not %s and %s", c.UploadIdle, c.PurgeEvery)
	}
	if c.S3 != nil {
		return c.S3.Validate()
	}
	return nil
}

// storage names distribution's storage driver for c and its parameters.
func (c Config) storage() (string, configuration.Parameters) {
	if c.S3 != nil {
		return "s3", c.S3.parameters()
	}
	return "filesystem", configuration.Parameters{"rootdirectory": filepath.Join(c.Dir, "storage"), "maxthreads": 100}
}

// Open opens (creating if needed) the registry stored under dir, with the
// default configuration.
func Open(ctx context.Context, dir string, log *slog.Logger) (*Registry, error) {
	return New(ctx, DefaultConfig(dir), log)
}

// New opens (creating if needed) the registry cfg describes. It starts
// the purger of abandoned uploads; Close stops it.
func New(ctx context.Context, cfg Config, log *slog.Logger) (r *Registry, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dir := cfg.Dir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	secret, err := loadSecret(ctx, dir)
	if err != nil {
		return nil, err
	}
	driverName, params := cfg.storage()
	dcfg := &configuration.Configuration{
		Storage: configuration.Storage{
			driverName: params,
			"delete":   configuration.Parameters{"enabled": true},
			"redirect": configuration.Parameters{"disable": true},
			// distribution's purger goes by when an upload started, so it
			// would cut a long upload that still moves; purgeUploads goes
			// by its last write.
			"maintenance": configuration.Parameters{"uploadpurging": map[any]any{"enabled": false}},
		},
	}
	dcfg.HTTP.Secret = secret
	// distribution logs through logrus' standard logger, a process-wide
	// setting: its request lines are noise in the console's log, its
	// warnings are not.
	logrus.SetLevel(logrus.WarnLevel)
	logrus.SetOutput(slogWriter{log})
	defer func() {
		// NewApp panics on a configuration it cannot use.
		if p := recover(); p != nil {
			err = fmt.Errorf("registry: %v", p)
		}
	}()
	// The driver is made first: a bucket that cannot be reached is an
	// error here, where NewApp would panic.
	driver, err := factory.Create(ctx, driverName, params)
	if err != nil {
		return nil, fmt.Errorf("registry: %s storage: %w", driverName, err)
	}
	if cfg.S3 != nil {
		if err := cfg.S3.reach(ctx, driver); err != nil {
			return nil, err
		}
	}
	app := handlers.NewApp(ctx, dcfg)
	ns, err := storage.NewRegistry(ctx, driver)
	if err != nil {
		app.Shutdown()
		return nil, fmt.Errorf("registry: %w", err)
	}
	r = &Registry{cfg: cfg, app: app, ns: ns, driver: driver, log: log,
		referrer: &referrerIndex{root: filepath.Join(dir, "referrers")},
		refs:     map[digest.Digest][]v1.Descriptor{},
		stop:     make(chan struct{}), purged: make(chan struct{})}
	go r.purgeLoop()
	return r, nil
}

// Close stops the registry's background work and waits for it. It may be
// called more than once.
func (r *Registry) Close() error {
	r.closeOnce.Do(func() {
		close(r.stop)
		<-r.purged
		r.closeErr = r.app.Shutdown()
	})
	return r.closeErr
}

// loadSecret returns the key that signs upload state, kept in
// dir/http-secret and made once: an upload in progress survives a console
// restart, and goes on through another console sharing dir. It is made
// under dir/lock, so consoles starting at once on a shared dir make one,
// and written whole.
func loadSecret(ctx context.Context, dir string) (string, error) {
	path := filepath.Join(dir, "http-secret")
	read := func() (string, bool) {
		b, err := os.ReadFile(path)
		return strings.TrimSpace(string(b)), err == nil && len(b) >= 32
	}
	if s, ok := read(); ok {
		return s, nil
	}
	// Another console holds the lock for as long as it takes to write
	// one small file.
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	lock, err := filelock.Acquire(ctx, filepath.Join(dir, "lock"))
	if err != nil {
		return "", fmt.Errorf("registry: %w", err)
	}
	defer lock.Unlock()
	if s, ok := read(); ok {
		return s, nil
	}
	buf := make([]byte, 32)
	rand.Read(buf)
	s := hex.EncodeToString(buf)
	if err := atomicfile.Write(path, []byte(s+"\n")); err != nil {
		return "", fmt.Errorf("registry: %w", err)
	}
	return s, nil
}

type slogWriter struct{ log *slog.Logger }

// Write passes on distribution's log lines: answers of 4xx (a push asks
// for what is missing first) at debug level, the rest as warnings.
func (w slogWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level := slog.LevelWarn
	if strings.Contains(line, "http.response.status=4") {
		level = slog.LevelDebug
	}
	w.log.Log(context.Background(), level, "registry: "+line)
	return len(p), nil
}

// ServeHTTP serves the OCI distribution API to a caller who may see and
// do everything: callers put a door in front (Operators or Boxes).
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) { r.serve(w, req, Access{}) }

// Resolve returns the digest that repo's tag names now.
func (r *Registry) Resolve(ctx context.Context, repo, tag string) (digest.Digest, error) {
	rp, err := r.repository(ctx, repo)
	if err != nil {
		return "", err
	}
	d, err := rp.Tags(ctx).Get(ctx, tag)
	if err != nil {
		var unknown distribution.ErrTagUnknown
		if errors.As(err, &unknown) {
			return "", errdefs.NotFound("%s has no tag %q; push it first", repo, tag)
		}
		var unknownRepo distribution.ErrRepositoryUnknown
		if errors.As(err, &unknownRepo) {
			return "", errdefs.NotFound("the console's registry has no repository %s; push it first", repo)
		}
		return "", fmt.Errorf("resolving %s:%s: %w", repo, tag, err)
	}
	return d.Digest, nil
}

// HasManifest says whether repo holds the manifest dgst.
func (r *Registry) HasManifest(ctx context.Context, repo string, dgst digest.Digest) (bool, error) {
	rp, err := r.repository(ctx, repo)
	if err != nil {
		return false, err
	}
	ms, err := rp.Manifests(ctx)
	if err != nil {
		return false, err
	}
	return ms.Exists(ctx, dgst)
}

func (r *Registry) repository(ctx context.Context, repo string) (distribution.Repository, error) {
	named, err := reference.WithName(repo)
	if err != nil {
		return nil, errdefs.Invalid("repository name %q: %w", repo, err)
	}
	return r.ns.Repository(ctx, named)
}

// references returns the digests the manifest dgst in repo refers to:
// config and layers, or the manifests of an index.
func (r *Registry) references(ctx context.Context, repo string, dgst digest.Digest) ([]v1.Descriptor, error) {
	r.refsMu.Lock()
	refs, ok := r.refs[dgst]
	r.refsMu.Unlock()
	if ok {
		return refs, nil
	}
	rp, err := r.repository(ctx, repo)
	if err != nil {
		return nil, err
	}
	ms, err := rp.Manifests(ctx)
	if err != nil {
		return nil, err
	}
	m, err := ms.Get(ctx, dgst)
	if err != nil {
		return nil, err
	}
	refs = m.References()
	r.refsMu.Lock()
	if len(r.refs) >= maxCachedManifests {
		clear(r.refs)
	}
	r.refs[dgst] = refs
	r.refsMu.Unlock()
	return refs, nil
}
