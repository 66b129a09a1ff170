package apps

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// TestStoredReleaseFormat: releases stored by a console of 2026-11 (when
// Release still embedded api.ReleaseSpec; the JSON below is what that code
// wrote) load unchanged, run on a box as they did, and are written the
// same way today.
func TestStoredReleaseFormat(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 24, 17, 30, 0, 0, time.UTC)
	tests := []struct {
		name   string
		stored string
		want   Release
		run    *edgeboxv1.Workload
	}{{
		name: "every field",
		stored: `{"tenant_id":"default","app":"clock","version":"1.2","runtime":"containerd","image":"console.example:8443/robots/clock@sha256:aaaa",` +
			`"env":["A=1"],"args":["-v"],"cpu_millis":500,"memory_bytes":1048576,"restart":"on-failure","keep_state":true,` +
			`"probes":[{"exec":["true"],"period_seconds":5,"timeout_seconds":2,"failure_threshold":3,"initial_delay_seconds":7},{"http":"http://127.0.0.1:8080/healthz"},{"tcp":"127.0.0.1:9"}],` +
			`"ports":[{"name":"web","port":8080,"protocol":"tcp"},{"port":53,"protocol":"udp"}],"keys":[{"labels":{"bank":"icbc"}}],` +
			`"volumes":[{"name":"data","path":"/data","read_only":true},{"name":"logs","path":"/var/log/clock"}],` +
			`"tag":"1.2","created_at":"2026-11-24T17:30:00Z","created_by":"admin"}`,
		want: Release{TenantID: "default", App: "clock", Spec: Spec{Version: "1.2", Runtime: "containerd",
			Image: "console.example:8443/robots/clock@sha256:aaaa", Env: []string{"A=1"}, Args: []string{"-v"}, CPUMillis: 500, MemoryBytes: 1 << 20,
			Restart: "on-failure", KeepState: true,
			Probes: []Probe{{Exec: []string{"true"}, PeriodSeconds: 5, TimeoutSeconds: 2, FailureThreshold: 3, InitialDelay: 7},
				{HTTP: "http://127.0.0.1:8080/healthz"}, {TCP: "127.0.0.1:9"}},
			Ports:   []Port{{Name: "web", Port: 8080, Protocol: "tcp"}, {Port: 53, Protocol: "udp"}},
			Keys:    []KeyNeed{{Labels: map[string]string{"bank": "icbc"}}},
			Volumes: []Volume{{Name: "data", Path: "/data", ReadOnly: true}, {Name: "logs", Path: "/var/log/clock"}}},
			Tag: "1.2", CreatedAt: at, CreatedBy: "admin"},
		run: &edgeboxv1.Workload{App: "clock", Release: "1.2", Runtime: "containerd", Image: "console.example:8443/robots/clock@sha256:aaaa",
			Env: []string{"A=1"}, Args: []string{"-v"}, CpuMillis: 500, MemoryBytes: 1 << 20, Restart: "on-failure", KeepState: true,
			Probes: []*edgeboxv1.Probe{{Exec: []string{"true"}, PeriodSeconds: 5, TimeoutSeconds: 2, FailureThreshold: 3, InitialDelaySeconds: 7},
				{Http: "http://127.0.0.1:8080/healthz"}, {Tcp: "127.0.0.1:9"}},
			Volumes: []*edgeboxv1.Volume{{Name: "data", Path: "/data", ReadOnly: true}, {Name: "logs", Path: "/var/log/clock"}}},
	}, {
		// Added 2026-11-25 (workload networking): published ports, network
		// mode, egress and proxy.
		name: "networking",
		stored: `{"tenant_id":"default","app":"clock","version":"2","runtime":"containerd","image":"console.example:8443/robots/clock@sha256:aaaa",` +
			`"ports":[{"name":"web","port":80,"host_port":8080},{"port":53,"protocol":"udp","host_port":5353,"host_ip":"127.0.0.1"},{"port":9090}],` +
			`"network":"bridge","egress":["bank.test","203.0.113.0/24"],"proxy_env":true,"created_at":"2026-11-24T17:30:00Z","created_by":"admin"}`,
		want: Release{TenantID: "default", App: "clock", Spec: Spec{Version: "2", Runtime: "containerd", Image: "console.example:8443/robots/clock@sha256:aaaa",
			Ports:   []Port{{Name: "web", Port: 80, HostPort: 8080}, {Port: 53, Protocol: "udp", HostPort: 5353, HostIP: "127.0.0.1"}, {Port: 9090}},
			Network: "bridge", Egress: []string{"bank.test", "203.0.113.0/24"}, ProxyEnv: true}, CreatedAt: at, CreatedBy: "admin"},
		run: &edgeboxv1.Workload{App: "clock", Release: "2", Runtime: "containerd", Image: "console.example:8443/robots/clock@sha256:aaaa",
			Network: "bridge", Egress: []string{"bank.test", "203.0.113.0/24"}, ProxyEnv: true,
			Ports: []*edgeboxv1.PortMapping{{Port: 80, HostPort: 8080}, {Port: 53, HostPort: 5353, Protocol: "udp", HostIp: "127.0.0.1"}}},
	}, {
		name:   "process, nothing optional",
		stored: `{"tenant_id":"default","app":"tool","version":"1","runtime":"process","image":"/bin/true","created_at":"2026-11-24T17:30:00Z","created_by":"admin"}`,
		want:   Release{TenantID: "default", App: "tool", Spec: Spec{Version: "1", Runtime: "process", Image: "/bin/true"}, CreatedAt: at, CreatedBy: "admin"},
		run:    &edgeboxv1.Workload{App: "tool", Release: "1", Runtime: "process", Image: "/bin/true"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bx := box("bx-a", "east", "s1")
			a, d := newApps(t, boxes{bx})
			if _, err := a.CreateApp(ctx, admin, tt.want.App, ""); err != nil {
				t.Fatal(err)
			}
			if _, err := store.Put(ctx, a.s, relKey(fleet.DefaultTenant, tt.want.App, tt.want.Version), []byte(tt.stored)); err != nil {
				t.Fatal(err)
			}
			got, err := a.Release(ctx, fleet.DefaultTenant, tt.want.App, tt.want.Version)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("loaded\n%+v\nwant\n%+v", got, tt.want)
			}
			if rels, err := a.Releases(ctx, fleet.DefaultTenant, tt.want.App); err != nil || len(rels) != 1 || !reflect.DeepEqual(rels[0], tt.want) {
				t.Errorf("listed %+v, %v", rels, err)
			}
			// What is written today is what was written then.
			if raw, err := json.Marshal(tt.want); err != nil || string(raw) != tt.stored {
				t.Errorf("written as\n%s\nwant\n%s (%v)", raw, tt.stored, err)
			}
			if _, _, err := a.Deploy(ctx, admin, tt.want.App, tt.want.Version, ScopeRegion, "east"); err != nil {
				t.Fatal(err)
			}
			if w := workloads(t, d, bx.ID)[tt.want.App]; !proto.Equal(w, tt.run) {
				t.Errorf("the box runs\n%v\nwant\n%v", w, tt.run)
			}
		})
	}
}

