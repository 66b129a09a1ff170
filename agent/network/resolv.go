package network

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"strings"

	"github.com/edgebox/edgebox/errdefs"
)

// Where the box's resolver configuration is read from.
const (
	// HostResolvConf is the box's resolv.conf.
	HostResolvConf = "/etc/resolv.conf"
	// UpstreamResolvConf is where systemd-resolved lists the servers its
	// stub (127.0.0.53, 127.0.0.54) forwards to.
	UpstreamResolvConf = "/run/systemd/resolve/resolv.conf"
)

// maxResolvConf bounds what is read of a resolv.conf.
const maxResolvConf = 64 << 10

// maxNameservers is what the C library's resolver uses; more are dropped.
const maxNameservers = 3

// ResolvConf returns the resolv.conf a workload gets, from the box's
// resolv.conf at hostPath. A loopback server (systemd-resolved's stub, or
// any local cache) cannot be reached from the workload's namespace, so it
// is replaced by the upstream servers listed at upstreamPath (empty: none).
// search, domain and options lines are kept. It fails with
// errdefs.ErrUnavailable when no server is left.
func ResolvConf(hostPath, upstreamPath string) ([]byte, error) {
	host, err := readResolvConf(hostPath)
	if err != nil {
		return nil, err
	}
	servers := host.usableServers()
	if len(servers) < len(host.servers) && upstreamPath != "" {
		up, err := readResolvConf(upstreamPath)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		for _, s := range up.usableServers() {
			if !contains(servers, s) {
				servers = append(servers, s)
			}
		}
		if host.search == "" {
			host.search = up.search
		}
	}
	if len(servers) == 0 {
		return nil, errdefs.Unavailable("network: no DNS server for workloads: %s lists %d, all on loopback, and %s has none",
			hostPath, len(host.servers), upstreamPath)
	}
	if len(servers) > maxNameservers {
		servers = servers[:maxNameservers]
	}
	var b bytes.Buffer
	b.WriteString("# Written by edgebox from the box's resolvers.\n")
	for _, s := range servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	if host.search != "" {
		fmt.Fprintf(&b, "%s\n", host.search)
	}
	for _, o := range host.options {
		fmt.Fprintf(&b, "%s\n", o)
	}
	return b.Bytes(), nil
}

// resolvConf is what ResolvConf uses of one file.
type resolvConf struct {
	servers []netip.Addr
	search  string   // the last search or domain line, as written
	options []string // the options lines, as written
}

// usableServers are the servers a workload can reach: not loopback, not
// link-local (its zone names an interface of the box), not unspecified.
func (r resolvConf) usableServers() []netip.Addr {
	var out []netip.Addr
	for _, s := range r.servers {
		if s.IsLoopback() || s.IsLinkLocalUnicast() || s.IsUnspecified() {
			continue
		}
		out = append(out, s)
	}
	return out
}

func readResolvConf(path string) (resolvConf, error) {
	f, err := os.Open(path)
	if err != nil {
		return resolvConf{}, fmt.Errorf("network: reading the box's resolvers: %w", err)
	}
	defer f.Close()
	var r resolvConf
	sc := bufio.NewScanner(io.LimitReader(f, maxResolvConf))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		fields := strings.Fields(line)
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") || strings.HasPrefix(fields[0], ";") {
			continue
		}
		switch fields[0] {
		case "nameserver":
			if len(fields) < 2 {
				continue
			}
			a, err := netip.ParseAddr(fields[1])
			if err != nil {
				continue // a server that is not an address is ignored, as the C library does
			}
			r.servers = append(r.servers, a.WithZone(""))
		case "search", "domain":
			r.search = strings.Join(fields, " ")
		case "options":
			r.options = append(r.options, strings.Join(fields, " "))
		}
	}
	if err := sc.Err(); err != nil {
		return resolvConf{}, fmt.Errorf("network: reading %s: %w", path, err)
	}
	return r, nil
}

func contains(list []netip.Addr, a netip.Addr) bool {
	for _, b := range list {
		if a == b {
			return true
		}
	}
	return false
}
