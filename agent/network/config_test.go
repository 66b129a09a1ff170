package network

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgebox/edgebox/errdefs"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	good := DefaultConfig()
	good.StateDir = "/var/lib/edgebox/network"
	tests := []struct {
		name   string
		change func(*Config)
		want   string // "" is valid; otherwise part of the error
	}{
		{"default", func(*Config) {}, ""},
		{"other subnet", func(c *Config) { c.Subnet = "172.30.8.0/22" }, ""},
		{"no state dir", func(c *Config) { c.StateDir = "" }, "state directory"},
		{"relative state dir", func(c *Config) { c.StateDir = "state" }, "state directory"},
		{"relative netns dir", func(c *Config) { c.NetnsDir = "netns" }, "namespace directory"},
		{"no plugin dir", func(c *Config) { c.PluginDirs = nil }, "plugin directory"},
		{"relative plugin dir", func(c *Config) { c.PluginDirs = []string{"cni"} }, "plugin directory"},
		{"empty name", func(c *Config) { c.Name = "" }, "name"},
		{"name with slash", func(c *Config) { c.Name = "a/b" }, "name"},
		{"long bridge", func(c *Config) { c.Bridge = "edgebox-bridge-00" }, "bridge"},
		{"bridge with space", func(c *Config) { c.Bridge = "edge box" }, "bridge"},
		{"subnet not a network", func(c *Config) { c.Subnet = "10.234.0.0" }, "not a network"},
		{"subnet host bits", func(c *Config) { c.Subnet = "10.234.0.1/24" }, "did you mean 10.234.0.0/24"},
		{"subnet too big", func(c *Config) { c.Subnet = "10.0.0.0/8" }, "prefix length"},
		{"subnet too small", func(c *Config) { c.Subnet = "10.234.0.0/30" }, "prefix length"},
		{"subnet IPv6", func(c *Config) { c.Subnet = "fd00::/64" }, "IPv4"},
		{"subnet loopback", func(c *Config) { c.Subnet = "127.1.0.0/24" }, "unicast"},
		{"subnet link-local", func(c *Config) { c.Subnet = "169.254.0.0/16" }, "unicast"},
		{"subnet multicast", func(c *Config) { c.Subnet = "224.1.0.0/24" }, "unicast"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := good
			tt.change(&c)
			err := c.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("Validate() = %v, want an invalid error mentioning %q", err, tt.want)
			}
		})
	}
}

func TestPortValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		port Port
		want string
	}{
		{"tcp", Port{HostPort: 8080, ContainerPort: 80}, ""},
		{"udp on an address", Port{HostPort: 53, ContainerPort: 5353, Protocol: "udp", HostIP: "192.0.2.7"}, ""},
		{"host port zero", Port{HostPort: 0, ContainerPort: 80}, "host port 0"},
		{"host port too big", Port{HostPort: 65536, ContainerPort: 80}, "host port 65536"},
		{"container port negative", Port{HostPort: 80, ContainerPort: -1}, "container port -1"},
		{"protocol", Port{HostPort: 80, ContainerPort: 80, Protocol: "sctp"}, `protocol "sctp"`},
		{"protocol case", Port{HostPort: 80, ContainerPort: 80, Protocol: "TCP"}, `protocol "TCP"`},
		{"host ip", Port{HostPort: 80, ContainerPort: 80, HostIP: "box"}, "not an IP address"},
		{"host ip v6", Port{HostPort: 80, ContainerPort: 80, HostIP: "::1"}, "only IPv4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.port.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("Validate() = %v, want an invalid error mentioning %q", err, tt.want)
			}
		})
	}
}

