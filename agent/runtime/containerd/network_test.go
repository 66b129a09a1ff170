//go:build linux

package containerd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"

	"github.com/edgebox/edgebox/agent/network"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/runtimetest"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/internal/test/ctrdtest"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// forever keeps a workload's shell running until it is stopped.
// (the shell runs as the container's first process, which ignores
// SIGTERM unless it traps it).
const forever = `; trap 'exit 0' TERM; while :; do sleep 1 & wait; done`

// TestBridgedContainer is a robot's path: it fetches a page by name from
// a server in the "internet" namespace through the bridge and NAT, with
// the DNS server the box's resolv.conf names; its published port answers
// from the "LAN" namespace; and once removed, nothing of its network is
// left on the box.
func TestBridgedContainer(t *testing.T) {
	sock := ctrdtest.Start(t)
	image := ctrdtest.BusyboxImage(t)
	state := t.TempDir()
	n := newTestNetwork(t, filepath.Join(state, "network"), t.TempDir())
	inet, lan := newPlace(t, "inet"), newPlace(t, "lan")
	serveHTTP(t, inet.ns, inet.its.String()+":80", "bank")
	serveDNS(t, inet.ns, inet.its.String()+":53", map[string]netip.Addr{"bank.test": inet.its})
	// The box's resolver: a stub on loopback, which a container cannot
	// reach, and the real server.
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 127.0.0.53\nnameserver "+inet.its.String()+"\nsearch corp.test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := netDriver(t, sock, n, filepath.Join(state, "containerd"), resolv, image)
	ctx := context.Background()

	hostPort := 31000 + randByte()*10
	w := &edgeboxv1.Workload{App: "robot", Runtime: "containerd", Image: ctrdtest.Image,
		Ports: []*edgeboxv1.PortMapping{{Port: 8080, HostPort: uint32(hostPort)}},
		Args: []string{"/bin/sh", "-c", `busybox mkdir -p /www && echo robot-page > /www/index.html && busybox httpd -p 8080 -h /www &&
			ip=$(busybox nslookup bank.test | busybox awk '/^Name:/ {n=1} n && /^Address/ {print $2; exit}') &&
			echo "resolved: $ip" && echo "fetched: $(busybox wget -q -O - http://$ip/)" && cat /etc/resolv.conf /etc/hosts && echo "files end"` + forever}}
	if err := d.Create(ctx, runtime.NewSpec("robot", w)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Remove(ctx, "robot") })
	if err := d.Start(ctx, "robot"); err != nil {
		t.Fatal(err)
	}
	// Debian's static busybox cannot resolve names through the C
	// library (it has no NSS), so the container resolves bank.test with
	// busybox's own resolver, from the resolv.conf the driver gave it.
	out := waitLog(t, d, "robot", "fetched:")
	if want := "resolved: " + inet.its.String() + "\nfetched: bank saw " + inet.box.String(); !strings.Contains(out, want) {
		t.Fatalf("the container's output is %q, want %q (bank.test resolved, reached through NAT as the box)", out, want)
	}

	in, err := d.Inspect(ctx, "robot")
	if err != nil {
		t.Fatal(err)
	}
	addr, err := netip.ParseAddr(in.Address)
	if err != nil || !netip.MustParsePrefix(n.Config().Subnet).Contains(addr) {
		t.Fatalf("the instance's address is %q, want one in %s", in.Address, n.Config().Subnet)
	}
	if want := []string{fmt.Sprintf("%d:8080/tcp", hostPort)}; !slices.Equal(in.Ports, want) {
		t.Fatalf("the instance's ports are %q, want %q", in.Ports, want)
	}
	if list, err := d.List(ctx); err != nil || len(list) != 1 || list[0].Address != in.Address || !slices.Equal(list[0].Ports, in.Ports) {
		t.Fatalf("List = %+v, %v; want the address and ports Inspect gives", list, err)
	}
	files := []struct{ path, want, not string }{
		{"/etc/resolv.conf", "nameserver " + inet.its.String() + "\nsearch corp.test\n", "127.0.0.53"},
		{"/etc/hosts", in.Address + "\trobot\n", ""},
		{"/etc/hosts", "127.0.0.1\tlocalhost\n", ""},
	}
	// The files as the container printed them (Exec's output of a
	// command that ends at once is not always complete).
	got := waitLog(t, d, "robot", "files end")
	for _, f := range files {
		if !strings.Contains(got, f.want) || (f.not != "" && strings.Contains(got, f.not)) {
			t.Errorf("the container's %s: its output is\n%s\nwant it to hold %q and not %q", f.path, got, f.want, f.not)
		}
	}

	got, err = httpGet(lan.ns, fmt.Sprintf("%s:%d", lan.box, hostPort))
	if err != nil || got != "robot-page" {
		t.Fatalf("the published port answered the LAN %q, %v; want robot-page", got, err)
	}

	// The box reboots: namespaces go (they live in a runtime directory);
	// containerd, the leases and libcni's cache stay. Started again, the
	// container is attached again and serves its port.
	if err := d.Stop(ctx, "robot", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := network.RemoveNetns(n.NetnsPath("robot")); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx, "robot"); err != nil {
		t.Fatalf("starting after the namespace went: %v", err)
	}
	if in, err = d.Inspect(ctx, "robot"); err != nil || in.Address == "" {
		t.Fatalf("after the namespace went: %+v, %v", in, err)
	}
	eventually(t, "the published port to answer after the namespace went", func() bool {
		got, _ := httpGet(lan.ns, fmt.Sprintf("%s:%d", lan.box, hostPort))
		return got == "robot-page"
	})

	veths := bridgePorts(t, n.Config().Bridge)
	if len(veths) != 1 {
		t.Fatalf("the bridge has ports %v, want the container's veth", veths)
	}
	if len(traces(t, n, d, "robot", in.Address, veths)) < 5 {
		t.Fatalf("the running container shows only %q: this test would not see what Remove leaves", traces(t, n, d, "robot", in.Address, veths))
	}
	if err := d.Remove(ctx, "robot"); err != nil {
		t.Fatal(err)
	}
	noTraces(t, n, d, "robot", in.Address, veths)
	if _, err := httpGet(lan.ns, fmt.Sprintf("%s:%d", lan.box, hostPort)); err == nil {
		t.Fatal("the published port answers after Remove")
	}
	if err := d.Remove(ctx, "robot"); err != nil {
		t.Fatalf("removing again: %v", err)
	}
}

