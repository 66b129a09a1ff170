package update

import (
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/edgebox/edgebox/errdefs"
)

// Release is an agent version the console asks a box to run.
type Release struct {
	Version string
	// SHA256 (hex) and Signature are the box's platform's binary's; a
	// version the box already holds may come without them.
	SHA256    string
	Signature []byte
	// Probation is how long the new version is on trial.
	Probation time.Duration
}

// MaxBinary bounds an agent binary's size.
const MaxBinary = 512 << 20

// SignedMessage is what a release binary's signature covers: the
// version, the platform and the binary's digest.
func SignedMessage(version, goos, goarch, sha256hex string) []byte {
	return []byte("edgebox agent release\x00" + version + "\x00" + goos + "/" + goarch + "\x00" + sha256hex)
}

// Verify checks rel's signature by key (the console's CA) for the
// platform goos/goarch.
func Verify(key *ecdsa.PublicKey, rel Release, goos, goarch string) error {
	sum := sha256.Sum256(SignedMessage(rel.Version, goos, goarch, rel.SHA256))
	if key == nil || len(rel.Signature) == 0 || !ecdsa.VerifyASN1(key, sum[:], rel.Signature) {
		return errdefs.Permission("agent %s: its signature does not verify with the console's CA", rel.Version)
	}
	return nil
}

// ErrRefused marks a version this box refused before.
var ErrRefused = errors.New("refused on this box")

// Stage makes rel the trial that the launcher starts next: from the
// binary the box holds, or from fetch, which writes it. The binary's
// digest must be rel.SHA256, and verify must pass, before anything is
// recorded; running is the version that runs now.
func Stage(ctx context.Context, dir, running string, rel Release, fetch func(ctx context.Context, w io.Writer) error, verify func(Release) error) error {
	if !ValidVersion(rel.Version) {
		return errdefs.Invalid("agent version %q: not a version", rel.Version)
	}
	st, err := Load(dir)
	if err != nil {
		return err
	}
	if r, ok := st.RefusedVersion(rel.Version); ok {
		return fmt.Errorf("agent %s: %w at %s: %s", rel.Version, ErrRefused, r.At.Format(time.RFC3339), r.Why)
	}
	if st.Installed == "" {
		st.Installed = running // staged by the installed binary itself
	}
	if rel.Version != st.Installed {
		if err := place(ctx, dir, rel, fetch, verify); err != nil {
			return err
		}
	}
	probation := rel.Probation
	if probation <= 0 {
		probation = DefaultProbation
	}
	st.Trial = &Trial{Version: rel.Version, Probation: probation}
	os.Remove(healthyPath(dir))
	return st.Save(dir)
}

// place puts rel's binary at its path, unless a binary of its digest is
// there already.
func place(ctx context.Context, dir string, rel Release, fetch func(ctx context.Context, w io.Writer) error, verify func(Release) error) error {
	path := BinaryPath(dir, rel.Version)
	if have, err := digestOf(path); err == nil && (rel.SHA256 == "" || have == rel.SHA256) {
		return nil // held, and checked when it came
	}
	if rel.SHA256 == "" || fetch == nil {
		return errdefs.NotFound("agent %s is not on this box, and the console names no binary for it", rel.Version)
	}
	// The signature first: a release that does not verify is not even
	// downloaded.
	if err := verify(rel); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	// A download an agent killed part way left behind goes first: each
	// may be up to MaxBinary.
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".download-*")); len(left) > 0 {
		for _, f := range left {
			os.Remove(f)
		}
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".download-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	lw := &limitWriter{w: io.MultiWriter(tmp, h), left: MaxBinary}
	err = fetch(ctx, lw)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("agent %s: download: %w", rel.Version, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != rel.SHA256 {
		return errdefs.Invalid("agent %s: the binary's digest is %s, not %s", rel.Version, got, rel.SHA256)
	}
	if err := os.Chmod(tmp.Name(), 0o755); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func digestOf(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

type limitWriter struct {
	w    io.Writer
	left int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.left {
		return 0, fmt.Errorf("the binary is larger than %d MiB", MaxBinary>>20)
	}
	l.left -= int64(len(p))
	return l.w.Write(p)
}
