//go:build linux

package integration

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/images/pull"
	"github.com/edgebox/edgebox/internal/test/ctrdtest"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/internal/test/toxic"
	"github.com/edgebox/edgebox/tunnel"
)

// TestImagePulledThroughTheTunnel: an operator pushes an image to the
// console's registry with the API token; a Workload naming it by digest
// makes the box pull it through its tunnel into a real containerd and run
// it. The box may pull nothing else, and nobody pushes without a token.
func TestImagePulledThroughTheTunnel(t *testing.T) {
	d := testenv.Containerd(t, false)
	h := testenv.NewInProcess(t, testenv.Options{})
	box := enrollOne(t, h, "puller")
	testenv.StartAgent(t, box, func(c *agent.Config) { c.Drivers = []runtime.Driver{d}; c.Reconcile = time.Second })

	img := ctrdtest.BusyboxImg(t)
	ref := testenv.PushImage(t, h, "robots/clock:1", img)
	other, err := mutate.Config(img, mustConfig(t, img, "OTHER=1"))
	if err != nil {
		t.Fatal(err)
	}
	otherRef := testenv.PushImage(t, h, "robots/other:1", other)

	// Without a token, no push.
	anon, _ := name.ParseReference(testenv.RegistryHost(h) + "/robots/anon:1")
	err = remote.Write(anon, img, remote.WithTransport(testenv.RegistryTransport(h)))
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("push without a token: %v, want 401 Unauthorized", err)
	}

	spec, _ := json.Marshal(map[string]any{"app": "clock", "release": "1", "runtime": "containerd", "image": ref,
		"env": []string{"GREETING=pulled"}})
	rev, err := h.Admin().PutDesired(ctx(t), box.ID(), "Workload", "clock", spec)
	if err != nil {
		t.Fatal(err)
	}
	took := testenv.WaitFor(t, 120*time.Second, "clock pulled and running", func() bool {
		s, err := h.Admin().BoxState(ctx(t), box.ID())
		if err != nil || len(s.Statuses) != 1 || s.Statuses[0].Phase != "Running" || s.Statuses[0].ObservedRevision != rev {
			return false
		}
		var out bytes.Buffer
		return d.Logs(context.Background(), "clock", 0, &out) == nil && strings.Contains(out.String(), "hello pulled")
	})
	t.Logf("pulled and running %s after the desired state was written", took)
	if ok, err := d.HasImage(context.Background(), ref); !ok || err != nil {
		t.Fatalf("image %s not complete on the box: %v %v", ref, ok, err)
	}

	// The box's own door: what its desired state names, and nothing else.
	hc := pull.NewClient([]string{testenv.RegistryHost(h)}, func(ctx context.Context) (net.Conn, error) {
		return testenv.AgentOf(box).Tunnel().Open(ctx, tunnel.KindRegistry, nil)
	}, nil)
	get := func(path string) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx(t), http.MethodGet, "https://"+testenv.RegistryHost(h)+path, nil)
		req.Header.Set("Accept", "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	manifest := func(r string) string {
		n, err := name.NewDigest(r)
		if err != nil {
			t.Fatal(err)
		}
		return "/v2/" + n.RepositoryStr() + "/manifests/" + n.DigestStr()
	}
	cfgDigest, _ := img.ConfigName()
	for path, want := range map[string]int{
		manifest(ref): http.StatusOK,
		"/v2/robots/clock/blobs/" + cfgDigest.String(): http.StatusOK,
		manifest(otherRef):             http.StatusForbidden,
		"/v2/robots/clock/manifests/1": http.StatusForbidden, // by tag
		"/v2/_catalog":                 http.StatusForbidden,
	} {
		if got := get(path); got != want {
			t.Errorf("box GET %s: %d, want %d", path, got, want)
		}
	}
	req, _ := http.NewRequestWithContext(ctx(t), http.MethodPost, "https://"+testenv.RegistryHost(h)+"/v2/robots/clock/blobs/uploads/", nil)
	if resp, err := hc.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("box push: %v %v, want 403", resp, err)
	}

	// With the console gone and the container lost, the agent brings the
	// workload back from its local store and its image cache.
	box.Stop(t)
	h.StopConsole()
	if err := d.Stop(context.Background(), "clock", time.Second); err != nil {
		t.Fatal(err)
	}
	if err := d.Remove(context.Background(), "clock"); err != nil {
		t.Fatal(err)
	}
	testenv.StartAgent(t, box, func(c *agent.Config) { c.Drivers = []runtime.Driver{d}; c.Reconcile = time.Second })
	testenv.WaitFor(t, 60*time.Second, "clock back without the console", func() bool {
		in, err := d.Inspect(context.Background(), "clock")
		return err == nil && in.State == runtime.StateRunning
	})
}

