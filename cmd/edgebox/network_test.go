package main

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/edgebox/edgebox/api"
)

// publishCases are --publish values, what each parses to, or what its
// error says.
func publishCases() []struct {
	in   string
	want api.Port
	err  string // substring of the error; "" means it parses
} {
	return []struct {
		in   string
		want api.Port
		err  string
	}{
		{"8080:80", api.Port{Port: 80, HostPort: 8080}, ""},
		{"8080:80/tcp", api.Port{Port: 80, HostPort: 8080, Protocol: "tcp"}, ""},
		{"127.0.0.1:5353:53/udp", api.Port{Port: 53, HostPort: 5353, Protocol: "udp", HostIP: "127.0.0.1"}, ""},
		{"65535:1", api.Port{Port: 1, HostPort: 65535}, ""},
		{"80", api.Port{}, "give the box's port and the workload's"},
		{"8080:80/sctp", api.Port{}, "the protocol is tcp or udp"},
		{"0:80", api.Port{}, `host port "0" is not from 1 to 65535`},
		{"70000:80", api.Port{}, `host port "70000" is not from 1 to 65535`},
		{"8080:http", api.Port{}, `port "http" is not from 1 to 65535`},
		{"localhost:8080:80", api.Port{}, `"localhost" is not an IPv4 address`},
		{"10.0.0:8080:80", api.Port{}, `"10.0.0" is not an IPv4 address`},
		{"[::1]:8080:80", api.Port{}, "IPv6 is not supported"},
		{"::1:8080:80", api.Port{}, "IPv6 is not supported"},
		{"", api.Port{}, "give the box's port and the workload's"},
	}
}

// TestParsePublish: --publish takes [IP:]HOST:PORT[/PROTO] and says what
// is wrong with anything else.
func TestParsePublish(t *testing.T) {
	t.Parallel()
	for _, tt := range publishCases() {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := parsePublish(tt.in)
			if tt.err == "" {
				if err != nil || got != tt.want {
					t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), "write [IP:]HOST:PORT[/udp]") {
				t.Fatalf("got %+v, %v; want an error saying %q and the form", got, err, tt.err)
			}
		})
	}
}

// FuzzParsePublish: whatever --publish is given, parsing does not panic,
// and what it accepts is a port on each side and reads back the same
// when written out. Seeded from TestParsePublish.
func FuzzParsePublish(f *testing.F) {
	for _, tt := range publishCases() {
		f.Add(tt.in)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := parsePublish(s)
		if err != nil {
			return
		}
		if p.Port == 0 || p.HostPort < 1 || p.HostPort > 65535 {
			t.Fatalf("%q gave %+v", s, p)
		}
		q, err := parsePublish(publishedString(p))
		if q.Protocol == "tcp" && p.Protocol == "" {
			q.Protocol = ""
		}
		if err != nil || q != p {
			t.Fatalf("%q gave %+v, which reads back as %+v, %v", s, p, q, err)
		}
	})
}

// TestAppStatusTable: 'edgebox status APP' shows each box's workload
// address and published ports, and the refused connections only when a
// box counts some.
func TestAppStatusTable(t *testing.T) {
	running := api.AppBoxStatus{BoxID: "bx-1", BoxName: "shop-1", Online: true, DesiredRelease: "1", RunningRelease: "1", Phase: "Running",
		Health: "healthy", Address: "10.88.0.5", Ports: []string{"8080:80/tcp", "5353:53/udp"}}
	pending := api.AppBoxStatus{BoxID: "bx-2", BoxName: "shop-2", DesiredRelease: "1", Phase: "Failed",
		Message: "host port 8080/tcp is taken on the box"}
	refusing := running
	refusing.EgressRefused = 17
	tests := []struct {
		name    string
		boxes   []api.AppBoxStatus
		want    []string // lines, fields separated by runs of spaces
		notWant []string
	}{
		{"no refusals", []api.AppBoxStatus{running, pending},
			[]string{"BOX NAME ONLINE DESIRED RUNNING PHASE HEALTH ADDRESS PORTS MESSAGE",
				"bx-1 shop-1 yes 1 1 Running healthy 10.88.0.5 8080:80/tcp,5353:53/udp",
				"bx-2 shop-2 no 1 - Failed - - - host port 8080/tcp is taken on the box"},
			[]string{"REFUSED"}},
		{"refusals", []api.AppBoxStatus{refusing, pending},
			[]string{"BOX NAME ONLINE DESIRED RUNNING PHASE HEALTH ADDRESS PORTS EGRESS REFUSED MESSAGE",
				"bx-1 shop-1 yes 1 1 Running healthy 10.88.0.5 8080:80/tcp,5353:53/udp 17",
				"bx-2 shop-2 no 1 - Failed - - - 0 host port 8080/tcp is taken on the box"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := runCLI(t, consoleAnswers(t, nil, api.AppStatus{App: "clock", Boxes: tt.boxes}), "status", "clock")
			lines := fieldsOf(out)
			for _, w := range tt.want {
				if !slicesContain(lines, w) {
					t.Errorf("no line %q in:\n%s", w, out)
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(out, w) {
					t.Errorf("%q in:\n%s", w, out)
				}
			}
		})
	}
}

// TestStateNetworkTable: 'edgebox boxes state BOX' lists the workloads
// that have a network, and nothing of those that have none.
func TestStateNetworkTable(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	stateTable(&b, api.BoxState{BoxID: "bx-1", Objects: []api.DesiredObject{{Kind: "Workload", Name: "clock"}, {Kind: "Workload", Name: "tool"}},
		Statuses: []api.ObjectStatus{{Kind: "Workload", Name: "clock", Phase: "Running", Address: "10.88.0.5", Ports: []string{"8080:80/tcp"}, EgressRefused: 2},
			{Kind: "Workload", Name: "tool", Phase: "Running"}}}, 0)
	lines := fieldsOf(b.String())
	for _, w := range []string{"WORKLOAD ADDRESS PORTS EGRESS REFUSED", "clock 10.88.0.5 8080:80/tcp 2"} {
		if !slicesContain(lines, w) {
			t.Errorf("no line %q in:\n%s", w, b.String())
		}
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "tool -") {
			t.Errorf("a workload with no network is listed: %q", l)
		}
	}
}

