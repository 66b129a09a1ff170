// Package vm is the format of VM images in the console's registry: an OCI
// artifact whose layers are a qcow2 disk and, for VMs booted straight into
// a kernel, the kernel and its initrd. Operators push with
// 'edgebox image push-disk' (or oras); boxes fetch the layers into a
// directory, resuming a cut download and checking every digest.
package vm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/internal/atomicfile"
)

// Media types of a VM artifact.
const (
	ArtifactType = "application/vnd.edgebox.vm.v1"
	ConfigType   = "application/vnd.edgebox.vm.config.v1+json"
	DiskType     = "application/vnd.edgebox.vm.disk.qcow2"
	KernelType   = "application/vnd.edgebox.vm.kernel"
	InitrdType   = "application/vnd.edgebox.vm.initrd"
)

// Files of a fetched VM image, in its directory.
const (
	DiskFile   = "disk.qcow2"
	KernelFile = "kernel"
	InitrdFile = "initrd"
	ConfigFile = "vm.json"
)

// Config is the artifact's config blob: how to boot it.
type Config struct {
	// Cmdline is the kernel command line, for kernel boots.
	Cmdline string `json:"cmdline,omitempty"`
	// MemoryBytes and CPUs are the VM's size unless the release says.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	CPUs        int   `json:"cpus,omitempty"`
}

var fileOf = map[string]string{DiskType: DiskFile, KernelType: KernelFile, InitrdType: InitrdFile}

// Bounds on what a box accepts.
const (
	maxManifest = 1 << 20
	maxConfig   = 64 << 10
	maxLayer    = 1 << 40
)

type descriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	ArtifactType  string       `json:"artifactType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

// Ref is what Fetch needs of an image reference: the registry's base URL
// (scheme and host), the repository and the manifest's digest.
type Ref struct {
	Base, Repo, Digest string
}

// Fetch brings the VM image ref into dir: each layer under its file name
// and the config as vm.json. A layer partly fetched before (dir/<file>.part)
// is resumed with a range request. Every blob is checked against its
// digest; a mismatch deletes it and fails. progress, if set, gets bytes
// done and total.
func Fetch(ctx context.Context, hc *http.Client, ref Ref, dir string, progress func(done, total int64)) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	raw, err := get(ctx, hc, ref.Base+"/v2/"+ref.Repo+"/manifests/"+ref.Digest, maxManifest,
		"application/vnd.oci.image.manifest.v1+json")
	if err != nil {
		return fmt.Errorf("manifest of %s: %w", ref.Repo, err)
	}
	if err := checkDigest(raw, ref.Digest); err != nil {
		return fmt.Errorf("manifest of %s: %w", ref.Repo, err)
	}
	var m manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return errdefs.Invalid("manifest of %s: %w", ref.Repo, err)
	}
	if m.ArtifactType != ArtifactType && m.Config.MediaType != ConfigType {
		return errdefs.Invalid("%s@%s is not a VM image (artifact type %q); push it with 'edgebox image push-disk'", ref.Repo, ref.Digest, m.ArtifactType)
	}
	var total, done int64
	var layers []descriptor
	for _, l := range m.Layers {
		if _, ok := fileOf[l.MediaType]; !ok {
			continue
		}
		if l.Size < 0 || l.Size > maxLayer {
			return errdefs.Invalid("layer %s: size %d", l.Digest, l.Size)
		}
		layers = append(layers, l)
		total += l.Size
	}
	if len(layers) == 0 {
		return errdefs.Invalid("%s@%s has neither a disk nor a kernel", ref.Repo, ref.Digest)
	}
	var cfg Config
	if m.Config.MediaType == ConfigType && m.Config.Size > 0 {
		raw, err := get(ctx, hc, ref.Base+"/v2/"+ref.Repo+"/blobs/"+m.Config.Digest, maxConfig, "")
		if err != nil {
			return fmt.Errorf("VM config: %w", err)
		}
		if err := checkDigest(raw, m.Config.Digest); err != nil {
			return fmt.Errorf("VM config: %w", err)
		}
		if err := json.Unmarshal(raw, &cfg); err != nil {
			return errdefs.Invalid("VM config: %w", err)
		}
	}
	for _, l := range layers {
		path := filepath.Join(dir, fileOf[l.MediaType])
		if err := fetchBlob(ctx, hc, ref.Base+"/v2/"+ref.Repo+"/blobs/"+l.Digest, l, path, func(n int64) {
			if progress != nil {
				progress(done+n, total)
			}
		}); err != nil {
			return err
		}
		done += l.Size
	}
	raw, _ = json.Marshal(cfg)
	return atomicfile.Write(filepath.Join(dir, ConfigFile), raw)
}

func get(ctx context.Context, hc *http.Client, url string, limit int64, accept string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, statusError(resp)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(raw)) > limit {
		return nil, errdefs.Invalid("answer longer than %d bytes", limit)
	}
	return raw, nil
}

func statusError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	msg := strings.TrimSpace(string(body))
	if resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusUnauthorized {
		return errdefs.Permission("registry refused: %s %s", resp.Status, msg)
	}
	if resp.StatusCode == http.StatusNotFound {
		return errdefs.NotFound("registry: %s %s", resp.Status, msg)
	}
	return fmt.Errorf("registry: %s %s", resp.Status, msg)
}

func checkDigest(raw []byte, want string) error {
	sum := sha256.Sum256(raw)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != want {
		return fmt.Errorf("digest %s, expected %s: refused", got, want)
	}
	return nil
}

// fetchBlob brings one layer to path, resuming path.part, and checks it.
func fetchBlob(ctx context.Context, hc *http.Client, url string, l descriptor, path string, progress func(int64)) error {
	if ok, _ := fileHasDigest(path, l.Digest); ok {
		return nil
	}
	part := path + ".part"
	f, err := os.OpenFile(part, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	have, err := io.Copy(h, f) // what an earlier fetch left
	if err != nil {
		return err
	}
	if have > l.Size {
		if err := f.Truncate(0); err != nil {
			return err
		}
		f.Seek(0, io.SeekStart)
		h.Reset()
		have = 0
	}
	if have < l.Size {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if have > 0 {
			req.Header.Set("Range", fmt.Sprintf("bytes=%d-", have))
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusPartialContent && have > 0:
		case resp.StatusCode == http.StatusOK:
			// The registry sends it all: start over.
			if err := f.Truncate(0); err != nil {
				return err
			}
			f.Seek(0, io.SeekStart)
			h.Reset()
			have = 0
		default:
			return statusError(resp)
		}
		w := &counter{w: io.MultiWriter(f, h), n: have, report: progress}
		if _, err := io.Copy(w, io.LimitReader(resp.Body, l.Size-have)); err != nil {
			return fmt.Errorf("layer %s: %w (fetched %d of %d bytes; the next try resumes)", l.Digest, err, w.n, l.Size)
		}
		have = w.n
	}
	if have != l.Size {
		return fmt.Errorf("layer %s: %d of %d bytes arrived", l.Digest, have, l.Size)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != l.Digest {
		f.Close()
		os.Remove(part)
		return fmt.Errorf("layer %s: digest %s does not match: refused and deleted", l.Digest, got)
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return os.Rename(part, path)
}

func fileHasDigest(path, want string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return false, err
	}
	return "sha256:"+hex.EncodeToString(h.Sum(nil)) == want, nil
}

type counter struct {
	w      io.Writer
	n      int64
	report func(int64)
}

func (c *counter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	if c.report != nil {
		c.report(c.n)
	}
	return n, err
}

// ParseRef splits host/repo@sha256:… , the only form a box fetches VM
// images by.
func ParseRef(s string) (Ref, error) {
	rest, dgst, ok := strings.Cut(s, "@")
	host, repo, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || host == "" || repo == "" || !strings.HasPrefix(dgst, "sha256:") || len(dgst) != 71 {
		return Ref{}, errdefs.Invalid("VM image %q: write host/repository@sha256:<digest>", s)
	}
	if _, err := hex.DecodeString(dgst[7:]); err != nil {
		return Ref{}, errdefs.Invalid("VM image %q: bad digest", s)
	}
	if i := strings.LastIndex(repo, ":"); i >= 0 {
		repo = repo[:i] // a tag beside the digest says nothing more
	}
	return Ref{Base: "https://" + host, Repo: repo, Digest: dgst}, nil
}
