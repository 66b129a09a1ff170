//go:build linux

package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/images/pull"
	"github.com/edgebox/edgebox/internal/test/ctrdtest"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/tunnel"
)

// bearer adds an API token to every request: an operator's direct pull.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// BenchmarkPull fetches a 200 MB image (4 layers of 50 MB of random bytes)
// from the console's registry into a real containerd, alternately straight
// over TLS with an API token and through a box's tunnel, and reports both
// rates and their ratio. Fetch only: unpacking is the same work either way.
func BenchmarkPull(b *testing.B) {
	h := testenv.NewInProcess(b, testenv.Options{})
	tok := h.Token(b, api.TokenRequest{Region: "bench", Site: "pull"})
	box, err := h.Enroll(b, tok, "puller")
	if err != nil {
		b.Fatal(err)
	}
	testenv.StartAgent(b, box, nil)
	sock := ctrdtest.Start(b)
	cc, err := client.New(sock)
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()

	const layers, layerBytes = 4, 50 << 20
	img := empty.Image
	for range layers {
		data := make([]byte, layerBytes)
		rand.Read(data)
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "blob", Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg})
		tw.Write(data)
		tw.Close()
		img, err = mutate.AppendLayers(img, static.NewLayer(buf.Bytes(), types.OCIUncompressedLayer))
		if err != nil {
			b.Fatal(err)
		}
	}
	ref := testenv.PushImage(b, h, "bench/big:1", img)
	size := int64(layers * layerBytes)
	// The box may pull only what its desired state names. Its agent has no
	// runtime for the workload and leaves it alone.
	spec := []byte(`{"app":"big","release":"1","runtime":"qemu","image":"` + ref + `"}`)
	if _, err := h.Admin().PutDesired(context.Background(), box.ID(), "Workload", "big", spec); err != nil {
		b.Fatal(err)
	}

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(h.CAPEM())
	directTr := http.DefaultTransport.(*http.Transport).Clone()
	directTr.TLSClientConfig = &tls.Config{RootCAs: pool}
	direct := &http.Client{Transport: bearer{h.AdminToken(), directTr}}
	tunneled := pull.NewClient([]string{testenv.RegistryHost(h)}, func(ctx context.Context) (net.Conn, error) {
		return testenv.AgentOf(box).Tunnel().Open(ctx, tunnel.KindRegistry, nil)
	}, nil)

	ctx := namespaces.WithNamespace(context.Background(), "bench")
	fetch := func(hc *http.Client, scheme string) float64 {
		resolver := docker.NewResolver(docker.ResolverOptions{Hosts: func(host string) ([]docker.RegistryHost, error) {
			return []docker.RegistryHost{{Client: hc, Host: host, Scheme: scheme, Path: "/v2",
				Capabilities: docker.HostCapabilityPull | docker.HostCapabilityResolve}}, nil
		}})
		t0 := time.Now()
		if _, err := cc.Fetch(ctx, ref, client.WithResolver(resolver)); err != nil {
			b.Fatal(err)
		}
		rate := float64(size) / time.Since(t0).Seconds() / 1e6
		// Forget it all, so the next fetch starts from nothing.
		var blobs []digest.Digest
		if err := cc.ContentStore().Walk(ctx, func(info content.Info) error { blobs = append(blobs, info.Digest); return nil }); err != nil {
			b.Fatal(err)
		}
		for _, d := range blobs {
			if err := cc.ContentStore().Delete(ctx, d); err != nil {
				b.Fatalf("forgetting %s: %v", d, err)
			}
		}
		// Collect the garbage now: a blob still on disk would be taken
		// as fetched by the next round.
		l, err := cc.LeasesService().Create(ctx, leases.WithRandomID())
		if err != nil {
			b.Fatal(err)
		}
		if err := cc.LeasesService().Delete(ctx, l, leases.SynchronousDelete); err != nil {
			b.Fatal(err)
		}
		return rate
	}
	var directRates, tunnelRates []float64
	for range b.N {
		for range 3 {
			directRates = append(directRates, fetch(direct, "https"))
			tunnelRates = append(tunnelRates, fetch(tunneled, "https"))
		}
	}
	d, tn := median(directRates), median(tunnelRates)
	b.ReportMetric(d, "direct-MB/s")
	b.ReportMetric(tn, "tunnel-MB/s")
	b.ReportMetric(tn/d, "tunnel/direct")
	b.Logf("200 MB fetch: direct TLS %.0f MB/s %v, tunnel %.0f MB/s %v, ratio %.2f", d, round(directRates), tn, round(tunnelRates), tn/d)
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func round(xs []float64) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = fmt.Sprintf("%.0f", x)
	}
	return out
}

// BenchmarkDeploy measures, with a real containerd and the image already
// on the box, the time from the deploy API call to the new release
// Running in the console's status, over 20 deploys of new releases.
func BenchmarkDeploy(b *testing.B) {
	h := testenv.NewInProcess(b, testenv.Options{})
	d := testenv.Containerd(b, false)
	box, err := h.Enroll(b, h.Token(b, api.TokenRequest{Region: "bench", Site: "deploy"}), "deployer")
	if err != nil {
		b.Fatal(err)
	}
	testenv.StartAgent(b, box, func(c *agent.Config) { c.Drivers = []runtime.Driver{d} })
	image := testenv.PushImage(b, h, "bench/clock:1", ctrdtest.BusyboxImg(b))
	admin := h.Admin()
	ctx := context.Background()
	if _, err := admin.CreateApp(ctx, "clock", ""); err != nil {
		b.Fatal(err)
	}
	deploy := func(v string) time.Duration {
		if _, err := admin.CreateRelease(ctx, "clock", api.ReleaseSpec{Version: v, Runtime: "containerd", Image: image,
			Env: []string{"GREETING=" + v}}); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if _, err := admin.Deploy(ctx, "clock", v, "box", box.ID()); err != nil {
			b.Fatal(err)
		}
		for {
			s, err := admin.AppStatus(ctx, "clock")
			if err == nil && len(s.Boxes) == 1 && s.Boxes[0].RunningRelease == v && s.Boxes[0].Phase == "Running" {
				return time.Since(t0)
			}
			if time.Since(t0) > time.Minute {
				b.Fatalf("release %s not running after a minute: %+v", v, s)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	deploy("warm") // pulls the image
	var took []time.Duration
	for i := range b.N * 20 {
		took = append(took, deploy(fmt.Sprintf("v%d", i)))
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	p50, p90 := took[len(took)/2], took[len(took)*9/10]
	b.ReportMetric(float64(p50.Milliseconds()), "p50-ms")
	b.ReportMetric(float64(p90.Milliseconds()), "p90-ms")
	b.Logf("deploy to Running, cached image, %d deploys: p50 %s, p90 %s, max %s", len(took), p50, p90, took[len(took)-1])
}
