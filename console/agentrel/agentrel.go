// Package agentrel keeps the agent's own releases: the binaries the
// console serves boxes, per platform, each signed with the console's CA
// (which every box pinned when it enrolled), and the pins that say which
// version each region, site or box runs. A pin becomes an AgentRelease
// object in each covered box's desired state; the box takes the version
// through its probation (agent/update). Rollouts move boxes between
// versions with these pins, as they do an app's.
package agentrel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/edgebox/edgebox/agent/update"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// App is the name rollouts and pins give the agent itself.
const App = "edgebox-agent"

// ObjectName is the name of a box's AgentRelease object.
const ObjectName = "agent"

// Release is one version of the agent.
type Release struct {
	Version string `json:"version"`
	// Binaries are by platform ("linux/amd64").
	Binaries map[string]Binary `json:"binaries"`
	// Probation is how long a box runs the version on trial.
	Probation time.Duration `json:"probation"`
	CreatedAt time.Time     `json:"created_at"`
	CreatedBy string        `json:"created_by"`
}

// Binary is one platform's binary of a release.
type Binary struct {
	SHA256    string    `json:"sha256"`
	Size      int64     `json:"size"`
	Signature []byte    `json:"signature"`
	At        time.Time `json:"at"`
}

// Pin says that the boxes Scope/Target covers run Version.
type Pin struct {
	TenantID string    `json:"tenant_id"`
	Scope    string    `json:"scope"` // region, site or box
	Target   string    `json:"target"`
	Version  string    `json:"version"`
	At       time.Time `json:"at"`
	By       string    `json:"by"`
}

// Boxes is what agent releases need of the fleet.
type Boxes interface {
	Boxes(ctx context.Context, tenant string) ([]fleet.Box, error)
	Box(ctx context.Context, tenant, id string) (fleet.Box, error)
}

// Service keeps agent releases and pins.
type Service struct {
	s store.Store
	// pins keeps each tenant's agent pins for the boxes' hellos, until
	// something under agent-pins/ changes; releases the releases they
	// name, until something under agent-releases/ does.
	pins     *store.Memo[[]Pin]
	releases *store.Memo[Release]
	dir      string
	sign     func([]byte) ([]byte, error)
	desired  *desired.State
	boxes    Boxes
	log      *slog.Logger
	now      func() time.Time
}

// New returns the service keeping binaries under dir and signing them
// with sign (the CA's SignRelease). It starts nothing.
func New(s store.Store, dir string, sign func([]byte) ([]byte, error), d *desired.State, boxes Boxes, log *slog.Logger) (*Service, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// Uploads a killed console left half done: files not written to for
	// an hour. The directory may be shared by console replicas, and an
	// upload another is writing now stays.
	left, _ := filepath.Glob(filepath.Join(dir, "*", ".upload-*"))
	removed := 0
	for _, f := range left {
		if fi, err := os.Stat(f); err == nil && time.Since(fi.ModTime()) > time.Hour {
			os.Remove(f)
			removed++
		}
	}
	if removed > 0 {
		log.Info("removed unfinished agent uploads", "files", removed)
	}
	return &Service{s: s, pins: store.NewMemo[[]Pin](s, "agent-pins/", maxPinned, log),
		releases: store.NewMemo[Release](s, "agent-releases/", maxPinned, log), dir: dir, sign: sign,
		desired: d, boxes: boxes, log: log, now: time.Now}, nil
}

// maxPinned bounds the tenants whose agent pins are kept, and the
// releases.
const maxPinned = 1000

// Run keeps the tenants' agent pins and the releases they name fresh for
// SyncBox until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { s.releases.Run(ctx) })
	err := s.pins.Run(ctx)
	wg.Wait()
	return err
}

var platformRE = regexp.MustCompile(`^(linux|windows)/(amd64|arm64|386|arm)$`)

// ValidPlatform reports whether p names a platform boxes run on: linux
// or windows, and a Go architecture.
func ValidPlatform(p string) bool { return platformRE.MatchString(p) }

func releaseKey(v string) string { return "agent-releases/" + v }

func pinKey(tenant, scope, target string) string {
	return "agent-pins/" + tenant + "/" + scope + "/" + target
}

// binaryPath is where a binary of digest sum is kept: named by its digest
// too, so two uploads at once never write the same file.
func (s *Service) binaryPath(version, platform, sum string) string {
	return filepath.Join(s.dir, version, strings.ReplaceAll(platform, "/", "-")+"-"+sum)
}