// TestReleaseCreateNetworkFlags: the networking flags of 'edgebox
// release create' reach the console as the API's release spec, and the
// answer is summed up in a line; a malformed --publish is refused before
// anything is sent.
func TestReleaseCreateNetworkFlags(t *testing.T) {
	base := []string{"release", "create", "--app", "statements", "--version", "2.1.0", "--image", "console.example:8443/robots/statements:2.1.0"}
	tests := []struct {
		name    string
		args    []string
		want    api.ReleaseSpec
		wantOut string
		err     string
	}{
		{"every flag", []string{"--network", "bridge", "--publish", "8080:80", "--publish", "127.0.0.1:5353:53/udp", "--port", "9090",
			"--egress", "bank.example.com", "--egress", "203.0.113.0/24", "--proxy-env"},
			api.ReleaseSpec{Network: "bridge", Ports: []api.Port{{Port: 9090}, {Port: 80, HostPort: 8080}, {Port: 53, Protocol: "udp", HostPort: 5353, HostIP: "127.0.0.1"}},
				Egress: []string{"bank.example.com", "203.0.113.0/24"}, ProxyEnv: true},
			"  network bridge; publishes 8080:80/tcp, 127.0.0.1:5353:53/udp; egress only to bank.example.com, 203.0.113.0/24; the box's proxy in HTTPS_PROXY\n", ""},
		{"host network, any egress", []string{"--network", "host", "--egress", "any"},
			api.ReleaseSpec{Network: "host", Egress: []string{"any"}}, "  network host; egress any\n", ""},
		{"none of them", nil, api.ReleaseSpec{}, "", ""},
		{"bad publish", []string{"--publish", "8080"}, api.ReleaseSpec{}, "", `--publish "8080": give the box's port and the workload's`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []api.ReleaseSpec
			srv := consoleAnswers(t, &got, api.AppStatus{})
			out, err := runCLIErr(t, srv, append(base, tt.args...)...)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) || len(got) != 0 {
					t.Fatalf("got %v, sent %d releases; want %q and nothing sent", err, len(got), tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := tt.want
			want.Version, want.Runtime, want.Image = "2.1.0", "containerd", "console.example:8443/robots/statements:2.1.0"
			if len(got) != 1 || !reflect.DeepEqual(got[0], want) {
				t.Fatalf("sent %+v, want %+v", got, want)
			}
			if wantOut := "release statements@2.1.0: console.example:8443/robots/statements@sha256:aaaa\n" + tt.wantOut; out != wantOut {
				t.Errorf("printed\n%q\nwant\n%q", out, wantOut)
			}
		})
	}
}

// consoleAnswers is the console's side of the API calls the tests make,
// as the API documents them: it records each release spec the CLI sends
// (into *got) and answers as the console does, with the image by digest;
// it answers an app's status with status.
func consoleAnswers(t *testing.T, got *[]api.ReleaseSpec, status api.AppStatus) *httptest.Server {
	t.Helper()
	var mu sync.Mutex
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/apps/{app}/releases", func(w http.ResponseWriter, r *http.Request) {
		var spec api.ReleaseSpec
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&spec); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(api.Error{Error: err.Error()})
			return
		}
		mu.Lock()
		*got = append(*got, spec)
		mu.Unlock()
		rel := api.Release{App: r.PathValue("app"), ReleaseSpec: spec, Tag: "2.1.0"}
		rel.Image = strings.TrimSuffix(spec.Image, ":2.1.0") + "@sha256:aaaa"
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(rel)
	})
	mux.HandleFunc("GET /api/v1/apps/{app}/status", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(status)
	})
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// runCLIErr runs the CLI, logged in to srv, with args.
func runCLIErr(t *testing.T, srv *httptest.Server, args ...string) (string, error) {
	t.Helper()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	raw, _ := json.Marshal(cliConfig{Console: srv.URL, Token: "tok", CAPEM: string(ca)})
	cfg := filepath.Join(t.TempDir(), "cli.json")
	if err := os.WriteFile(cfg, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	// The CLI finds its login in the environment, so the tests that run
	// it are not parallel.
	t.Setenv("EDGEBOX_CONFIG", cfg)
	t.Setenv("EDGEBOX_TOKEN", "")
	var out bytes.Buffer
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&out)
	err := root.Execute()
	return out.String(), err
}

func runCLI(t *testing.T, srv *httptest.Server, args ...string) string {
	t.Helper()
	out, err := runCLIErr(t, srv, args...)
	if err != nil {
		t.Fatalf("edgebox %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// fieldsOf is out's lines with each run of spaces made one.
func fieldsOf(out string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	return lines
}

func slicesContain(lines []string, s string) bool {
	for _, l := range lines {
		if l == s {
			return true
		}
	}
	return false
}