// randomImage is an image of n uncompressed layers of size random bytes.
func randomImage(t *testing.T, n, size int) v1.Image {
	t.Helper()
	img := empty.Image
	for range n {
		data := make([]byte, size)
		rand.Read(data)
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "blob", Mode: 0o644, Size: int64(size), Typeflag: tar.TypeReg})
		tw.Write(data)
		tw.Close()
		var err error
		if img, err = mutate.AppendLayers(img, static.NewLayer(buf.Bytes(), types.OCIUncompressedLayer)); err != nil {
			t.Fatal(err)
		}
	}
	return img
}

// TestPullResumesAndVerifies: a link that drops every connection after 6
// MB still brings two 8 MB layers over, because each new connection asks
// only for what is missing; a blob corrupted in the console's storage is
// refused with an error that says so.
func TestPullResumesAndVerifies(t *testing.T) {
	d := testenv.Containerd(t, false)
	h := testenv.NewInProcess(t, testenv.Options{})
	box := enrollOne(t, h, "flaky")
	u, _ := url.Parse(h.URL())
	px := toxic.New(t, u.Host)
	if err := px.Add("cut", "limit_data", "downstream", `"bytes": 6000000`); err != nil {
		t.Fatal(err)
	}
	testenv.StartAgent(t, box, func(c *agent.Config) {
		c.Drivers = []runtime.Driver{d}
		c.Reconcile = 500 * time.Millisecond
		c.Backoff = tunnel.Backoff{Min: 100 * time.Millisecond, Max: 500 * time.Millisecond}
		c.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, network, px.Addr())
		}
	})
	img := randomImage(t, 2, 8<<20)
	ref := testenv.PushImage(t, h, "robots/big:1", img)
	put := func(name, image string) {
		spec, _ := json.Marshal(map[string]any{"app": name, "release": "1", "runtime": "containerd", "image": image,
			"args": []string{"/blob"}, "restart": "never"})
		if _, err := h.Admin().PutDesired(ctx(t), box.ID(), "Workload", name, spec); err != nil {
			t.Fatal(err)
		}
	}
	put("big", ref)
	testenv.WaitFor(t, 180*time.Second, "16 MB pulled over a link cut every 6 MB", func() bool {
		ok, err := d.HasImage(context.Background(), ref)
		return ok && err == nil
	})
	s, err := h.Admin().BoxState(ctx(t), box.ID())
	if err != nil {
		t.Fatal(err)
	}
	// Each 8 MB layer is longer than what one connection carries, so the
	// pull can only have finished by asking for the rest of a layer on a
	// new connection (containerd resumes within a pull, or the next pull
	// resumes the ingest).
	failed := 0
	for _, e := range s.Events {
		if e.Reason == "PullFailed" {
			failed++
		}
	}
	t.Logf("pull completed; %d pulls failed on the way and were resumed", failed)
	if err := px.Remove("cut"); err != nil {
		t.Fatal(err)
	}

	// Corrupt one layer in the registry's storage, same size.
	bad := randomImage(t, 1, 1<<20)
	badRef := testenv.PushImage(t, h, "robots/bad:1", bad)
	layers, _ := bad.Layers()
	ld, _ := layers[0].Digest()
	blob := filepath.Join(h.DataDir(), "registry", "storage", "docker", "registry", "v2", "blobs", "sha256", ld.Hex[:2], ld.Hex, "data")
	raw, err := os.ReadFile(blob)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)/2] ^= 0xff
	if err := os.WriteFile(blob, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	put("bad", badRef)
	testenv.WaitFor(t, 60*time.Second, "corrupted blob refused", func() bool {
		s, err := h.Admin().BoxState(ctx(t), box.ID())
		if err != nil {
			return false
		}
		for _, st := range s.Statuses {
			if st.Name == "bad" && st.Phase == "Failed" && strings.Contains(st.Message, "digest") {
				t.Logf("refused: %s", st.Message)
				return true
			}
		}
		return false
	})
	if ok, _ := d.HasImage(context.Background(), badRef); ok {
		t.Error("the corrupted image is on the box")
	}
}

