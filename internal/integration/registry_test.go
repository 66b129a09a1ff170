//go:build linux

package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	"github.com/edgebox/edgebox/internal/ctrdtest"
	"github.com/edgebox/edgebox/internal/testenv"
	"github.com/edgebox/edgebox/internal/toxic"
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
