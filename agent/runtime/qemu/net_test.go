//go:build linux || windows

package qemu

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// TestMAC: a workload's MAC is a function of its name alone, fixed for
// good (these values must never change: guests and banks remember them),
// locally administered and unicast.
func TestMAC(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, want string }{
		{"robot", "82:13:9c:6b:0a:82"},
		{"robot2", "9e:1d:17:47:9b:6b"},
		{"bank-fetcher", "56:e7:21:8b:c6:14"},
		{"a", "6a:6f:61:e9:7b:e0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mac := MAC(tc.name)
			if got := mac.String(); got != tc.want {
				t.Errorf("MAC(%q) = %s, want %s", tc.name, got, tc.want)
			}
			if mac[0]&0x01 != 0 || mac[0]&0x02 == 0 {
				t.Errorf("MAC(%q) = %s: want a unicast, locally administered address", tc.name, mac)
			}
			if again := MAC(tc.name); again.String() != mac.String() {
				t.Errorf("MAC(%q) changed: %s then %s", tc.name, mac, again)
			}
		})
	}
	seen := map[string]string{}
	for i := range 2000 {
		name := "w" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('0'+i/26%10)) + string(rune('a'+i/260))
		m := MAC(name).String()
		if other, ok := seen[m]; ok && other != name {
			t.Fatalf("%s and %s have the same MAC %s", name, other, m)
		}
		seen[m] = name
	}
}

func TestNetMode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		network    string
		haveBridge bool
		want       string
		err        error
	}{
		{"", true, netBridge, nil},
		{"bridge", true, netBridge, nil},
		{"", false, netUser, nil},       // Windows hosts, no Network
		{"bridge", false, netUser, nil}, // likewise
		{"user", true, netUser, nil},
		{"none", true, netNone, nil},
		{"host", true, "", errdefs.ErrInvalid},
		{"macvlan", true, "", errdefs.ErrInvalid},
	} {
		got, err := netMode(&edgeboxv1.Workload{Network: tc.network}, tc.haveBridge)
		if got != tc.want || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
			t.Errorf("netMode(%q, bridge %v) = %q, %v; want %q, %v", tc.network, tc.haveBridge, got, err, tc.want, tc.err)
		}
	}
}

func TestPorts(t *testing.T) {
	t.Parallel()
	pm := func(host, guest uint32, proto, ip string) *edgeboxv1.PortMapping {
		return &edgeboxv1.PortMapping{HostPort: host, Port: guest, Protocol: proto, HostIp: ip}
	}
	for _, tc := range []struct {
		name string
		in   []*edgeboxv1.PortMapping
		want []string
		err  string
	}{
		{"none", nil, nil, ""},
		{"tcp and udp", []*edgeboxv1.PortMapping{pm(8080, 80, "", ""), pm(5353, 53, "udp", "127.0.0.1")}, []string{"8080:80/tcp", "127.0.0.1:5353:53/udp"}, ""},
		{"same port both protocols", []*edgeboxv1.PortMapping{pm(53, 53, "tcp", ""), pm(53, 53, "udp", "")}, []string{"53:53/tcp", "53:53/udp"}, ""},
		{"host port 0", []*edgeboxv1.PortMapping{pm(0, 80, "", "")}, nil, "from 1 to 65535"},
		{"guest port too big", []*edgeboxv1.PortMapping{pm(80, 70000, "", "")}, nil, "from 1 to 65535"},
		{"sctp", []*edgeboxv1.PortMapping{pm(80, 80, "sctp", "")}, nil, "want tcp or udp"},
		{"host ip v6", []*edgeboxv1.PortMapping{pm(80, 80, "", "::1")}, nil, "not an IPv4 address"},
		{"host ip junk", []*edgeboxv1.PortMapping{pm(80, 80, "", "0.0.0.0,hostfwd=tcp::22-:22")}, nil, "not an IPv4 address"},
		{"twice", []*edgeboxv1.PortMapping{pm(80, 80, "", ""), pm(80, 81, "tcp", "")}, nil, "published twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ps, err := ports(&edgeboxv1.Workload{Ports: tc.in})
			if tc.err != "" {
				if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ports = %v, %v; want an invalid error with %q", ps, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range ps {
				got = append(got, p.String())
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ports = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestNetArgs: QEMU's command line for each network mode.
func TestNetArgs(t *testing.T) {
	t.Parallel()
	mac := MAC("robot")
	ps := []port{{HostPort: 8080, Port: 80}, {HostPort: 5353, Port: 53, Protocol: "udp", HostIP: "127.0.0.1"}}
	g := guestNet{Addr: netip.MustParsePrefix("10.234.0.7/24"), Gateway: netip.MustParseAddr("10.234.0.1"),
		DNS: []netip.Addr{netip.MustParseAddr("192.0.2.53")}}
	nic := "virtio-net-pci,netdev=n0,mac=82:13:9c:6b:0a:82"
	for _, tc := range []struct {
		mode string
		ps   []port
		want []string
	}{
		{netNone, ps, nil},
		{netUser, nil, []string{"-netdev", "user,id=n0", "-device", nic}},
		{netUser, ps, []string{"-netdev", "user,id=n0,hostfwd=tcp::8080-:80,hostfwd=udp:127.0.0.1:5353-:53", "-device", nic}},
		{netBridge, ps, []string{"-netdev", "tap,id=n0,fd=3", "-device", nic,
			"-fw_cfg", "name=opt/edgebox/net,string=ip=10.234.0.7/24\ngateway=10.234.0.1\nmac=82:13:9c:6b:0a:82\ndns=192.0.2.53"}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			if got := netArgs(tc.mode, mac, tc.ps, 3, g); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("netArgs(%s) =\n%q\nwant\n%q", tc.mode, got, tc.want)
			}
		})
	}
}
