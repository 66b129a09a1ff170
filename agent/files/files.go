// Package files serves the console's file copies on a box
// (AgentService.StatFile, ReadFile, WriteFile): to and from the box's file
// system, or a workload's box-local volume.
//
// An upload is resumable and lands whole or not at all: bytes go to
// "<path>.edgebox-part" from where the part ends, and once the part holds
// the whole file with the SHA-256 the uploader named, it is synced and
// renamed into place. A connection cut half way leaves the part; the next
// attempt asks its size (StatFile) and goes on from there. Paths inside a
// volume cannot leave it, symbolic links included (os.Root).
package files

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/errdefs/errgrpc"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// PartSuffix names an upload's part beside its file.
const PartSuffix = ".edgebox-part"

// Bounds.
const (
	chunkSize      = 64 << 10
	defaultMaxSize = 4 << 30
	maxPath        = 4096
)

// Server serves file copies.
type Server struct {
	// VolumeDir holds the workloads' volumes, <app>/<volume> each; ""
	// serves none.
	VolumeDir string
	// MaxSize bounds one uploaded file; 0 is 4 GiB.
	MaxSize int64
}

// place is where a request's file is: a root (a volume's, or the file
// system's) and the name in it.
type place struct {
	root *os.Root // nil: the box's file system, name absolute
	name string
}

func (p place) close() {
	if p.root != nil {
		p.root.Close()
	}
}

func (p place) stat(name string) (fs.FileInfo, error) {
	if p.root != nil {
		return p.root.Stat(name)
	}
	return os.Stat(name)
}

func (p place) open(name string, flag int, perm fs.FileMode) (*os.File, error) {
	if p.root != nil {
		return p.root.OpenFile(name, flag, perm)
	}
	return os.OpenFile(name, flag, perm)
}

func (p place) rename(from, to string) error {
	if p.root != nil {
		return p.root.Rename(from, to)
	}
	return os.Rename(from, to)
}

func (p place) remove(name string) error {
	if p.root != nil {
		return p.root.Remove(name)
	}
	return os.Remove(name)
}

// syncDir makes a rename in name's directory durable.
func (p place) syncDir(name string) {
	var d *os.File
	var err error
	if p.root != nil {
		d, err = p.root.Open(path.Dir(name))
	} else {
		d, err = os.Open(filepath.Dir(name))
	}
	if err == nil {
		d.Sync()
		d.Close()
	}
}

// resolve finds a request's file.
func (s *Server) resolve(p, volume string) (place, error) {
	if p == "" || len(p) > maxPath || strings.ContainsRune(p, 0) {
		return place{}, errdefs.Invalid("path %q: give a path of 1 to %d bytes", truncate(p), maxPath)
	}
	if volume == "" {
		if !filepath.IsAbs(p) {
			return place{}, errdefs.Invalid("path %q on the box must be absolute (or name a --volume)", truncate(p))
		}
		return place{name: filepath.Clean(p)}, nil
	}
	app, vol, ok := strings.Cut(volume, "/")
	if !ok || !edgeboxv1.ValidObjectName(app) || !edgeboxv1.ValidObjectName(vol) {
		return place{}, errdefs.Invalid("volume %q: use APP/VOLUME", truncate(volume))
	}
	if s.VolumeDir == "" {
		return place{}, errdefs.NotFound("this box keeps no volumes")
	}
	dir := filepath.Join(s.VolumeDir, app, vol)
	root, err := os.OpenRoot(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return place{}, errdefs.NotFound("no volume %s on this box", volume)
	} else if err != nil {
		return place{}, errdefs.Unavailable("volume %s: %v", volume, err)
	}
	name := strings.TrimPrefix(path.Clean("/"+filepath.ToSlash(p)), "/")
	if name == "" {
		name = "."
	}
	return place{root: root, name: name}, nil
}

// Stat says what is at a request's path, and how much of an upload to it
// is there.
func (s *Server) Stat(ctx context.Context, r *edgeboxv1.FileRequest) (*edgeboxv1.FileInfo, error) {
	pl, err := s.resolve(r.GetPath(), r.GetVolume())
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	defer pl.close()
	out := &edgeboxv1.FileInfo{}
	if fi, err := pl.stat(pl.name); err == nil {
		out.Exists, out.Size, out.Mode, out.MtimeUnix, out.IsDir = true, fi.Size(), uint32(fi.Mode().Perm()), fi.ModTime().Unix(), fi.IsDir()
		if r.GetSha256() && fi.Mode().IsRegular() {
			f, err := pl.open(pl.name, os.O_RDONLY, 0)
			if err != nil {
				return nil, errgrpc.ToGRPC(errdefs.Unavailable("%s: %v", r.GetPath(), err))
			}
			h := sha256.New()
			// Hashing a huge file stops when the call does.
			_, err = io.Copy(h, ctxReader{ctx, f})
			f.Close()
			if err != nil {
				return nil, errgrpc.ToGRPC(errdefs.Unavailable("%s: %v", r.GetPath(), err))
			}
			out.Sha256 = hex.EncodeToString(h.Sum(nil))
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, errgrpc.ToGRPC(errdefs.Unavailable("%s: %v", r.GetPath(), err))
	}
	if fi, err := pl.stat(pl.name + PartSuffix); err == nil && fi.Mode().IsRegular() {
		out.PartSize = fi.Size()
	}
	return out, nil
}

// Read sends a file's bytes from the request's offset.
func (s *Server) Read(r *edgeboxv1.FileRequest, send func(*edgeboxv1.FileChunk) error) error {
	pl, err := s.resolve(r.GetPath(), r.GetVolume())
	if err != nil {
		return errgrpc.ToGRPC(err)
	}
	defer pl.close()
	f, err := pl.open(pl.name, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return errgrpc.ToGRPC(errdefs.NotFound("no file %s on the box", r.GetPath()))
	} else if err != nil {
		return errgrpc.ToGRPC(errdefs.Unavailable("%s: %v", r.GetPath(), err))
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return errgrpc.ToGRPC(errdefs.Invalid("%s is not a file", r.GetPath()))
	}
	if r.GetOffset() < 0 {
		return errgrpc.ToGRPC(errdefs.Invalid("offset %d", r.GetOffset()))
	}
	if _, err := f.Seek(r.GetOffset(), io.SeekStart); err != nil {
		return errgrpc.ToGRPC(errdefs.Invalid("offset %d: %v", r.GetOffset(), err))
	}
	buf := make([]byte, chunkSize)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if serr := send(&edgeboxv1.FileChunk{Data: buf[:n]}); serr != nil {
				return serr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return errgrpc.ToGRPC(errdefs.Unavailable("%s: %v", r.GetPath(), err))
		}
	}
}

