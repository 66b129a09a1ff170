package files

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// chunks feeds Write a header and data, then io.EOF or cut.
func chunks(h *edgeboxv1.FileHeader, data []byte, cut error) func() (*edgeboxv1.FileChunk, error) {
	i, sent := -1, false
	return func() (*edgeboxv1.FileChunk, error) {
		if !sent {
			sent = true
			return &edgeboxv1.FileChunk{Header: h}, nil
		}
		i++
		if i*chunkSize >= len(data) {
			if cut != nil {
				return nil, cut
			}
			return nil, io.EOF
		}
		return &edgeboxv1.FileChunk{Data: data[i*chunkSize : min(len(data), (i+1)*chunkSize)]}, nil
	}
}

func sumOf(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestAnUploadResumesAndLandsWhole(t *testing.T) {
	dir := t.TempDir()
	s := &Server{}
	data := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320,000 bytes
	path := filepath.Join(dir, "robot.cfg")
	h := &edgeboxv1.FileHeader{Path: path, Size: int64(len(data)), Sha256: sumOf(data), Mode: 0o640}

	// The first attempt is cut after 100,000 bytes.
	first := data[:100000]
	info, err := s.Write(chunks(h, first, errors.New("connection reset")))
	if err == nil {
		t.Fatalf("a cut upload answered %v", info)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("a part upload is in place")
	}
	st, err := s.Stat(t.Context(), &edgeboxv1.FileRequest{Path: path})
	if err != nil || st.GetExists() || st.GetPartSize() != 100000 {
		t.Fatalf("stat after the cut: %v %v", st, err)
	}
	// Going on from the wrong place is refused, and says where.
	h2 := &edgeboxv1.FileHeader{Path: path, Size: h.Size, Sha256: h.Sha256, Offset: 5, Mode: 0o640}
	if _, err := s.Write(chunks(h2, data[5:], nil)); status.Code(err) != codes.FailedPrecondition && status.Code(err) != codes.Aborted && !strings.Contains(err.Error(), "holds 100000 bytes") {
		t.Fatalf("a wrong offset: %v", err)
	}
	h2.Offset = st.GetPartSize()
	info, err = s.Write(chunks(h2, data[h2.Offset:], nil))
	if err != nil || !info.GetComplete() {
		t.Fatalf("the rest: %v %v", info, err)
	}
	got, _ := os.ReadFile(path)
	fi, _ := os.Stat(path)
	if !bytes.Equal(got, data) || fi.Mode().Perm() != 0o640 {
		t.Fatalf("landed %d bytes, mode %v", len(got), fi.Mode())
	}
	if _, err := os.Stat(path + PartSuffix); !os.IsNotExist(err) {
		t.Fatal("the part is left")
	}
	st, err = s.Stat(t.Context(), &edgeboxv1.FileRequest{Path: path, Sha256: true})
	if err != nil || st.GetSha256() != h.Sha256 || st.GetSize() != int64(len(data)) {
		t.Fatalf("stat: %v %v", st, err)
	}

	// Read it back from an offset.
	var back bytes.Buffer
	err = s.Read(&edgeboxv1.FileRequest{Path: path, Offset: 300000}, func(c *edgeboxv1.FileChunk) error { back.Write(c.GetData()); return nil })
	if err != nil || !bytes.Equal(back.Bytes(), data[300000:]) {
		t.Fatalf("read from 300000: %d bytes, %v", back.Len(), err)
	}
}

func TestABadUploadIsRefused(t *testing.T) {
	dir := t.TempDir()
	s := &Server{MaxSize: 1000}
	path := filepath.Join(dir, "f")
	data := []byte("hello")
	for name, h := range map[string]*edgeboxv1.FileHeader{
		"too big":      {Path: path, Size: 1001, Sha256: sumOf(data)},
		"bad sum":      {Path: path, Size: 5, Sha256: "xyz"},
		"relative":     {Path: "etc/passwd", Size: 5, Sha256: sumOf(data)},
		"offset past":  {Path: path, Size: 5, Offset: 6, Sha256: sumOf(data)},
		"setuid mode":  {Path: path, Size: 5, Sha256: sumOf(data), Mode: 0o4755},
		"bad volume":   {Path: "x", Volume: "../etc", Size: 5, Sha256: sumOf(data)},
		"no such path": {Path: filepath.Join(dir, "no", "such", "dir", "f"), Size: 5, Sha256: sumOf(data)},
	} {
		if _, err := s.Write(chunks(h, data, nil)); err == nil {
			t.Errorf("%s: taken", name)
		}
	}
	// The wrong bytes for the sum: refused, and the part dropped.
	h := &edgeboxv1.FileHeader{Path: path, Size: 5, Sha256: sumOf([]byte("world"))}
	if _, err := s.Write(chunks(h, data, nil)); err == nil || !strings.Contains(err.Error(), "SHA-256") {
		t.Fatalf("a wrong sum: %v", err)
	}
	if _, err := os.Stat(path + PartSuffix); !os.IsNotExist(err) {
		t.Fatal("the bad part is left")
	}
	// More bytes than the header said.
	h = &edgeboxv1.FileHeader{Path: path, Size: 3, Sha256: sumOf(data[:3])}
	if _, err := s.Write(chunks(h, data, nil)); err == nil {
		t.Fatal("more bytes than announced were taken")
	}
}

// TestAVolumeKeepsItsFilesIn: a path within a volume cannot leave it,
// by .. or by a symbolic link.
func TestAVolumeKeepsItsFilesIn(t *testing.T) {
	vols := t.TempDir()
	vol := filepath.Join(vols, "robot", "data")
	os.MkdirAll(vol, 0o755)
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("box secret"), 0o600)
	os.Symlink(secret, filepath.Join(vol, "link"))
	os.Symlink(filepath.Dir(secret), filepath.Join(vol, "dirlink"))
	s := &Server{VolumeDir: vols}
	data := []byte("statement")
	h := &edgeboxv1.FileHeader{Path: "inbox.pdf", Volume: "robot/data", Size: int64(len(data)), Sha256: sumOf(data)}
	if info, err := s.Write(chunks(h, data, nil)); err != nil || !info.GetComplete() {
		t.Fatalf("into the volume: %v %v", info, err)
	}
	if got, _ := os.ReadFile(filepath.Join(vol, "inbox.pdf")); !bytes.Equal(got, data) {
		t.Fatalf("in the volume: %q", got)
	}
	// ".." is taken within the volume: it stays at its root.
	h.Path = "../../../inbox2.pdf"
	if info, err := s.Write(chunks(h, data, nil)); err != nil || !info.GetComplete() {
		t.Fatalf("..: %v %v", info, err)
	}
	if _, err := os.Stat(filepath.Join(vol, "inbox2.pdf")); err != nil {
		t.Fatal("a path with .. left the volume's root")
	}
	for _, p := range []string{"link", "dirlink/secret"} {
		err := s.Read(&edgeboxv1.FileRequest{Path: p, Volume: "robot/data"}, func(*edgeboxv1.FileChunk) error { return nil })
		if err == nil {
			t.Fatalf("read %s through a link out of the volume", p)
		}
	}
	if _, err := s.Stat(t.Context(), &edgeboxv1.FileRequest{Path: "x", Volume: "robot/nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("no such volume: %v", err)
	}
}