// TestNetworkModes: host is the box's network, none is loopback only,
// bridge has eth0; proxy_env passes the box's proxy; and what cannot be
// made is refused with a clear error, leaving nothing behind.
func TestNetworkModes(t *testing.T) {
	sock := ctrdtest.Start(t)
	image := ctrdtest.BusyboxImage(t)
	state := t.TempDir()
	n := newTestNetwork(t, filepath.Join(state, "network"), t.TempDir())
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 192.0.2.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := netDriver(t, sock, n, filepath.Join(state, "containerd"), resolv, image)
	ctx := context.Background()

	// A server only the box's own network reaches.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	boxPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	serveHTTP(t, "", fmt.Sprintf("127.0.0.1:%d", boxPort), "box")

	script := fmt.Sprintf(`echo "ifaces: $(ls /sys/class/net | busybox tr '\n' ' ')"; echo "proxy: $HTTPS_PROXY $NO_PROXY";
		echo "local: $(busybox wget -q -O - http://127.0.0.1:%d/ 2>&1 | busybox head -c 40)"; cat /etc/hosts; cat /etc/resolv.conf; echo done`, boxPort)
	modes := []struct {
		network  string
		proxyEnv bool
		want     []string
		address  bool
	}{
		{"host", false, []string{"local: box saw 127.0.0.1", "proxy:  \n"}, false},
		{"none", true, []string{"ifaces: lo \n", "proxy: http://proxy.test:3128 localhost,127.0.0.1,::1," + n.Config().Subnet}, false},
		{"", false, []string{"ifaces: eth0 lo \n"}, true},
		{"bridge", false, []string{"ifaces: eth0 lo \n"}, true},
	}
	for _, m := range modes {
		t.Run("network="+m.network, func(t *testing.T) {
			name := "mode-" + m.network
			if m.network == "" {
				name = "mode-default"
			}
			w := &edgeboxv1.Workload{Runtime: "containerd", Image: ctrdtest.Image, Network: m.network, ProxyEnv: m.proxyEnv,
				Args: []string{"/bin/sh", "-c", script + forever}}
			if err := d.Create(ctx, runtime.NewSpec(name, w)); err != nil {
				t.Fatal(err)
			}
			defer d.Remove(ctx, name)
			if err := d.Start(ctx, name); err != nil {
				t.Fatal(err)
			}
			out := waitLog(t, d, name, "done")
			for _, want := range m.want {
				if !strings.Contains(out, want) {
					t.Errorf("output:\n%s\nwant it to hold %q", out, want)
				}
			}
			if m.network != "host" && strings.Contains(out, "box saw") {
				t.Errorf("a container on network %q reached the box's loopback:\n%s", m.network, out)
			}
			in, err := d.Inspect(ctx, name)
			if err != nil || (in.Address != "") != m.address || len(in.Ports) != 0 {
				t.Errorf("Inspect = %+v, %v; want an address: %v, no ports", in, err, m.address)
			}
			if !strings.Contains(out, "\t"+name+"\n") || !strings.Contains(out, "127.0.0.1\tlocalhost") {
				t.Errorf("/etc/hosts: output\n%s\nwant localhost and %s", out, name)
			}
			if m.network == "host" && !strings.Contains(out, "\nnameserver 192.0.2.53\n") {
				t.Errorf("a host container's resolv.conf is not the box's: output\n%s", out)
			}
		})
	}

	// A program of the box listens on one port; a workload publishes another.
	taken, err := net.Listen("tcp4", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	published := 32000 + randByte()*10
	pub := &edgeboxv1.Workload{Runtime: "containerd", Image: ctrdtest.Image, Ports: []*edgeboxv1.PortMapping{{Port: 80, HostPort: uint32(published)}}}
	if err := d.Create(ctx, runtime.NewSpec("publisher", pub)); err != nil {
		t.Fatal(err)
	}
	defer d.Remove(ctx, "publisher")

	refused := []struct {
		name    string
		network string
		ports   []*edgeboxv1.PortMapping
		kind    error
		want    string
	}{
		{"user", "user", nil, errdefs.ErrInvalid, `network "user" is for VMs`},
		{"unknown", "wifi", nil, errdefs.ErrInvalid, `network "wifi": want bridge, host or none`},
		{"host-with-ports", "host", []*edgeboxv1.PortMapping{{Port: 80, HostPort: 8080}}, errdefs.ErrInvalid, "published ports need network bridge"},
		{"none-with-ports", "none", []*edgeboxv1.PortMapping{{Port: 80, HostPort: 8080}}, errdefs.ErrInvalid, "published ports need network bridge"},
		{"bad-protocol", "", []*edgeboxv1.PortMapping{{Port: 80, HostPort: 8080, Protocol: "icmp"}}, errdefs.ErrInvalid, "want tcp or udp"},
		{"port-zero", "", []*edgeboxv1.PortMapping{{Port: 0, HostPort: 8080}}, errdefs.ErrInvalid, "container port 0"},
		{"twice", "", []*edgeboxv1.PortMapping{{Port: 80, HostPort: 8080}, {Port: 81, HostPort: 8080}}, errdefs.ErrInvalid, "published twice"},
		{"in-use-on-box", "", []*edgeboxv1.PortMapping{{Port: 80, HostPort: uint32(takenPort)}}, errdefs.ErrConflict,
			fmt.Sprintf("host port %d/tcp is in use on the box", takenPort)},
		{"published-by-another", "bridge", []*edgeboxv1.PortMapping{{Port: 9, HostPort: uint32(published)}}, errdefs.ErrConflict,
			fmt.Sprintf("host port %d/tcp is already published by workload publisher", published)},
		{"egress-on-host", "host", nil, errdefs.ErrInvalid, "egress cannot be enforced on network host"},
		{"egress-unenforced", "", nil, errdefs.ErrUnavailable, "cannot enforce egress policies"},
		{"egress-malformed", "bridge", nil, errdefs.ErrInvalid, "bank..test"},
	}
	egressOf := map[string][]string{
		"egress-on-host": {"bank.test"}, "egress-unenforced": {"bank.test", "203.0.113.0/24"}, "egress-malformed": {"bank..test"},
	}
	for _, r := range refused {
		t.Run("refused/"+r.name, func(t *testing.T) {
			name := "refused-" + r.name
			w := &edgeboxv1.Workload{Runtime: "containerd", Image: ctrdtest.Image, Network: r.network, Ports: r.ports, Egress: egressOf[r.name]}
			err := d.Create(ctx, runtime.NewSpec(name, w))
			if !isErr(err, r.kind, r.want) || !strings.Contains(err.Error(), "workload "+name) {
				d.Remove(ctx, name)
				t.Fatalf("Create = %v, want a %v error naming the workload and saying %q", err, r.kind, r.want)
			}
			if _, err := d.Inspect(ctx, name); !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("after a refused Create, Inspect = %v", err)
			}
			noTraces(t, n, d, name, "", nil)
		})
	}
	if got, err := d.Inspect(ctx, "publisher"); err != nil || got.Address == "" {
		t.Fatalf("the publisher after the refusals: %+v, %v", got, err)
	}
}