// Write takes an upload's chunks (recv returns io.EOF after the last)
// and says how far the part is, and whether the file is whole and in
// place.
func (s *Server) Write(recv func() (*edgeboxv1.FileChunk, error)) (*edgeboxv1.FileInfo, error) {
	first, err := recv()
	if err != nil {
		return nil, err
	}
	h := first.GetHeader()
	if h == nil {
		return nil, errgrpc.ToGRPC(errdefs.Invalid("an upload begins with its header"))
	}
	maxSize := s.MaxSize
	if maxSize <= 0 {
		maxSize = defaultMaxSize
	}
	sum, err := hex.DecodeString(h.GetSha256())
	switch {
	case h.GetSize() < 0 || h.GetSize() > maxSize:
		return nil, errgrpc.ToGRPC(errdefs.Invalid("a file of %d bytes; this box takes at most %d", h.GetSize(), maxSize))
	case h.GetOffset() < 0 || h.GetOffset() > h.GetSize():
		return nil, errgrpc.ToGRPC(errdefs.Invalid("offset %d of a file of %d bytes", h.GetOffset(), h.GetSize()))
	case err != nil || len(sum) != sha256.Size:
		return nil, errgrpc.ToGRPC(errdefs.Invalid("the file's SHA-256 must be 64 hex digits"))
	case h.GetMode()&^0o777 != 0:
		return nil, errgrpc.ToGRPC(errdefs.Invalid("mode %o: permission bits only", h.GetMode()))
	}
	pl, err := s.resolve(h.GetPath(), h.GetVolume())
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	defer pl.close()
	part := pl.name + PartSuffix
	f, err := pl.open(part, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, errgrpc.ToGRPC(errdefs.Unavailable("%s: %v", h.GetPath(), err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, errgrpc.ToGRPC(errdefs.Unavailable("%s: %v", h.GetPath(), err))
	}
	if fi.Size() != h.GetOffset() {
		return nil, errgrpc.ToGRPC(errdefs.Conflict("the upload's part holds %d bytes, not %d: go on from there", fi.Size(), h.GetOffset()))
	}
	if _, err := f.Seek(h.GetOffset(), io.SeekStart); err != nil {
		return nil, errgrpc.ToGRPC(errdefs.Unavailable("%s: %v", h.GetPath(), err))
	}
	have := h.GetOffset()
	for {
		c, err := recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// The uploader went: what arrived is kept, for the next try.
			f.Sync()
			return nil, err
		}
		d := c.GetData()
		if len(d) > chunkSize || have+int64(len(d)) > h.GetSize() {
			f.Sync()
			return nil, errgrpc.ToGRPC(errdefs.Invalid("more bytes than the file's %d, or a chunk over %d", h.GetSize(), chunkSize))
		}
		if _, err := f.Write(d); err != nil {
			return nil, errgrpc.ToGRPC(errdefs.Unavailable("%s: %v", h.GetPath(), err))
		}
		have += int64(len(d))
	}
	if err := f.Sync(); err != nil {
		return nil, errgrpc.ToGRPC(errdefs.Unavailable("%s: %v", h.GetPath(), err))
	}
	out := &edgeboxv1.FileInfo{PartSize: have}
	if have < h.GetSize() {
		return out, nil
	}
	// Whole: check it, then put it in place.
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, errgrpc.ToGRPC(errdefs.Unavailable("%s: %v", h.GetPath(), err))
	}
	hs := sha256.New()
	rf, err := pl.open(part, os.O_RDONLY, 0)
	if err == nil {
		_, err = io.Copy(hs, rf)
		rf.Close()
	}
	if err != nil {
		return nil, errgrpc.ToGRPC(errdefs.Unavailable("%s: %v", h.GetPath(), err))
	}
	if got := hs.Sum(nil); hex.EncodeToString(got) != strings.ToLower(h.GetSha256()) {
		pl.remove(part)
		return nil, errgrpc.ToGRPC(errdefs.Invalid("the uploaded bytes' SHA-256 is %x, not %s: the part is dropped; upload it again", got, h.GetSha256()))
	}
	mode := fs.FileMode(h.GetMode())
	if mode == 0 {
		mode = 0o644
	}
	if err := f.Chmod(mode); err != nil {
		return nil, errgrpc.ToGRPC(errdefs.Unavailable("%s: %v", h.GetPath(), err))
	}
	if err := pl.rename(part, pl.name); err != nil {
		return nil, errgrpc.ToGRPC(errdefs.Unavailable("%s: %v", h.GetPath(), err))
	}
	pl.syncDir(pl.name)
	out.Complete, out.Exists, out.Size, out.Sha256, out.PartSize = true, true, have, strings.ToLower(h.GetSha256()), 0
	return out, nil
}

// ctxReader reads r until ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