// TestNetworkValidation: each malformed network setting of a release is
// refused at creation as ErrInvalid, with an error that names what is
// wrong; the good ones are kept as given.
func TestNetworkValidation(t *testing.T) {
	t.Parallel()
	a, _ := newApps(t, nil)
	if _, err := a.CreateApp(ctx, admin, "clock", ""); err != nil {
		t.Fatal(err)
	}
	for i, tt := range networkCases() {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.spec.Version = fmt.Sprint(i)
			r, err := a.CreateRelease(ctx, admin, "clock", tt.spec)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if !reflect.DeepEqual(r.Spec.Ports, tt.spec.Ports) || !reflect.DeepEqual(r.Spec.Egress, tt.spec.Egress) || r.Network != tt.spec.Network {
					t.Errorf("stored as %+v, given %+v", r.Spec, tt.spec)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("got %v, want ErrInvalid", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// FuzzValidEgress: an egress entry from the API never panics the check,
// and one it accepts is what the box can enforce: an IPv4 address, an
// IPv4 prefix with no host bits, or a DNS name of at most 253 bytes of
// letters, digits, '-' and dots. Seeded from TestNetworkValidation.
func FuzzValidEgress(f *testing.F) {
	for _, tt := range networkCases() {
		for _, e := range tt.spec.Egress {
			f.Add(e)
		}
	}
	f.Fuzz(func(t *testing.T, e string) {
		if ValidEgress(e) != nil {
			return
		}
		if p, err := netip.ParsePrefix(e); err == nil {
			if !p.Addr().Is4() || p.Masked() != p {
				t.Fatalf("accepted prefix %q", e)
			}
			return
		}
		if a, err := netip.ParseAddr(e); err == nil {
			if !a.Is4() {
				t.Fatalf("accepted address %q", e)
			}
			return
		}
		if e == "" || len(e) > 253 || strings.Trim(strings.ToLower(e), "abcdefghijklmnopqrstuvwxyz0123456789-.") != "" {
			t.Fatalf("accepted name %q", e)
		}
	})
}

type networkCase struct {
	name string
	spec Spec
	want []string // substrings of the error; none: accepted
}

// networkCases are releases with good and bad network settings, and
// what the error says of each bad one.
func networkCases() []networkCase {
	many := make([]string, MaxEgress+1)
	for i := range many {
		many[i] = fmt.Sprintf("10.0.%d.%d", i/256, i%256)
	}
	full := make([]string, MaxEgress)
	copy(full, many)
	ctr := func(s Spec) Spec {
		s.Version, s.Image = "1", host+"/robots/clock:1"
		if s.Runtime == "" {
			s.Runtime = edgeboxv1.RuntimeContainerd
		}
		return s
	}
	web := func(hostPort int, hostIP string) Port { return Port{Port: 80, HostPort: hostPort, HostIP: hostIP} }
	return []networkCase{
		{"default network", ctr(Spec{Ports: []Port{web(8080, "")}}), nil},
		{"bridge, every kind of egress", ctr(Spec{Network: "bridge", Ports: []Port{web(8080, "127.0.0.1"), {Port: 53, Protocol: "udp", HostPort: 5353}},
			Egress: []string{"bank.example.com", "Bank-2.Example.COM", "203.0.113.7", "203.0.113.0/24", "10.0.0.0/8", "intranet", "bank.example.net."}, ProxyEnv: true}), nil},
		{"egress any", ctr(Spec{Egress: []string{"any"}}), nil},
		{"256 egress entries", ctr(Spec{Egress: full}), nil},
		{"host network, ports served but not published", ctr(Spec{Network: "host", Ports: []Port{{Port: 80}}}), nil},
		{"none", ctr(Spec{Network: "none"}), nil},
		{"qemu user with published ports", ctr(Spec{Runtime: "qemu", Network: "user", Ports: []Port{web(2222, "")}}), nil},
		{"same host port, other protocol", ctr(Spec{Ports: []Port{web(8080, ""), {Port: 80, Protocol: "udp", HostPort: 8080}}}), nil},
		{"same host port, other addresses", ctr(Spec{Ports: []Port{web(8080, "127.0.0.1"), web(8080, "192.0.2.1")}}), nil},
		{"process serving a port", Spec{Version: "1", Runtime: "process", Image: "/bin/true", Ports: []Port{{Port: 80}}}, nil},

		{"unknown mode", ctr(Spec{Network: "bridged"}), []string{`network "bridged"`, "bridge (the default), host (containerd), user (qemu) or none"}},
		{"host for qemu", ctr(Spec{Runtime: "qemu", Network: "host"}), []string{`network "host": only for containerd releases`}},
		{"user for containerd", ctr(Spec{Network: "user"}), []string{`network "user": only for qemu releases`}},
		{"proxy_env for qemu", ctr(Spec{Runtime: "qemu", ProxyEnv: true}), []string{"proxy_env: a VM has no environment the box can set"}},
		{"process with network settings", Spec{Version: "1", Runtime: "process", Image: "/bin/true", Network: "bridge",
			Ports: []Port{web(8080, "")}, Egress: []string{"bank.test"}, ProxyEnv: true},
			[]string{"network, published ports (host_port), egress, proxy_env: a process release runs on the box's own network"}},
		{"host port too big", ctr(Spec{Ports: []Port{web(70000, "")}}), []string{"port 70000:80/tcp: host port 70000 is not from 1 to 65535"}},
		{"host port negative", ctr(Spec{Ports: []Port{web(-1, "")}}), []string{"host port -1 is not from 1 to 65535"}},
		{"host_ip without host port", ctr(Spec{Ports: []Port{web(0, "127.0.0.1")}}), []string{"host port 0 is not from 1 to 65535"}},
		{"published twice", ctr(Spec{Ports: []Port{web(8080, ""), {Port: 81, HostPort: 8080, Protocol: "tcp"}}}), []string{"port 8080:81/tcp: host port 8080/tcp is published twice"}},
		{"published twice, one on all addresses", ctr(Spec{Ports: []Port{web(8080, "127.0.0.1"), web(8080, "")}}), []string{"host port 8080/tcp is published twice"}},
		{"ports with host", ctr(Spec{Network: "host", Ports: []Port{web(8080, "")}}), []string{`published ports (host_port) with network "host"`}},
		{"ports with none", ctr(Spec{Network: "none", Ports: []Port{web(8080, "")}}), []string{`published ports (host_port) with network "none"`}},
		{"bad host_ip", ctr(Spec{Ports: []Port{web(8080, "localhost")}}), []string{`host_ip "localhost" is not an IP address`}},
		{"IPv6 host_ip", ctr(Spec{Ports: []Port{web(8080, "::1")}}), []string{`host_ip "::1": IPv6 is not supported`}},
		{"bad name", ctr(Spec{Egress: []string{"bank_1.example.com"}}), []string{`egress "bank_1.example.com": a DNS name has only letters, digits, '-' and dots`}},
		{"URL", ctr(Spec{Egress: []string{"https://bank.example.com"}}), []string{`egress "https://bank.example.com"`, "no scheme or port"}},
		{"name with port", ctr(Spec{Egress: []string{"bank.example.com:443"}}), []string{"no scheme or port"}},
		{"empty entry", ctr(Spec{Egress: []string{""}}), []string{`egress "": empty`}},
		{"wildcard", ctr(Spec{Egress: []string{"*.bank.example.com"}}), []string{"wildcards cannot be followed"}},
		{"only a dot", ctr(Spec{Egress: []string{"."}}), []string{`egress ".": give a DNS name`}},
		{"any in capitals with others", ctr(Spec{Egress: []string{"ANY", "bank.test"}}), []string{`"any" allows everything, so it must be the only entry`}},
		{"every destination as a prefix", ctr(Spec{Egress: []string{"0.0.0.0/0"}}), []string{`egress "0.0.0.0/0": allows every destination; write "any"`}},
		{"unspecified address", ctr(Spec{Egress: []string{"0.0.0.0"}}), []string{"the unspecified address is no destination"}},
		{"loopback", ctr(Spec{Egress: []string{"127.0.0.1"}}), []string{"loopback is always reachable"}},
		{"loopback prefix", ctr(Spec{Egress: []string{"127.0.0.0/8"}}), []string{"loopback is always reachable"}},
		{"multicast", ctr(Spec{Egress: []string{"224.0.0.1"}}), []string{"not a unicast destination"}},
		{"broadcast", ctr(Spec{Egress: []string{"255.255.255.255"}}), []string{"not a unicast destination"}},
		{"label too long", ctr(Spec{Egress: []string{strings.Repeat("a", 64) + ".com"}}), []string{"1 to 63 characters"}},
		{"name too long", ctr(Spec{Egress: []string{strings.Repeat("abcdefghi.", 26) + "com"}}), []string{"at most 253 characters"}},
		{"hyphen at the edge", ctr(Spec{Egress: []string{"-bank.example.com"}}), []string{"cannot start or end with '-'"}},
		{"mistyped address", ctr(Spec{Egress: []string{"203.0.113"}}), []string{"its last part is all digits"}},
		{"host bits", ctr(Spec{Egress: []string{"203.0.113.7/24"}}), []string{`egress "203.0.113.7/24": has host bits set; the prefix is 203.0.113.0/24`}},
		{"bad prefix length", ctr(Spec{Egress: []string{"203.0.113.0/33"}}), []string{`egress "203.0.113.0/33": not a CIDR prefix`}},
		{"IPv6 address", ctr(Spec{Egress: []string{"2001:db8::1"}}), []string{`egress "2001:db8::1": IPv6 is not supported`}},
		{"IPv6 prefix", ctr(Spec{Egress: []string{"2001:db8::/32"}}), []string{`egress "2001:db8::/32": IPv6 is not supported`}},
		{"any with others", ctr(Spec{Egress: []string{"any", "bank.test"}}), []string{`"any" allows everything, so it must be the only entry`}},
		{"too many", ctr(Spec{Egress: many}), []string{"egress: 257 entries; at most 256"}},
		{"egress on host network", ctr(Spec{Network: "host", Egress: []string{"bank.test"}}), []string{`egress with network "host"`}},
		{"egress on user network", ctr(Spec{Runtime: "qemu", Network: "user", Egress: []string{"bank.test"}}), []string{`egress with network "user"`}},
		{"every problem at once", ctr(Spec{Network: "none", Ports: []Port{web(8080, "::1")}, Egress: []string{"x_y", "10.0.0.1/8"}}),
			[]string{`with network "none"`, "IPv6 is not supported", `egress "x_y"`, `egress "10.0.0.1/8"`}},
	}
}

// TestWorkloadNetwork: a release's network settings reach the box's
// Workload: published ports only, and "any" as no restriction.
func TestWorkloadNetwork(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		spec Spec
		want *edgeboxv1.Workload
	}{
		{"published and served ports, egress, proxy",
			Spec{Runtime: "containerd", Network: "bridge", ProxyEnv: true, Egress: []string{"bank.test", "203.0.113.0/24"},
				Ports: []Port{{Name: "web", Port: 80, HostPort: 8080}, {Port: 9090}, {Port: 53, Protocol: "udp", HostPort: 5353, HostIP: "127.0.0.1"}}},
			&edgeboxv1.Workload{App: "clock", Runtime: "containerd", Network: "bridge", ProxyEnv: true, Egress: []string{"bank.test", "203.0.113.0/24"},
				Ports: []*edgeboxv1.PortMapping{{Port: 80, HostPort: 8080}, {Port: 53, HostPort: 5353, Protocol: "udp", HostIp: "127.0.0.1"}}}},
		{"egress any", Spec{Runtime: "qemu", Network: "user", Egress: []string{"ANY"}},
			&edgeboxv1.Workload{App: "clock", Runtime: "qemu", Network: "user"}},
		{"nothing set", Spec{Runtime: "containerd"}, &edgeboxv1.Workload{App: "clock", Runtime: "containerd"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := (Release{App: "clock", Spec: tt.spec}).Workload(); !proto.Equal(got, tt.want) {
				t.Errorf("workload\n%v\nwant\n%v", got, tt.want)
			}
		})
	}
}