func TestValidatePorts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		ports []Port
		want  string
	}{
		{"none", nil, ""},
		{"tcp and udp on one port", []Port{{HostPort: 53, ContainerPort: 53}, {HostPort: 53, ContainerPort: 53, Protocol: "udp"}}, ""},
		{"two addresses", []Port{{HostPort: 80, ContainerPort: 80, HostIP: "192.0.2.1"}, {HostPort: 80, ContainerPort: 81, HostIP: "192.0.2.2"}}, ""},
		{"twice", []Port{{HostPort: 80, ContainerPort: 80}, {HostPort: 80, ContainerPort: 81, Protocol: "tcp"}}, "published twice"},
		{"all and one address", []Port{{HostPort: 80, ContainerPort: 80}, {HostPort: 80, ContainerPort: 81, HostIP: "192.0.2.1"}}, "published twice"},
		{"one bad", []Port{{HostPort: 80, ContainerPort: 80}, {HostPort: 80, ContainerPort: 0}}, "container port 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := ValidatePorts(tt.ports)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("ValidatePorts() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ValidatePorts() = %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}

func TestParsePort(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want Port
		err  string
	}{
		{in: "8080:80", want: Port{HostPort: 8080, ContainerPort: 80}},
		{in: "5353:53/udp", want: Port{HostPort: 5353, ContainerPort: 53, Protocol: "udp"}},
		{in: "127.0.0.1:8443:443/tcp", want: Port{HostPort: 8443, ContainerPort: 443, Protocol: "tcp", HostIP: "127.0.0.1"}},
		{in: "80", err: "want [hostIP:]hostPort:containerPort"},
		{in: "a:b:c:d", err: "want [hostIP:]hostPort:containerPort"},
		{in: "x:80", err: `host port "x"`},
		{in: "80:+1", err: `container port "+1"`},
		{in: "80:99999999999", err: `container port "99999999999"`},
		{in: "80:80/", err: "empty protocol"},
		{in: "80:80/icmp", err: `protocol "icmp"`},
		{in: "0:80", err: "host port 0"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := ParsePort(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParsePort(%q) = %v, %v; want an error mentioning %q", tt.in, got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParsePort(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestResolvConf(t *testing.T) {
	t.Parallel()
	const header = "# Written by edgebox from the box's resolvers.\n"
	const upstream = "# systemd-resolved's own\nnameserver 192.0.2.53\nnameserver 2001:db8::53\nsearch corp.example\n"
	tests := []struct {
		name     string
		host     string
		upstream string // "-" means the file does not exist
		want     string
		err      string
	}{
		{
			name: "plain servers kept",
			host: "nameserver 198.51.100.1\nnameserver 198.51.100.2\nsearch branch.example\noptions ndots:2 timeout:1\n",
			want: header + "nameserver 198.51.100.1\nnameserver 198.51.100.2\nsearch branch.example\noptions ndots:2 timeout:1\n",
		},
		{
			name:     "systemd-resolved stub replaced by upstream",
			host:     "# stub\nnameserver 127.0.0.53\noptions edns0 trust-ad\nsearch lan\n",
			upstream: upstream,
			want:     header + "nameserver 192.0.2.53\nnameserver 2001:db8::53\nsearch lan\noptions edns0 trust-ad\n",
		},
		{
			name:     "second stub address",
			host:     "nameserver 127.0.0.54\n",
			upstream: upstream,
			want:     header + "nameserver 192.0.2.53\nnameserver 2001:db8::53\nsearch corp.example\n",
		},
		{
			name:     "local cache on loopback, one real server kept first",
			host:     "nameserver 127.0.0.1\nnameserver ::1\nnameserver 198.51.100.9\n",
			upstream: upstream,
			want:     header + "nameserver 198.51.100.9\nnameserver 192.0.2.53\nnameserver 2001:db8::53\nsearch corp.example\n",
		},
		{
			name:     "upstream file missing but a real server remains",
			host:     "nameserver 127.0.0.53\nnameserver 198.51.100.9\n",
			upstream: "-",
			want:     header + "nameserver 198.51.100.9\n",
		},
		{
			name: "link-local and junk dropped, at most three",
			host: "; comment\nnameserver fe80::1%eth0\nnameserver not-an-ip\nnameserver\nnameserver 192.0.2.1\nnameserver 192.0.2.2\nnameserver 192.0.2.3\nnameserver 192.0.2.4\ndomain example\n",
			want: header + "nameserver 192.0.2.1\nnameserver 192.0.2.2\nnameserver 192.0.2.3\ndomain example\n",
		},
		{
			name:     "only the stub and no upstream",
			host:     "nameserver 127.0.0.53\n",
			upstream: "-",
			err:      "no DNS server for workloads",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			host := filepath.Join(dir, "resolv.conf")
			up := filepath.Join(dir, "upstream.conf")
			if err := os.WriteFile(host, []byte(tt.host), 0o644); err != nil {
				t.Fatal(err)
			}
			if tt.upstream != "-" {
				if err := os.WriteFile(up, []byte(tt.upstream), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := ResolvConf(host, up)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) || !errors.Is(err, errdefs.ErrUnavailable) {
					t.Fatalf("ResolvConf() = %q, %v; want an unavailable error mentioning %q", got, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ResolvConf() error: %v", err)
			}
			if string(got) != tt.want {
				t.Fatalf("ResolvConf() =\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
	t.Run("host file missing", func(t *testing.T) {
		t.Parallel()
		if _, err := ResolvConf(filepath.Join(t.TempDir(), "none"), ""); err == nil || !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("ResolvConf() error = %v, want not exist", err)
		}
	})
}
