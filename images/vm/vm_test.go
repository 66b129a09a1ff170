package vm_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/edgebox/edgebox/images/registry"
	"github.com/edgebox/edgebox/images/vm"
)

// cutter serves a registry but ends the first blob answers after limit
// bytes, as a dropped link would.
type cutter struct {
	next  http.Handler
	limit int64
	cuts  atomic.Int64
	sent  atomic.Int64 // blob bytes served
	left  atomic.Int64 // cuts still to make
	flip  atomic.Bool  // corrupt blob bytes
}

type cutWriter struct {
	http.ResponseWriter
	c    *cutter
	n    int64
	flip bool
}

func (w *cutWriter) Write(p []byte) (int, error) {
	if w.flip && len(p) > 0 {
		p = append([]byte(nil), p...)
		p[0] ^= 0xff
	}
	if w.n+int64(len(p)) > w.c.limit && w.c.left.Add(-1) >= 0 {
		w.c.cuts.Add(1)
		w.c.sent.Add(w.c.limit - w.n)
		w.ResponseWriter.Write(p[:w.c.limit-w.n])
		panic(http.ErrAbortHandler) // the connection drops
	}
	n, err := w.ResponseWriter.Write(p)
	w.n += int64(n)
	w.c.sent.Add(int64(n))
	return n, err
}

func (c *cutter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.Contains(r.URL.Path, "/blobs/") || r.Method != http.MethodGet {
		c.next.ServeHTTP(w, r)
		return
	}
	c.next.ServeHTTP(&cutWriter{ResponseWriter: w, c: c, flip: c.flip.Load()}, r)
}

func TestFetchResumesAndChecks(t *testing.T) {
	t.Parallel()
	reg, err := registry.Open(context.Background(), t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	c := &cutter{next: reg, limit: 300 << 10}
	srv := httptest.NewServer(c)
	defer srv.Close()
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.qcow2")
	data := make([]byte, 1<<20)
	rand.Read(data)
	os.WriteFile(disk, data, 0o644)
	host := strings.TrimPrefix(srv.URL, "http://")
	tag, _ := name.ParseReference(host+"/vm/test:1", name.Insecure)
	d, err := vm.Push(tag, vm.Files{Disk: disk}, vm.Config{CPUs: 2})
	if err != nil {
		t.Fatal(err)
	}
	ref := vm.Ref{Base: srv.URL, Repo: "vm/test", Digest: d.String()}
	out := filepath.Join(t.TempDir(), "img")

	// Three cuts of 300 KiB: it takes four tries, each going on from
	// where the last stopped.
	c.left.Store(3)
	tries := 0
	for {
		tries++
		err := vm.Fetch(context.Background(), srv.Client(), ref, out, nil)
		if err == nil {
			break
		}
		if tries > 10 {
			t.Fatalf("no progress after %d tries: %v", tries, err)
		}
	}
	got, err := os.ReadFile(filepath.Join(out, vm.DiskFile))
	if err != nil || string(got) != string(data) || tries != 4 || c.cuts.Load() != 3 {
		t.Fatalf("after %d tries and %d cuts: %d bytes, %v", tries, c.cuts.Load(), len(got), err)
	}
	// Starting over each time would have sent 900 KiB more.
	if sent := c.sent.Load(); sent > int64(len(data))+(64<<10) {
		t.Fatalf("%d bytes sent for a %d byte disk: the fetch did not resume", sent, len(data))
	}
	if _, err := os.Stat(filepath.Join(out, vm.ConfigFile)); err != nil {
		t.Fatal(err)
	}

	// Bytes changed on the way are refused, and nothing is kept.
	c.flip.Store(true)
	bad := filepath.Join(t.TempDir(), "bad")
	err = vm.Fetch(context.Background(), srv.Client(), ref, bad, nil)
	if err == nil || !strings.Contains(err.Error(), "digest") {
		t.Fatalf("corrupted fetch: %v", err)
	}
	if _, err := os.Stat(filepath.Join(bad, vm.DiskFile)); err == nil {
		t.Fatal("a corrupted disk was kept")
	}
	if _, err := os.Stat(filepath.Join(bad, vm.ConfigFile)); err == nil {
		t.Fatal("a corrupted image was marked complete")
	}
}

func TestParseRef(t *testing.T) {
	t.Parallel()
	const d = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	r, err := vm.ParseRef("console.example:8443/robots/win10:2@" + d)
	if err != nil || r.Base != "https://console.example:8443" || r.Repo != "robots/win10" || r.Digest != d {
		t.Fatalf("%+v %v", r, err)
	}
	for _, bad := range []string{"", "robots/win10:2", "host/repo@sha256:xyz", "@" + d, "host@" + d, "h/r@sha512:" + d[7:]} {
		if _, err := vm.ParseRef(bad); err == nil {
			t.Errorf("ParseRef(%q) accepted", bad)
		}
	}
}

// FuzzFetch: whatever manifest and blobs a registry answers with, Fetch
// returns an error or a complete image; it never panics, and never keeps a
// file whose digest is wrong.
func FuzzFetch(f *testing.F) {
	f.Add([]byte(`{"schemaVersion":2,"artifactType":"application/vnd.edgebox.vm.v1","config":{"mediaType":"application/vnd.edgebox.vm.config.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"layers":[{"mediaType":"application/vnd.edgebox.vm.disk.qcow2","digest":"sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824","size":5}]}`), []byte("{}"), []byte("hello"))
	f.Add([]byte(`{"layers":[{"mediaType":"application/vnd.edgebox.vm.kernel","digest":"sha256:x","size":-1}]}`), []byte(""), []byte(""))
	f.Fuzz(func(t *testing.T, manifest, config, blob []byte) {
		md := sha256Hex(manifest)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case strings.Contains(r.URL.Path, "/manifests/"):
				w.Write(manifest)
			case strings.HasSuffix(r.URL.Path, sha256Hex(config)):
				w.Write(config)
			case strings.Contains(r.URL.Path, "/blobs/"):
				w.Write(blob)
			}
		}))
		defer srv.Close()
		dir := t.TempDir()
		err := vm.Fetch(context.Background(), srv.Client(), vm.Ref{Base: srv.URL, Repo: "r", Digest: md}, dir, nil)
		if err != nil {
			return
		}
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if e.Name() == vm.ConfigFile {
				continue
			}
			raw, _ := os.ReadFile(filepath.Join(dir, e.Name()))
			if !strings.Contains(string(manifest), sha256Hex(raw)) {
				t.Fatalf("kept %s whose digest the manifest does not name", e.Name())
			}
		}
	})
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}
