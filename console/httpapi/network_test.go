package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console/apps"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/auth"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store/storetest"
	"github.com/edgebox/edgebox/images/registry"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// networkAPI is the API over TLS on a real store and registry, with one
// approved box, shop-1 in region east, and robots/clock:1 pushed: the
// Go client talks to it as the CLI does.
type networkAPI struct {
	cl       *api.Client
	post     func(path string, body []byte) (int, string)
	desired  *desired.State
	box      string
	registry string // the registry's host:port, as images name it
}

func newNetworkAPI(t *testing.T) networkAPI {
	t.Helper()
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := storetest.Bolt(t)
	fl, err := fleet.New(ctx, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	toks := auth.New(s)
	tok, err := toks.Create(ctx, auth.APIToken{Name: "ops", TenantID: fleet.DefaultTenant, Role: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	admin := audit.Actor{TenantID: fleet.DefaultTenant, Name: "admin"}
	etok, _, err := fl.CreateToken(ctx, admin, fleet.TokenSpec{Region: "east", Site: "a", TTL: time.Hour, Uses: 1},
		"https://127.0.0.1:8443", sha256.Sum256([]byte("ca")), [32]byte{})
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := fl.Enroll(ctx, fleet.Enrollment{Token: etok, Hostname: "h", Name: "shop-1",
		Issue: func(string) ([]byte, time.Time, error) { return []byte("cert"), time.Now().Add(time.Hour), nil }})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.Open(ctx, t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	d := desired.New(s)
	var h http.Handler
	srv, host := lateTLSServer(t, &h)
	h = New(Deps{Fleet: fl, Audit: audit.New(s, nil), Tokens: toks, Sessions: noSessions{}, Desired: d, Registry: reg,
		Users:         auth.NewUsers(s, auth.NewHasher(cheapHash, 2, time.Minute), time.Now),
		RegistryHosts: []string{host}, Apps: apps.New(s, d, fl, reg, []string{host}, nil, log), Metrics: http.NotFoundHandler(), Log: log})

	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(host + "/robots/clock:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithTransport(srv.Client().Transport),
		remote.WithAuth(&authn.Basic{Username: "edgebox", Password: tok})); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	cl, err := api.NewClient(srv.URL, tok, caPEM)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.CreateApp(ctx, "clock", ""); err != nil {
		t.Fatal(err)
	}
	post := func(path string, body []byte) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e api.Error
		raw, _ := io.ReadAll(resp.Body)
		json.Unmarshal(raw, &e)
		return resp.StatusCode, e.Error
	}
	return networkAPI{cl: cl, post: post, desired: d, box: b.ID, registry: host}
}

// TestReleaseNetworkThroughTheAPI: a release's network mode, published
// ports, egress and proxy go through the API and storage and come back as
// given, reach the box's Workload when deployed, and what the box reports
// of the workload's network (address, ports, refusals) shows in the
// box's state and the app's status. A malformed network setting is
// refused with 400 and says what is wrong.
func TestReleaseNetworkThroughTheAPI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newNetworkAPI(t)
	spec := api.ReleaseSpec{Version: "1", Runtime: "containerd", Image: e.registry + "/robots/clock:1",
		Ports:   []api.Port{{Name: "web", Port: 80, HostPort: 8080}, {Port: 53, Protocol: "udp", HostPort: 5353, HostIP: "127.0.0.1"}, {Port: 9090}},
		Network: "bridge", Egress: []string{"bank.test", "203.0.113.0/24"}, ProxyEnv: true}
	r, err := e.cl.CreateRelease(ctx, "clock", spec)
	if err != nil {
		t.Fatal(err)
	}
	want := spec
	want.Image = r.Image // resolved to its digest
	if !strings.Contains(r.Image, "@sha256:") || !reflect.DeepEqual(r.ReleaseSpec, want) {
		t.Fatalf("created\n%+v\nwant\n%+v", r.ReleaseSpec, want)
	}
	rels, err := e.cl.Releases(ctx, "clock")
	if err != nil || len(rels) != 1 || !reflect.DeepEqual(rels[0].ReleaseSpec, want) {
		t.Fatalf("listed %+v, %v", rels, err)
	}

	// Refused, each with what is wrong, and nothing stored.
	for _, tt := range []struct {
		name string
		body string
		want []string
	}{
		{"unknown network", `{"network":"bridged"}`, []string{`network "bridged": use bridge (the default), host (containerd), user (qemu) or none`}},
		{"user for a container", `{"network":"user"}`, []string{`network "user": only for qemu releases`}},
		{"host for a VM", `{"runtime":"qemu","network":"host"}`, []string{`network "host": only for containerd releases`}},
		{"host port out of range", `{"ports":[{"port":80,"host_port":70000}]}`, []string{"host port 70000 is not from 1 to 65535"}},
		{"host port twice", `{"ports":[{"port":80,"host_port":8080},{"port":81,"host_port":8080}]}`, []string{"host port 8080/tcp is published twice"}},
		{"ports on host network", `{"network":"host","ports":[{"port":80,"host_port":8080}]}`, []string{`published ports (host_port) with network "host"`}},
		{"bad host_ip", `{"ports":[{"port":80,"host_port":8080,"host_ip":"10.0.0"}]}`, []string{`host_ip "10.0.0" is not an IP address`}},
		{"malformed egress", `{"egress":["bank.test:443","10.1.2.3/8","any"]}`,
			[]string{`egress "bank.test:443"`, `egress "10.1.2.3/8": has host bits set; the prefix is 10.0.0.0/8`, `"any" allows everything`}},
		{"IPv6 egress", `{"egress":["2001:db8::/32"]}`, []string{"IPv6 is not supported"}},
		{"network on a process", `{"runtime":"process","image":"/bin/true","egress":["bank.test"]}`, []string{"egress: a process release runs on the box's own network"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var body map[string]any
			if err := json.Unmarshal([]byte(tt.body), &body); err != nil {
				t.Fatal(err)
			}
			full := map[string]any{"version": "2", "runtime": "containerd", "image": e.registry + "/robots/clock:1"}
			for k, v := range body {
				full[k] = v
			}
			raw, _ := json.Marshal(full)
			code, msg := e.post("/api/v1/apps/clock/releases", raw)
			if code != http.StatusBadRequest {
				t.Fatalf("got %d %q, want 400", code, msg)
			}
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not say %q", msg, w)
				}
			}
		})
	}
	if rels, err := e.cl.Releases(ctx, "clock"); err != nil || len(rels) != 1 {
		t.Fatalf("after the refusals: %d releases, %v", len(rels), err)
	}

	// Deployed, the box's Workload carries them: published ports only.
	if _, err := e.cl.Deploy(ctx, "clock", "1", "region", "east"); err != nil {
		t.Fatal(err)
	}
	st, err := e.cl.BoxState(ctx, "shop-1")
	if err != nil || len(st.Objects) != 1 {
		t.Fatalf("box state: %+v %v", st, err)
	}
	var w struct {
		Network  string           `json:"network"`
		Ports    []map[string]any `json:"ports"`
		Egress   []string         `json:"egress"`
		ProxyEnv bool             `json:"proxy_env"`
	}
	if err := json.Unmarshal(st.Objects[0].Spec, &w); err != nil {
		t.Fatal(err)
	}
	wantPorts := []map[string]any{{"port": 80.0, "host_port": 8080.0}, {"port": 53.0, "host_port": 5353.0, "protocol": "udp", "host_ip": "127.0.0.1"}}
	if w.Network != "bridge" || !reflect.DeepEqual(w.Ports, wantPorts) || !reflect.DeepEqual(w.Egress, spec.Egress) || !w.ProxyEnv {
		t.Errorf("the box's workload: %s", st.Objects[0].Spec)
	}

	// What the box reports, bounded as it is stored.
	many := make([]string, 100)
	for i := range many {
		many[i] = fmt.Sprintf("%d:80/tcp", 20000+i)
	}
	for _, tt := range []struct {
		name      string
		report    *edgeboxv1.ObjectStatus
		wantPorts []string
	}{
		{"running", &edgeboxv1.ObjectStatus{Address: "10.88.0.5", Ports: []string{"8080:80/tcp", "5353:53/udp"}, EgressRefused: 3},
			[]string{"8080:80/tcp", "5353:53/udp"}},
		{"too many ports", &edgeboxv1.ObjectStatus{Address: "10.88.0.5", Ports: many, EgressRefused: 3}, many[:64]},
	} {
		tt.report.Kind, tt.report.Name, tt.report.Phase, tt.report.Release = edgeboxv1.KindWorkload, "clock", edgeboxv1.PhaseRunning, "1"
		tt.report.ObservedRevision, tt.report.UpdatedUnixNano = 1, time.Now().UnixNano()
		if err := e.desired.ReportStatus(ctx, e.box, &edgeboxv1.SyncStatus{Objects: []*edgeboxv1.ObjectStatus{tt.report}}); err != nil {
			t.Fatal(err)
		}
		st, err := e.cl.BoxState(ctx, "shop-1")
		if err != nil || len(st.Statuses) != 1 {
			t.Fatalf("%s: box state: %+v %v", tt.name, st, err)
		}
		if s := st.Statuses[0]; s.Address != "10.88.0.5" || !reflect.DeepEqual(s.Ports, tt.wantPorts) || s.EgressRefused != 3 || s.Phase != "Running" {
			t.Errorf("%s: the box's state shows %+v", tt.name, s)
		}
		as, err := e.cl.AppStatus(ctx, "clock")
		if err != nil || len(as.Boxes) != 1 {
			t.Fatalf("%s: app status: %+v %v", tt.name, as, err)
		}
		if b := as.Boxes[0]; b.Address != "10.88.0.5" || !reflect.DeepEqual(b.Ports, tt.wantPorts) || b.EgressRefused != 3 || b.RunningRelease != "1" {
			t.Errorf("%s: the app's status shows %+v", tt.name, b)
		}
	}
}

// lateTLSServer serves *h over TLS with HTTP/2, *h being set once the
// server's host:port is known (images name the registry by it).
func lateTLSServer(t *testing.T, h *http.Handler) (*httptest.Server, string) {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*h).ServeHTTP(w, r) }))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, strings.TrimPrefix(srv.URL, "https://")
}
