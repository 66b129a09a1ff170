//go:build linux

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/containerd"
	"github.com/edgebox/edgebox/images/pull"
	"github.com/edgebox/edgebox/internal/ctrdtest"
	"github.com/edgebox/edgebox/internal/testenv"
	"github.com/edgebox/edgebox/tunnel"
)

// TestImagePulledThroughTheTunnel: an operator pushes an image to the
// console's registry with the API token; a Workload naming it by digest
// makes the box pull it through its tunnel into a real containerd and run
// it. The box may pull nothing else, and nobody pushes without a token.
func TestImagePulledThroughTheTunnel(t *testing.T) {
	sock := ctrdtest.Start(t)
	d, err := containerd.New(containerd.Config{Address: sock, LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		list, _ := d.List(context.Background())
		for _, in := range list {
			d.Remove(context.Background(), in.Name)
		}
		d.Close()
	})
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
