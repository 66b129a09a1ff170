package vm

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Files are what a VM image is made of: a disk, or a kernel and initrd,
// or all three.
type Files struct {
	Disk, Kernel, Initrd string // paths; empty for none
}

// fileLayer is a file pushed as it is, read twice (to hash, to send)
// rather than held in memory: disks are gigabytes.
type fileLayer struct {
	path      string
	mediaType types.MediaType
	digest    v1.Hash
	size      int64
}

func newFileLayer(path string, mt types.MediaType) (*fileLayer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return nil, err
	}
	return &fileLayer{path: path, mediaType: mt, size: n,
		digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}}, nil
}

func (l *fileLayer) Digest() (v1.Hash, error)             { return l.digest, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)             { return l.digest, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error)   { return os.Open(l.path) }
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) { return os.Open(l.path) }
func (l *fileLayer) Size() (int64, error)                 { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error)  { return l.mediaType, nil }

// rawManifest is a manifest remote.Put can send as it is.
type rawManifest []byte

func (m rawManifest) RawManifest() ([]byte, error)        { return m, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

// Push uploads a VM image to ref and returns its manifest digest.
func Push(ref name.Reference, files Files, cfg Config, opts ...remote.Option) (v1.Hash, error) {
	if files.Disk == "" && files.Kernel == "" {
		return v1.Hash{}, fmt.Errorf("a VM image needs a disk or a kernel")
	}
	if files.Initrd != "" && files.Kernel == "" {
		return v1.Hash{}, fmt.Errorf("an initrd needs a kernel")
	}
	var layers []v1.Layer
	for _, f := range []struct {
		path string
		mt   types.MediaType
	}{{files.Disk, DiskType}, {files.Kernel, KernelType}, {files.Initrd, InitrdType}} {
		if f.path == "" {
			continue
		}
		l, err := newFileLayer(f.path, f.mt)
		if err != nil {
			return v1.Hash{}, err
		}
		layers = append(layers, l)
	}
	rawCfg, _ := json.Marshal(cfg)
	cfgLayer := static.NewLayer(rawCfg, ConfigType)
	m := manifest{SchemaVersion: 2, MediaType: string(types.OCIManifestSchema1), ArtifactType: ArtifactType}
	for _, l := range append([]v1.Layer{cfgLayer}, layers...) {
		if err := remote.WriteLayer(ref.Context(), l, opts...); err != nil {
			return v1.Hash{}, err
		}
		d, _ := l.Digest()
		size, _ := l.Size()
		mt, _ := l.MediaType()
		desc := descriptor{MediaType: string(mt), Digest: d.String(), Size: size}
		if l == cfgLayer {
			m.Config = desc
		} else {
			m.Layers = append(m.Layers, desc)
		}
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := remote.Put(ref, rawManifest(raw), opts...); err != nil {
		return v1.Hash{}, err
	}
	sum := sha256.Sum256(raw)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}, nil
}
