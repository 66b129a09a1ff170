package registry

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

// newTestRegistry opens a registry for one test, logging to its output.
func newTestRegistry(t *testing.T, cfg Config) *Registry {
	t.Helper()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	reg, err := New(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	return reg
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// serveOperators serves reg's operators' door over HTTP/1 on loopback;
// every caller is let in and sees what sees lets it.
func serveOperators(t *testing.T, reg *Registry, sees func(string) bool) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(reg.Operators(func(*http.Request) (Access, error) { return Access{Sees: sees}, nil }))
	t.Cleanup(srv.Close)
	return srv
}

// startUpload opens an upload session and returns its URL.
func startUpload(t *testing.T, c *http.Client, base, repo string) string {
	t.Helper()
	resp, err := c.Post(base+"/v2/"+repo+"/blobs/uploads/", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("starting an upload: %s", resp.Status)
	}
	loc, err := resp.Location()
	if err != nil {
		t.Fatal(err)
	}
	return loc.String()
}

// finishUpload sends blob whole to the upload session at loc, ending it,
// and fails t, saying where, unless the blob is made.
func finishUpload(t *testing.T, c *http.Client, loc *url.URL, blob []byte, where string) {
	t.Helper()
	u := *loc
	q := u.Query()
	q.Set("digest", digest.FromBytes(blob).String())
	u.RawQuery = q.Encode()
	req, _ := http.NewRequest(http.MethodPut, u.String(), bytes.NewReader(blob))
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("%s: %s %s", where, resp.Status, body)
	}
}

// readBlob fails t, saying where, unless base serves blob in repo.
func readBlob(t *testing.T, c *http.Client, base, repo string, blob []byte, where string) {
	t.Helper()
	resp, err := c.Get(base + "/v2/" + repo + "/blobs/" + digest.FromBytes(blob).String())
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, blob) {
		t.Fatalf("%s: %s, %d bytes of %d", where, resp.Status, len(got), len(blob))
	}
}