func mustConfig(t *testing.T, img interface {
	ConfigFile() (*v1.ConfigFile, error)
}, env string) v1.Config {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	c.Env = append(append([]string(nil), c.Env...), env)
	return c
}

// registryClient is an HTTP client for the console's registry that sends
// the admin token, the way docker and crane do after a login.
type registryClient struct {
	t    *testing.T
	h    testenv.Harness
	base string
	c    *http.Client
}

func newRegistryClient(t *testing.T, h testenv.Harness) *registryClient {
	return &registryClient{t: t, h: h, base: "https://" + testenv.RegistryHost(h), c: &http.Client{Transport: testenv.RegistryTransport(h)}}
}

func (rc *registryClient) do(method, path, contentType string, body io.Reader) (*http.Response, []byte) {
	rc.t.Helper()
	req, err := http.NewRequestWithContext(ctx(rc.t), method, rc.base+path, body)
	if err != nil {
		rc.t.Fatal(err)
	}
	req.SetBasicAuth("edgebox", rc.h.AdminToken())
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := rc.c.Do(req)
	if err != nil {
		rc.t.Fatalf("%s %.80s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// registryErrorCode checks that body is exactly one error document of the
// distribution API and returns its one code.
func registryErrorCode(t *testing.T, body []byte) string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(body))
	var doc struct {
		Errors []struct{ Code, Message string } `json:"errors"`
	}
	if err := dec.Decode(&doc); err != nil || len(doc.Errors) != 1 || doc.Errors[0].Message == "" {
		t.Errorf("error body %.200q: %v", body, err)
		return ""
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Errorf("error body %.300q holds more than one document", body)
	}
	return doc.Errors[0].Code
}

// TestRegistryStandards holds the console's registry against the OCI
// distribution spec v1.1 where it fell short: artifacts attached to an
// image are found through the referrers API (with artifactType filtering)
// by go-containerregistry, the client crane is made of; the catalog lists
// the repositories, a page at a time; a malformed repository name is a
// 400 NAME_INVALID with one error body, on every route.
func TestRegistryStandards(t *testing.T) {
	h := testenv.NewInProcess(t, testenv.Options{})
	host := testenv.RegistryHost(h)
	rc := newRegistryClient(t, h)
	auth := remote.WithAuth(&authn.Basic{Username: "edgebox", Password: h.AdminToken()})
	tr := remote.WithTransport(testenv.RegistryTransport(h))

	subject := randomImage(t, 1, 1024)
	subjectRef := testenv.PushImage(t, h, "robots/icbc:1.2", subject)
	sd, _ := subject.Digest()
	ssize, _ := subject.Size()
	attach := func(tag, artifactType string) v1.Hash {
		img := mutate.MediaType(randomImage(t, 1, 64), types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, types.MediaType(artifactType))
		img = mutate.Subject(img, v1.Descriptor{MediaType: types.OCIManifestSchema1, Digest: sd, Size: ssize}).(v1.Image)
		testenv.PushImage(t, h, "robots/icbc:"+tag, img)
		d, _ := img.Digest()
		return d
	}
	const sbomType, sigType = "application/spdx+json", "application/vnd.dev.cosign.simplesigning.v1+json"
	sbom := attach("sbom", sbomType)
	sig := attach("sig", sigType)

	t.Run("referrers", func(t *testing.T) {
		d, err := name.NewDigest(subjectRef)
		if err != nil {
			t.Fatal(err)
		}
		idx, err := remote.Referrers(d, auth, tr)
		if err != nil {
			t.Fatal(err)
		}
		m, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		got := map[v1.Hash]string{}
		for _, desc := range m.Manifests {
			got[desc.Digest] = desc.ArtifactType
		}
		if len(got) != 2 || got[sbom] != sbomType || got[sig] != sigType {
			t.Errorf("referrers of %s: %v, want %s (%s) and %s (%s)", sd, got, sbom, sbomType, sig, sigType)
		}
		resp, body := rc.do(http.MethodGet, "/v2/robots/icbc/referrers/"+sd.String()+"?artifactType="+url.QueryEscape(sigType), "", nil)
		var filtered struct {
			Manifests []v1.Descriptor `json:"manifests"`
		}
		json.Unmarshal(body, &filtered)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("OCI-Filters-Applied") != "artifactType" ||
			len(filtered.Manifests) != 1 || filtered.Manifests[0].Digest != sig {
			t.Errorf("referrers filtered by %s: %s %q %s", sigType, resp.Status, resp.Header.Get("OCI-Filters-Applied"), body)
		}
		// The push answered OCI-Subject: go-containerregistry made no
		// fallback tag.
		tags, err := remote.List(d.Context(), auth, tr)
		if err != nil {
			t.Fatal(err)
		}
		for _, tag := range tags {
			if strings.HasPrefix(tag, "sha256-") {
				t.Errorf("fallback tag %s pushed: the client did not find the referrers API", tag)
			}
		}
		raw, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": types.OCIImageIndex, "artifactType": "application/vnd.example.bundle",
			"manifests": []any{}, "subject": map[string]any{"mediaType": types.OCIManifestSchema1, "digest": sd.String(), "size": ssize}})
		resp, body = rc.do(http.MethodPut, "/v2/robots/icbc/manifests/bundle", string(types.OCIImageIndex), bytes.NewReader(raw))
		if resp.StatusCode != http.StatusCreated || resp.Header.Get("OCI-Subject") != sd.String() {
			t.Errorf("PUT of an index with a subject: %s %s, OCI-Subject %q", resp.Status, body, resp.Header.Get("OCI-Subject"))
		}
	})

	t.Run("catalog", func(t *testing.T) {
		testenv.PushImage(t, h, "robots/abc:1", subject)
		testenv.PushImage(t, h, "zeta/x:1", subject)
		resp, body := rc.do(http.MethodGet, "/v2/_catalog?n=1000", "", nil)
		var doc struct{ Repositories []string }
		json.Unmarshal(body, &doc)
		want := []string{"robots/abc", "robots/icbc", "zeta/x"}
		if resp.StatusCode != http.StatusOK || !slices.Equal(doc.Repositories, want) {
			t.Errorf("catalog?n=1000: %s %s, want %q", resp.Status, body, want)
		}
		r, _ := name.NewRegistry(host)
		all, err := remote.Catalog(ctx(t), r, auth, tr, remote.WithPageSize(1))
		if err != nil || !slices.Equal(all, want) {
			t.Errorf("remote.Catalog one at a time: %q, %v", all, err)
		}
	})

	t.Run("names", func(t *testing.T) {
		const dg = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
		long := strings.Repeat("a", 256)
		for _, c := range []struct{ method, path string }{
			{http.MethodGet, "/v2/" + long + "/manifests/latest"},
			{http.MethodHead, "/v2/" + long + "/manifests/" + dg},
			{http.MethodPut, "/v2/" + long + "/manifests/latest"},
			{http.MethodDelete, "/v2/" + long + "/manifests/" + dg},
			{http.MethodGet, "/v2/" + long + "/tags/list"},
			{http.MethodGet, "/v2/" + long + "/blobs/" + dg},
			{http.MethodPost, "/v2/" + long + "/blobs/uploads/"},
			{http.MethodPatch, "/v2/" + long + "/blobs/uploads/0c3e4b0e-1f0a-4a39-a7a5-5b0d8b5d2c11"},
			{http.MethodGet, "/v2/" + long + "/referrers/" + dg},
			{http.MethodGet, "/v2/" + strings.Repeat("robots/", 37) + "x/tags/list"},
			{http.MethodGet, "/v2/Robots/ICBC/tags/list"},
			{http.MethodGet, "/v2/robots//icbc/tags/list"},
			{http.MethodGet, "/v2/robots/../icbc/tags/list"},
			{http.MethodPut, "/v2/robots/ic%24bc/manifests/latest"},
		} {
			resp, body := rc.do(c.method, c.path, "application/vnd.oci.image.manifest.v1+json", strings.NewReader("{}"))
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("%s %.60s…: %s, want 400", c.method, c.path, resp.Status)
				continue
			}
			if c.method != http.MethodHead {
				if code := registryErrorCode(t, body); code != "NAME_INVALID" {
					t.Errorf("%s %.60s…: %s, want NAME_INVALID", c.method, c.path, code)
				}
			}
		}
	})
}