// TestNoNetwork: a driver without a network (a box without the CNI
// plugins) runs bridged workloads on loopback, as before, and refuses to
// publish ports.
func TestNoNetwork(t *testing.T) {
	sock := ctrdtest.Start(t)
	d := netDriver(t, sock, nil, t.TempDir(), "/etc/resolv.conf", ctrdtest.BusyboxImage(t))
	ctx := context.Background()
	w := &edgeboxv1.Workload{Runtime: "containerd", Image: ctrdtest.Image,
		Args: []string{"/bin/sh", "-c", `echo "ifaces: $(ls /sys/class/net | busybox tr '\n' ' ')"` + forever}}
	if err := d.Create(ctx, runtime.NewSpec("alone", w)); err != nil {
		t.Fatal(err)
	}
	defer d.Remove(ctx, "alone")
	if err := d.Start(ctx, "alone"); err != nil {
		t.Fatal(err)
	}
	if out := waitLog(t, d, "alone", "ifaces:"); !strings.Contains(out, "ifaces: lo \n") {
		t.Fatalf("output %q, want loopback only", out)
	}
	w.Ports = []*edgeboxv1.PortMapping{{Port: 80, HostPort: 8080}}
	if err := d.Create(ctx, runtime.NewSpec("publisher", w)); !isErr(err, errdefs.ErrUnavailable, "no workload network") {
		d.Remove(ctx, "publisher")
		t.Fatalf("publishing without a network: %v", err)
	}
	if err := d.Remove(ctx, "alone"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.netDir("alone")); err == nil {
		t.Fatal("Remove left the container's files")
	}
}