// TestRequestBodies: a body that stops coming is cut once BodyIdle has
// passed without a byte, and not before; a body that trickles, one byte
// every half BodyIdle, is read to its end over several BodyIdle. Over
// HTTP/1 and HTTP/2.
func TestRequestBodies(t *testing.T) {
	t.Parallel()
	const idle = 3 * time.Second
	cfg := DefaultConfig(t.TempDir())
	cfg.BodyIdle = idle
	reg := newTestRegistry(t, cfg)
	h := reg.Operators(func(*http.Request) (Access, error) { return Access{}, nil })
	h1 := httptest.NewServer(h)
	t.Cleanup(h1.Close)
	h2 := httptest.NewUnstartedServer(h)
	h2.EnableHTTP2 = true
	h2.StartTLS()
	t.Cleanup(h2.Close)

	for _, s := range []struct {
		name string
		srv  *httptest.Server
	}{{"HTTP/1.1", h1}, {"HTTP/2", h2}} {
		t.Run(s.name+"/stalled", func(t *testing.T) {
			t.Parallel()
			c := s.srv.Client()
			loc := startUpload(t, c, s.srv.URL, "stall")
			pr, pw := io.Pipe()
			defer pw.Close()
			req, _ := http.NewRequest(http.MethodPatch, loc, pr)
			req.ContentLength = 1 << 20
			req.Header.Set("Content-Type", "application/octet-stream")
			var lastByte atomic.Int64
			go func() {
				pw.Write([]byte("0123456789"))
				lastByte.Store(time.Now().UnixNano())
				// then nothing: the body stalls until the test ends
			}()
			type result struct {
				status int
				err    error
			}
			done := make(chan result, 1)
			go func() {
				resp, err := c.Do(req)
				if err != nil {
					done <- result{0, err}
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				done <- result{resp.StatusCode, nil}
			}()
			select {
			case r := <-done:
				stalled := time.Since(time.Unix(0, lastByte.Load()))
				t.Logf("stalled body cut after %s without a byte: status %d, %v", stalled.Round(time.Millisecond), r.status, r.err)
				if r.err == nil && r.status < 400 {
					t.Errorf("stalled upload answered %d", r.status)
				}
				if stalled < idle-idle/10 {
					t.Errorf("cut after %s without a byte, before the %s allowed", stalled, idle)
				}
			case <-time.After(idle + 30*time.Second):
				t.Fatalf("a body stalled for %s is still held", idle+30*time.Second)
			}
		})
		t.Run(s.name+"/slow", func(t *testing.T) {
			t.Parallel()
			c := s.srv.Client()
			loc := startUpload(t, c, s.srv.URL, "slow")
			const n = 8 // bytes, one every idle/2: four windows
			pr, pw := io.Pipe()
			req, _ := http.NewRequest(http.MethodPatch, loc, pr)
			req.ContentLength = n
			req.Header.Set("Content-Type", "application/octet-stream")
			stop := make(chan struct{})
			writerDone := make(chan struct{})
			go func() {
				defer close(writerDone)
				defer pw.Close()
				for i := range n {
					if _, err := pw.Write([]byte{byte('a' + i)}); err != nil || i == n-1 {
						return
					}
					select {
					case <-time.After(idle / 2):
					case <-stop:
						return
					}
				}
			}()
			defer func() { close(stop); <-writerDone }()
			start := time.Now()
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("slow upload cut after %s: %v", time.Since(start), err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusAccepted || resp.Header.Get("Range") != fmt.Sprintf("0-%d", n-1) {
				t.Fatalf("slow upload after %s: %s %s, range %q", time.Since(start), resp.Status, body, resp.Header.Get("Range"))
			}
			t.Logf("%d bytes, one every %s, all taken in %s", n, idle/2, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestUnreadBodyNotHeld: a request let in whose handler never reads its
// body, which never comes, is answered once BodyIdle has passed, and its
// connection closed: the server's own reading of what is left is bounded
// too.
func TestUnreadBodyNotHeld(t *testing.T) {
	t.Parallel()
	const idle = 2 * time.Second
	cfg := DefaultConfig(t.TempDir())
	cfg.BodyIdle = idle
	reg := newTestRegistry(t, cfg)
	srv := serveOperators(t, reg, nil)
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/v2/"},
		{http.MethodGet, "/v2/robots/icbc/tags/list"},
		{http.MethodGet, "/v2/_catalog"},
		{http.MethodDelete, "/v2/robots/icbc/manifests/" + testDigest},
	} {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(idle + 30*time.Second)) // liveness only
		start := time.Now()
		fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n", c.method, c.path)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s %s with a body that never comes: no answer after %s: %v", c.method, c.path, time.Since(start), err)
		}
		io.Copy(io.Discard, resp.Body)
		if _, err := br.ReadByte(); err != io.EOF {
			t.Errorf("%s %s: connection still open: %v", c.method, c.path, err)
		}
		t.Logf("%s %s: %s after %s, connection closed", c.method, c.path, resp.Status, time.Since(start).Round(time.Millisecond))
		conn.Close()
	}
}

// TestRefusedBeforeTheBody: a caller the door refuses gets its 401 at
// once, from the headers alone, however large a body it announces, and
// not one byte of that body is read; over HTTP/1 the connection then
// closes rather than wait for the body.
func TestRefusedBeforeTheBody(t *testing.T) {
	t.Parallel()
	reg := newTestRegistry(t, DefaultConfig(t.TempDir()))
	var read atomic.Int64
	door := reg.Operators(func(*http.Request) (Access, error) { return Access{}, errors.New("log in first") })
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		req.Body = countingBody{req.Body, &read}
		door.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	for _, path := range []string{
		"/v2/robots/icbc/blobs/uploads/",
		"/v2/robots/icbc/blobs/uploads/3f1c0e2a-11b2-4c5d-9e7f-0123456789ab?_state=x",
		"/v2/robots/icbc/manifests/latest",
		"/v2/" + strings.Repeat("x", 300) + "/manifests/latest",
	} {
		for _, method := range []string{http.MethodPost, http.MethodPatch, http.MethodPut} {
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			conn.SetDeadline(time.Now().Add(30 * time.Second)) // liveness only
			fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", method, path, int64(1)<<40)
			start := time.Now()
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("%s %.50s: no answer: %v", method, path, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("%s %.50s: %s %s, want 401 with a challenge", method, path, resp.Status, body)
			}
			if code := oneError(t, body); code != "UNAUTHORIZED" {
				t.Errorf("%s %.50s: code %q", method, path, code)
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Errorf("%s %.50s: connection left open after refusing a 1 TiB body: %v", method, path, err)
			}
			t.Logf("%s %.50s: %d in %s", method, path, resp.StatusCode, time.Since(start).Round(time.Microsecond))
			conn.Close()
		}
	}
	if n := read.Load(); n != 0 {
		t.Errorf("%d body bytes read from refused requests", n)
	}
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// TestPurgeUploads: an upload session with no write for longer than
// UploadIdle is removed, and answers BLOB_UPLOAD_UNKNOWN after; one that
// started as long ago but was written to since stays and goes on.
func TestPurgeUploads(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig(t.TempDir())
	cfg.UploadIdle = time.Hour
	cfg.PurgeEvery = 50 * time.Millisecond
	reg := newTestRegistry(t, cfg)
	srv := serveOperators(t, reg, nil)
	c := srv.Client()
	patch := func(loc *string, data string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPatch, *loc, strings.NewReader(data))
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if next, err := resp.Location(); err == nil {
			*loc = next.String()
		}
		return resp
	}
	abandoned := startUpload(t, c, srv.URL, "robots/a")
	moving := startUpload(t, c, srv.URL, "robots/b")
	patch(&abandoned, "abc")
	patch(&moving, "abc")
	sessions := func() map[string]bool {
		out := map[string]bool{}
		for _, repo := range []string{"robots/a", "robots/b"} {
			ents, _ := os.ReadDir(filepath.Join(cfg.Dir, "storage/docker/registry/v2/repositories", repo, "_uploads"))
			for _, e := range ents {
				out[repo+"/"+e.Name()] = true
			}
		}
		return out
	}
	if got := sessions(); len(got) != 2 {
		t.Fatalf("upload sessions on disk: %v", got)
	}
	// Both started two hours ago; only the moving one was written to
	// since. Its data stays new meanwhile: aged whole, it could be
	// purged before the write below lands.
	old := time.Now().Add(-2 * time.Hour)
	for _, repo := range []string{"robots/a", "robots/b"} {
		filepath.WalkDir(filepath.Join(cfg.Dir, "storage/docker/registry/v2/repositories", repo, "_uploads"),
			func(p string, d os.DirEntry, err error) error {
				if err == nil && !(repo == "robots/b" && d.Name() == "data") {
					os.Chtimes(p, old, old)
				}
				return nil
			})
	}
	if resp := patch(&moving, "def"); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("writing to the moving upload: %s", resp.Status)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := sessions()
		if len(got) == 1 {
			for s := range got {
				if !strings.HasPrefix(s, "robots/b/") {
					t.Fatalf("the moving upload was purged, the abandoned one kept: %v", got)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("abandoned upload not purged: %v", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if resp := patch(&abandoned, "def"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("writing to the purged upload: %s, want 404", resp.Status)
	}
	if resp := patch(&moving, "ghi"); resp.StatusCode != http.StatusAccepted || resp.Header.Get("Range") != "0-8" {
		t.Errorf("writing to the kept upload: %s, range %q", resp.Status, resp.Header.Get("Range"))
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		edit func(*Config)
	}{
		{"no dir", func(c *Config) { c.Dir = "" }},
		{"no body idle", func(c *Config) { c.BodyIdle = 0 }},
		{"negative upload idle", func(c *Config) { c.UploadIdle = -time.Second }},
		{"no purge interval", func(c *Config) { c.PurgeEvery = 0 }},
	} {
		cfg := DefaultConfig(t.TempDir())
		c.edit(&cfg)
		if _, err := New(context.Background(), cfg, slog.New(slog.DiscardHandler)); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	if err := DefaultConfig("/x").Validate(); err != nil {
		t.Errorf("default: %v", err)
	}
}
