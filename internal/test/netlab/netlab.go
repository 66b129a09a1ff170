// Package netlab builds small networks for tests out of network
// namespaces: hosts, a LAN bridge between them, point-to-point links to
// the test's own namespace, and cuts made with iptables in a host, as a
// branch's firewall or a dead line would. Everything it makes is removed
// when the test ends. It needs root, iproute2 and iptables.
package netlab

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Lab names what one test makes, so that tests running at once do not
// meet: every namespace and every interface in the test's own namespace
// starts with its tag.
type Lab struct {
	t   testing.TB
	tag string

	mu    sync.Mutex // guards ports
	ports int        // interfaces named so far
}

// New returns a lab for t.
func New(t testing.TB) *Lab {
	var b [2]byte
	rand.Read(b[:])
	return &Lab{t: t, tag: "nl" + hex.EncodeToString(b[:])}
}

// Host is one network namespace.
type Host struct {
	lab  *Lab
	Name string
}

// Host makes a namespace with its loopback up.
func (l *Lab) Host(name string) *Host {
	l.t.Helper()
	h := &Host{lab: l, Name: l.tag + "-" + name}
	run(l.t, "ip", "netns", "add", h.Name)
	l.t.Cleanup(func() { exec.Command("ip", "netns", "del", h.Name).Run() })
	h.Run("ip", "link", "set", "lo", "up")
	return h
}

// Run runs a command in h and fails the test when it fails.
func (h *Host) Run(args ...string) string {
	h.lab.t.Helper()
	return run(h.lab.t, append([]string{"ip", "netns", "exec", h.Name}, args...)...)
}

// Command is a command to run in h.
func (h *Host) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.Name, name}, args...)...)
}

// PIDs lists the processes that run in h.
func (h *Host) PIDs() []int {
	h.lab.t.Helper()
	var out []int
	for _, f := range strings.Fields(run(h.lab.t, "ip", "netns", "pids", h.Name)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// Bridge makes a bridge in h, up: a LAN the hosts Attach to.
func (h *Host) Bridge(name string) {
	h.lab.t.Helper()
	h.Run("ip", "link", "add", name, "type", "bridge")
	h.Run("ip", "link", "set", name, "up")
}

// Attach links host to bridge in h, with addr (CIDR) on host's end,
// named ifname there.
func (h *Host) Attach(bridge string, host *Host, ifname, addr string) {
	h.lab.t.Helper()
	port := h.lab.port()
	host.link(ifname, addr, h, port, "")
	h.Run("ip", "link", "set", port, "master", bridge)
}

// Uplink links h to the test's own namespace: ifname with addr in h, and
// an interface with peerAddr (CIDR) in the test's namespace.
func (h *Host) Uplink(ifname, addr, peerAddr string) {
	h.lab.t.Helper()
	h.link(ifname, addr, nil, h.lab.port(), peerAddr)
}

// link makes a veth pair: ifname with addr in h, peer with peerAddr in
// other (the test's own namespace when nil).
func (h *Host) link(ifname, addr string, other *Host, peer, peerAddr string) {
	t := h.lab.t
	t.Helper()
	// Made in the test's namespace, then moved: names there are the
	// lab's, so they cannot collide.
	tmp := h.lab.port()
	run(t, "ip", "link", "add", tmp, "type", "veth", "peer", "name", peer)
	t.Cleanup(func() { exec.Command("ip", "link", "del", peer).Run() })
	run(t, "ip", "link", "set", tmp, "netns", h.Name)
	h.Run("ip", "link", "set", tmp, "name", ifname)
	if addr != "" {
		h.Run("ip", "addr", "add", addr, "dev", ifname)
	}
	h.Run("ip", "link", "set", ifname, "up")
	if other != nil {
		run(t, "ip", "link", "set", peer, "netns", other.Name)
		other.Run("ip", "link", "set", peer, "up")
		return
	}
	if peerAddr != "" {
		run(t, "ip", "addr", "add", peerAddr, "dev", peer)
	}
	run(t, "ip", "link", "set", peer, "up")
}

// port is a new interface name of the lab's.
func (l *Lab) port() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ports++
	return fmt.Sprintf("%s-%d", l.tag, l.ports)
}

// Cut drops every packet in and out of ifname in h, as a dead line does.
func (h *Host) Cut(ifname string) {
	h.lab.t.Helper()
	h.Run("iptables", "-I", "INPUT", "-i", ifname, "-j", "DROP")
	h.Run("iptables", "-I", "OUTPUT", "-o", ifname, "-j", "DROP")
}

// Heal undoes Cut.
func (h *Host) Heal(ifname string) {
	h.lab.t.Helper()
	h.Run("iptables", "-D", "INPUT", "-i", ifname, "-j", "DROP")
	h.Run("iptables", "-D", "OUTPUT", "-o", ifname, "-j", "DROP")
}

func run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