// TestSweepAfterKilledAgent is a kill -9 of the agent: one container
// keeps running, one was removed by hand while the agent was down, and
// one's Create was killed after its attach, before its container (at
// create/snapshot: the attach runs while containerd makes it). A new
// agent (a new Network and driver on the same state) sweeps: the live
// container keeps its address, rules and published port; the other two
// leave nothing; a new container gets another address. Then the live
// container's shim is killed: started again, it has its address back.
func TestSweepAfterKilledAgent(t *testing.T) {
	sock := ctrdtest.Start(t)
	image := ctrdtest.BusyboxImage(t)
	state, netnsDir := t.TempDir(), t.TempDir()
	n := newTestNetwork(t, filepath.Join(state, "network"), netnsDir)
	lan := newPlace(t, "lan")
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 192.0.2.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctrdState := filepath.Join(state, "containerd")
	killed := errors.New("the agent was killed here")
	armed := false
	d, err := New(Config{Address: sock, LogDir: t.TempDir(), RuncRoot: ctrdtest.RuncRoot(sock), Network: n, StateDir: ctrdState,
		ResolvConf: resolv, Crash: func(p string) error {
			if armed && p == "create/snapshot" {
				return killed
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() }) // after the cleanups below, which use it
	ctx := context.Background()
	if _, err := d.Import(ctx, strings.NewReader(string(image))); err != nil {
		t.Fatal(err)
	}
	port := 33000 + randByte()*10
	serving := func(p int) *edgeboxv1.Workload {
		return &edgeboxv1.Workload{Runtime: "containerd", Image: ctrdtest.Image,
			Ports: []*edgeboxv1.PortMapping{{Port: 8080, HostPort: uint32(p)}},
			Args:  []string{"/bin/sh", "-c", `busybox mkdir -p /www && echo "$(busybox hostname)-page" > /www/index.html && busybox httpd -p 8080 -h /www` + forever}}
	}
	type made struct {
		in    runtime.Instance
		veths []string
	}
	got := map[string]made{}
	for i, name := range []string{"alive", "removed"} {
		before := bridgePorts(t, n.Config().Bridge)
		if err := d.Create(ctx, runtime.NewSpec(name, serving(port+i))); err != nil {
			t.Fatal(err)
		}
		if err := d.Start(ctx, name); err != nil {
			t.Fatal(err)
		}
		in, err := d.Inspect(ctx, name)
		if err != nil || in.Address == "" {
			t.Fatalf("Inspect %s = %+v, %v", name, in, err)
		}
		var veths []string
		for _, v := range bridgePorts(t, n.Config().Bridge) {
			if !slices.Contains(before, v) {
				veths = append(veths, v)
			}
		}
		got[name] = made{in, veths}
	}
	t.Cleanup(func() { d.Remove(ctx, "alive") })
	armed = true
	if err := d.Create(ctx, runtime.NewSpec("half", serving(port+2))); !errors.Is(err, killed) {
		t.Fatalf("Create of half = %v, want the kill", err)
	}
	armed = false
	if len(traces(t, n, d, "half", "", nil)) == 0 {
		t.Fatal("the killed Create left nothing: this test would test nothing")
	}
	page := func(p int) (string, error) { return httpGet(lan.ns, fmt.Sprintf("%s:%d", lan.box, p)) }
	eventually(t, "alive's published port to answer", func() bool { s, _ := page(port); return s == "alive-page" })

	// While the agent is down, "removed" goes by hand.
	c, err := d.Client().LoadContainer(ns(ctx), "removed")
	if err != nil {
		t.Fatal(err)
	}
	if task, err := c.Task(ns(ctx), nil); err == nil {
		if _, err := task.Delete(ns(ctx), client.WithProcessKill); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Delete(ns(ctx), client.WithSnapshotCleanup); err != nil {
		t.Fatal(err)
	}
	aliveBefore := traces(t, n, d, "alive", got["alive"].in.Address, got["alive"].veths)

	// A VM attached to the same network, which the qemu driver holds.
	vmNS, err := network.CreateNetns(netnsDir, "VM-held")
	if err != nil {
		t.Fatal(err)
	}
	vm, err := n.Attach(ctx, "VM-held", vmNS, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Detach(ctx, "VM-held", vmNS, nil); network.RemoveNetns(vmNS) })
	vmBefore := traces(t, n, d, "VM-held", vm.IP.String(), []string{vm.HostInterface})

	// The agent starts again.
	n2, err := network.New(n.Config(), nil)
	if err != nil {
		t.Fatal(err)
	}
	d2 := netDriver(t, sock, n2, ctrdState, resolv, nil)
	d2.cfg.KeepNetwork = func(id string) bool { return id == "VM-held" }
	orphans, err := d2.Sweep(ctx)
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	var swept []string
	for _, o := range orphans {
		swept = append(swept, o.Name)
	}
	slices.Sort(swept)
	swept = slices.Compact(swept) // half left a root filesystem and a network
	if !slices.Equal(swept, []string{"half", "removed"}) {
		t.Errorf("Sweep reported %q, want half and removed", swept)
	}
	noTraces(t, n, d2, "removed", got["removed"].in.Address, got["removed"].veths)
	noTraces(t, n, d2, "half", "", nil)
	if after := traces(t, n, d2, "alive", got["alive"].in.Address, got["alive"].veths); !slices.Equal(after, aliveBefore) {
		t.Fatalf("Sweep changed the live container's network; before:\n%s\nafter:\n%s", strings.Join(aliveBefore, "\n"), strings.Join(after, "\n"))
	}
	if s, err := page(port); err != nil || s != "alive-page" {
		t.Fatalf("after Sweep alive's port answers %q, %v", s, err)
	}
	if after := traces(t, n, d2, "VM-held", vm.IP.String(), []string{vm.HostInterface}); !slices.Equal(after, vmBefore) || len(after) < 4 {
		t.Fatalf("Sweep changed the network of a VM KeepNetwork holds; before:\n%s\nafter:\n%s", strings.Join(vmBefore, "\n"), strings.Join(after, "\n"))
	}
	// The names and ports the gone ones held are free again.
	for i, name := range []string{"new", "half"} {
		if err := d2.Create(ctx, runtime.NewSpec(name, serving(port+1+i))); err != nil {
			t.Fatalf("Create %s after Sweep: %v", name, err)
		}
		defer d2.Remove(ctx, name)
		in, err := d2.Inspect(ctx, name)
		if err != nil || in.Address == "" || in.Address == got["alive"].in.Address {
			t.Fatalf("%s got address %q (%v); alive has %s", name, in.Address, err, got["alive"].in.Address)
		}
	}

	// kill -9 of alive's shim: its container dies with it; started
	// again, it has its namespace, address and port.
	shim := shimPID(t, sock, "alive")
	if err := syscall.Kill(shim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "alive to stop after its shim was killed", func() bool {
		in, err := d2.Inspect(ctx, "alive")
		return err == nil && in.State != runtime.StateRunning
	})
	if err := d2.Start(ctx, "alive"); err != nil {
		t.Fatalf("starting alive after its shim was killed: %v", err)
	}
	if in, err := d2.Inspect(ctx, "alive"); err != nil || in.State != runtime.StateRunning || in.Address != got["alive"].in.Address {
		t.Fatalf("alive after its shim was killed: %+v, %v; want running at %s", in, err, got["alive"].in.Address)
	}
	eventually(t, "alive's port to answer again", func() bool { s, _ := page(port); return s == "alive-page" })
}

// shimPID finds the shim of container id of the containerd at sock.
func shimPID(t *testing.T, sock, id string) int {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if !strings.HasSuffix(args[0], "containerd-shim-runc-v2") {
			continue
		}
		for i, a := range args[:len(args)-1] {
			if a == "-id" && args[i+1] == id && slices.Contains(args, Namespace) && slices.Contains(args, sock) {
				return pid
			}
		}
	}
	t.Fatalf("no shim for %s", id)
	return 0
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestConformanceWithNetwork runs the driver suite on bridged
// containers: with the crash points of attaching and detaching, a killed
// agent's restart converges and nothing of a removed container's network
// is left.
func TestConformanceWithNetwork(t *testing.T) {
	sock := ctrdtest.Start(t)
	image := ctrdtest.BusyboxImage(t)
	netState, netnsDir := t.TempDir(), t.TempDir()
	n := newTestNetwork(t, netState, netnsDir)
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 192.0.2.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	open := func(t *testing.T, logDir, stateDir string, crash runtime.CrashHook) *Driver {
		// A new Network on the same state, as a restarted agent has.
		again, err := network.New(n.Config(), nil)
		if err != nil {
			t.Fatal(err)
		}
		d, err := New(Config{Address: sock, LogDir: logDir, StateDir: stateDir, RuncRoot: ctrdtest.RuncRoot(sock), Network: again,
			ResolvConf: resolv, Crash: crash})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx := context.Background()
			list, _ := d.List(ctx)
			for _, in := range list {
				if err := d.Remove(ctx, in.Name); err != nil {
					t.Errorf("removing %s: %v", in.Name, err)
				}
			}
			// The suite's instances are gone: so is all of their network.
			for _, in := range list {
				noTraces(t, n, d, in.Name, in.Address, nil)
			}
			d.Close()
		})
		return d
	}
	imported := false
	importOnce := func(t *testing.T, d *Driver) {
		if imported {
			return
		}
		if _, err := d.Import(context.Background(), bytes.NewReader(image)); err != nil {
			t.Fatal(err)
		}
		imported = true
	}
	runtimetest.Run(t, runtimetest.Harness{
		New: func(t *testing.T) runtime.Driver {
			d := open(t, t.TempDir(), t.TempDir(), nil)
			importOnce(t, d)
			return d
		},
		Workload: func(greeting string) *edgeboxv1.Workload {
			return &edgeboxv1.Workload{App: "robot", Release: "1", Runtime: "containerd", Image: ctrdtest.Image,
				Env: []string{"GREETING=" + greeting}}
		},
		Output: func(greeting string) string { return "hello " + greeting },
		Exec:   func() ([]string, int) { return []string{"/bin/sh", "-c", `echo "hello $GREETING"; exit 3`}, 3 },
		Restart: func(t *testing.T) func(runtime.CrashHook) runtime.Driver {
			logDir, stateDir := t.TempDir(), t.TempDir()
			return func(crash runtime.CrashHook) runtime.Driver {
				d := open(t, logDir, stateDir, crash)
				importOnce(t, d)
				return d
			}
		},
		Copies: runtimetest.Processes,
	})
	// Every crash left its network to the restarted agent's sweep or
	// remove: nothing is attached now.
	if ports := bridgePorts(t, n.Config().Bridge); len(ports) != 0 {
		t.Fatalf("after the suite the bridge still has %v", ports)
	}
	entries, _ := os.ReadDir(filepath.Join(netState, "ipam", n.Config().Name))
	for _, e := range entries {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			t.Errorf("after the suite the address %s is still leased", e.Name())
		}
	}
}