// Upload stores version's binary for platform from r (at most
// update.MaxBinary bytes), signs its digest and adds it to the release,
// made on its first binary. A binary already there stays: a release is
// immutable, and the same binary uploaded again changes nothing.
func (s *Service) Upload(ctx context.Context, who audit.Actor, version, platform string, probation time.Duration, r io.Reader) (Release, error) {
	if !update.ValidVersion(version) {
		return Release{}, errdefs.Invalid("version %q: 1-64 letters, digits, '.', '+', '_' or '-'", clip(version))
	}
	if !ValidPlatform(platform) {
		return Release{}, errdefs.Invalid("platform %q: use linux or windows and an architecture, as linux/amd64", clip(platform))
	}
	if probation < 0 || probation > 24*time.Hour {
		return Release{}, errdefs.Invalid("probation %s: from 0 (the default, 10 min) to 24h", probation)
	}
	dir := filepath.Join(s.dir, version)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Release{}, err
	}
	tmp, err := os.CreateTemp(dir, ".upload-*")
	if err != nil {
		return Release{}, err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, update.MaxBinary+1))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Release{}, fmt.Errorf("agent %s %s: %w", version, platform, err)
	}
	if n > update.MaxBinary {
		return Release{}, errdefs.Invalid("the binary is larger than %d MiB", update.MaxBinary>>20)
	}
	if n == 0 {
		return Release{}, errdefs.Invalid("the binary is empty")
	}
	sum := hex.EncodeToString(h.Sum(nil))
	goos, goarch, _ := strings.Cut(platform, "/")
	sig, err := s.sign(update.SignedMessage(version, goos, goarch, sum))
	if err != nil {
		return Release{}, err
	}
	placed := false
	for range 20 {
		rel, kv, err := s.get(ctx, version)
		if err != nil && errdefs.Kind(err) != errdefs.ErrNotFound {
			return Release{}, err
		}
		var modRev int64
		if err == nil {
			modRev = kv.ModRevision
		} else {
			rel = Release{Version: version, Binaries: map[string]Binary{}, Probation: probation, CreatedAt: s.now().UTC(), CreatedBy: who.Name}
		}
		if b, ok := rel.Binaries[platform]; ok {
			if b.SHA256 != sum {
				return Release{}, errdefs.Conflict("agent %s already has a %s binary (sha256 %s); a release does not change: upload a new version", version, platform, b.SHA256)
			}
			return rel, nil
		}
		// The file goes in place first: a release names only binaries
		// that are there.
		if path := s.binaryPath(version, platform, sum); !placed {
			if err := os.Rename(tmp.Name(), path); err != nil {
				return Release{}, err
			}
			placed = true
		}
		rel.Binaries[platform] = Binary{SHA256: sum, Size: n, Signature: sig, At: s.now().UTC()}
		raw, _ := json.Marshal(rel)
		res, err := s.s.Txn(ctx, store.Txn{If: []store.Cmp{{Key: releaseKey(version), ModRevision: modRev}},
			Then: []store.Op{{Key: releaseKey(version), Value: raw},
				audit.Op(s.now(), who.Did("agent.release", version, fmt.Sprintf("%s binary, %d bytes, sha256 %s", platform, n, sum)))}})
		s.releases.Forget() // whatever came of it: this console reads its own write at once
		if err != nil {
			return Release{}, err
		}
		if res.Succeeded {
			return rel, nil
		}
	}
	return Release{}, errdefs.Unavailable("agent release %s changes too often; try again", version)
}

func (s *Service) get(ctx context.Context, version string) (Release, store.KV, error) {
	var rel Release
	if !update.ValidVersion(version) {
		return rel, store.KV{}, errdefs.NotFound("no agent release %q", clip(version))
	}
	kv, err := s.s.Get(ctx, releaseKey(version))
	if errors.Is(err, store.ErrNotFound) {
		return rel, kv, errdefs.NotFound("no agent release %s; upload it with 'edgebox agent-release upload'", version)
	} else if err != nil {
		return rel, kv, err
	}
	if err := json.Unmarshal(kv.Value, &rel); err != nil {
		return rel, kv, fmt.Errorf("agent release %s: %w", version, err)
	}
	return rel, kv, nil
}

// Release returns one agent release.
func (s *Service) Release(ctx context.Context, version string) (Release, error) {
	rel, _, err := s.get(ctx, version)
	return rel, err
}

// Releases lists the agent releases, newest first.
func (s *Service) Releases(ctx context.Context) ([]Release, error) {
	kvs, _, err := s.s.Range(ctx, "agent-releases/", 0)
	if err != nil {
		return nil, err
	}
	out := make([]Release, 0, len(kvs))
	for _, kv := range kvs {
		var rel Release
		if err := json.Unmarshal(kv.Value, &rel); err != nil {
			return nil, fmt.Errorf("%s: %w", kv.Key, err)
		}
		out = append(out, rel)
	}
	slices.SortFunc(out, func(a, b Release) int { return b.CreatedAt.Compare(a.CreatedAt) })
	return out, nil
}

// Open opens version's binary for platform, for a box that may fetch it:
// its desired AgentRelease names the version.
func (s *Service) Open(ctx context.Context, box, version, platform string) (*os.File, Binary, error) {
	objs, _, err := s.desired.Live(ctx, box)
	if err != nil {
		return nil, Binary{}, err
	}
	allowed := slices.ContainsFunc(objs, func(o *edgeboxv1.DesiredObject) bool {
		return o.GetAgentRelease().GetVersion() == version
	})
	rel, _, err := s.get(ctx, version)
	if !allowed || err != nil {
		return nil, Binary{}, errdefs.NotFound("agent %s is not this box's to fetch", clip(version))
	}
	b, ok := rel.Binaries[platform]
	if !ok {
		return nil, Binary{}, errdefs.NotFound("agent %s has no %s binary", version, platform)
	}
	f, err := os.Open(s.binaryPath(version, platform, b.SHA256))
	return f, b, err
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