// TestRegistryRequestBodies: a registry request whose body never comes is
// not held. Without a token it is answered 401 at once, from its headers,
// and the connection closes without reading the terabyte it announced;
// with a token, an upload that stalls is cut once the registry's idle
// window (30 s) has passed without a byte.
func TestRegistryRequestBodies(t *testing.T) {
	h := testenv.NewInProcess(t, testenv.Options{})
	host := testenv.RegistryHost(h)
	rc := newRegistryClient(t, h)

	t.Run("unauthenticated", func(t *testing.T) {
		t.Parallel()
		for _, path := range []string{"/v2/robots/icbc/blobs/uploads/", "/v2/robots/icbc/manifests/latest",
			"/v2/robots/icbc/blobs/uploads/0c3e4b0e-1f0a-4a39-a7a5-5b0d8b5d2c11"} {
			for _, method := range []string{http.MethodPut, http.MethodPost, http.MethodPatch} {
				conn, err := tls.Dial("tcp", host, &tls.Config{RootCAs: testenv.RegistryTransport(h).TLSClientConfig.RootCAs, NextProtos: []string{"http/1.1"}})
				if err != nil {
					t.Fatal(err)
				}
				conn.SetDeadline(time.Now().Add(30 * time.Second)) // liveness only
				start := time.Now()
				fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", method, path, host, int64(1)<<40)
				br := bufio.NewReader(conn)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("%s %s: no answer before the body: %v", method, path, err)
				}
				body, _ := io.ReadAll(resp.Body)
				took := time.Since(start)
				if resp.StatusCode != http.StatusUnauthorized || registryErrorCode(t, body) != "UNAUTHORIZED" {
					t.Errorf("%s %s without a token: %s %s", method, path, resp.Status, body)
				}
				if _, err := br.ReadByte(); err != io.EOF {
					t.Errorf("%s %s: connection not closed after the 401: %v", method, path, err)
				}
				t.Logf("%s %s: 401 after %s, connection closed", method, path, took.Round(time.Microsecond))
				conn.Close()
			}
		}
	})

	t.Run("stalled upload", func(t *testing.T) {
		t.Parallel()
		resp, body := rc.do(http.MethodPost, "/v2/robots/stall/blobs/uploads/", "", nil)
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("starting an upload: %s %s", resp.Status, body)
		}
		loc, err := resp.Location()
		if err != nil {
			t.Fatal(err)
		}
		pr, pw := io.Pipe()
		defer pw.Close()
		// No deadline of the client's own: only the console may end this.
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPatch, loc.String(), pr)
		req.SetBasicAuth("edgebox", h.AdminToken())
		req.ContentLength = 1 << 30
		req.Header.Set("Content-Type", "application/octet-stream")
		go pw.Write(make([]byte, 64<<10)) // then nothing
		start := time.Now()
		done := make(chan error, 1)
		go func() {
			resp, err := rc.c.Do(req)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusRequestTimeout {
					err = fmt.Errorf("answered %s, want 408", resp.Status)
				} else {
					t.Logf("stalled upload answered %s", resp.Status)
				}
			} else {
				t.Logf("stalled upload cut by the console: %v", err)
				err = nil
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("stalled upload: %v", err)
			}
			t.Logf("stalled upload cut after %s", time.Since(start).Round(time.Millisecond))
			if took := time.Since(start); took < 25*time.Second {
				t.Errorf("stalled upload cut after %s, before its 30 s", took)
			}
		case <-time.After(90 * time.Second):
			t.Fatal("an upload stalled for 90 s is still held")
		}
	})
}