// TestEgress: a container allowed only bank.test reaches it and is
// refused other.test, and the refusal is counted; a restarted agent
// applies the policy again; after Remove no rule of it is left.
func TestEgress(t *testing.T) {
	sock := ctrdtest.Start(t)
	image := ctrdtest.BusyboxImage(t)
	state := t.TempDir()
	n := newTestNetwork(t, filepath.Join(state, "network"), t.TempDir())
	inet := newPlace(t, "inet")
	// other.test is a second address of the "internet", routed by the box.
	other := netip.MustParseAddr(fmt.Sprintf("203.0.113.%d", randByte()))
	cmd(t, inet.ns, "ip", "addr", "add", other.String()+"/32", "dev", "lo")
	cmd(t, "", "ip", "route", "add", other.String()+"/32", "via", inet.its.String())
	t.Cleanup(func() { cmd(t, "", "ip", "route", "del", other.String()+"/32") })
	serveHTTP(t, inet.ns, inet.its.String()+":80", "bank")
	serveHTTP(t, inet.ns, other.String()+":80", "other")
	dnsAddr := inet.its.String() + ":53"
	serveDNS(t, inet.ns, dnsAddr, map[string]netip.Addr{"bank.test": inet.its, "other.test": other})
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+inet.its.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	chain := "EBT" + strings.ToUpper(randHex(3))
	policies := func() *network.Policies { // the agent's, on the box's chain
		cfg := network.DefaultEgressConfig()
		cfg.Chain = chain
		cfg.Bridge = n.Config().Bridge
		cfg.Resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "udp", dnsAddr)
		}}
		return func(cfg network.EgressConfig) *network.Policies {
			p, err := network.NewPolicies(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)))
			if err != nil {
				t.Fatal(err)
			}
			return p
		}(cfg)
	}
	p := policies()
	t.Cleanup(func() { dropEgressChain(t, p, chain) })
	ctrdState := filepath.Join(state, "containerd")
	d := netDriver(t, sock, n, ctrdState, resolv, image)
	d.cfg.Egress = p
	ctx := context.Background()
	fetch := `for host in bank.test other.test; do
			ip=$(busybox nslookup $host | busybox awk '/^Name:/ {n=1} n && /^Address/ {print $2; exit}')
			echo "$host: $(busybox wget -q -O - http://$ip/ 2>&1 | busybox head -c 60)"
		done; echo fetched`
	w := &edgeboxv1.Workload{Runtime: "containerd", Image: ctrdtest.Image, Egress: []string{"bank.test"},
		Args: []string{"/bin/sh", "-c", fetch + forever}}
	if err := d.Create(ctx, runtime.NewSpec("teller", w)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Remove(ctx, "teller") })
	if err := d.Start(ctx, "teller"); err != nil {
		t.Fatal(err)
	}
	out := waitLog(t, d, "teller", "fetched")
	if want := "bank.test: bank saw " + inet.box.String(); !strings.Contains(out, want) {
		t.Errorf("output:\n%s\nwant %q", out, want)
	}
	if strings.Contains(out, "other saw") || !strings.Contains(out, "other.test: ") {
		t.Errorf("output:\n%s\nwant other.test refused", out)
	}
	refused, err := d.EgressRefused(ctx, "teller")
	if err != nil || refused == 0 {
		t.Fatalf("EgressRefused = %d, %v; want the refused connection counted", refused, err)
	}

	// The agent restarts: its new Policies learn the policy again from
	// the sweep, and the count goes on.
	d2 := netDriver(t, sock, n, ctrdState, resolv, nil)
	p2 := policies()
	d2.cfg.Egress = p2
	if _, err := d2.Sweep(ctx); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if n2, err := d2.EgressRefused(ctx, "teller"); err != nil || n2 < refused {
		t.Fatalf("EgressRefused after a restart = %d, %v; want at least %d", n2, err, refused)
	}
	in, err := d2.Inspect(ctx, "teller")
	if err != nil {
		t.Fatal(err)
	}
	if got := egressRules(t, "teller"); len(got) == 0 {
		t.Fatalf("after the restart the container %s has no egress rule", in.Address)
	}
	if err := d2.Remove(ctx, "teller"); err != nil {
		t.Fatal(err)
	}
	if got := egressRules(t, "teller"); len(got) != 0 {
		t.Fatalf("after Remove, egress rules are left:\n%s", strings.Join(got, "\n"))
	}
	noTraces(t, n, d2, "teller", in.Address, nil)
}

// egressRules are the filter rules that name workload id's egress policy.
func egressRules(t *testing.T, id string) []string {
	t.Helper()
	out, err := exec.Command("iptables-save", "-t", "filter").Output()
	if err != nil {
		t.Fatal(err)
	}
	var rules []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "edgebox-egress:"+id+" ") || strings.Contains(l, "edgebox-egress:"+id+"\"") {
			rules = append(rules, l)
		}
	}
	return rules
}

// dropEgressChain removes what a test's egress chain left: its
// workloads' rules (through p), then the chain and the jumps to it.
func dropEgressChain(t *testing.T, p *network.Policies, chain string) {
	if err := p.Sweep(context.Background(), func(string) bool { return false }); err != nil {
		t.Errorf("sweeping the test's egress chain: %v", err)
	}
	for _, hook := range []string{"FORWARD", "INPUT"} {
		for exec.Command("iptables", "-w", "-D", hook, "-m", "comment", "--comment", "edgebox-egress", "-j", chain).Run() == nil {
		}
	}
	exec.Command("iptables", "-w", "-F", chain).Run()
	exec.Command("iptables", "-w", "-X", chain).Run()
}
