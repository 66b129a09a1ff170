package network

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/internal/test/require"
)

// testSeq numbers the test networks of this process; testBase spreads
// runs over the address space so a leftover of an earlier run is not hit.
var (
	testSeq  atomic.Int32
	testBase = func() int32 { var b [1]byte; rand.Read(b[:]); return int32(b[0]) % 100 }()
)

// needPlugins stops a test when the CNI plugins are not installed, the
// one thing this package's tests cannot do without.
func needPlugins(t testing.TB) {
	t.Helper()
	require.File(t, "/usr/lib/cni/bridge", "Debian's containernetworking-plugins; make test installs it")
	require.Root(t, "workload networking (network namespaces, bridges, iptables)")
}

// testNet is one test's network: its own name, bridge and subnet, and a
// /30 for each of the "internet" and "LAN" links.
type testNet struct {
	*Network
	seq int32
}

func newTestNet(t testing.TB) *testNet {
	t.Helper()
	needPlugins(t)
	seq := testBase + testSeq.Add(1)
	var r [3]byte
	rand.Read(r[:])
	cfg := DefaultConfig()
	cfg.Name = "ebtest-" + hex.EncodeToString(r[:])
	cfg.Bridge = "ebt" + hex.EncodeToString(r[:])
	cfg.Subnet = fmt.Sprintf("10.235.%d.0/24", seq)
	cfg.StateDir = t.TempDir()
	cfg.NetnsDir = t.TempDir()
	n, err := New(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		// What a failed test left: the package's own sweep, then the bridge.
		if err := n.Sweep(context.Background(), func(string) bool { return false }); err != nil {
			t.Errorf("cleaning up: %v", err)
		}
		exec.Command("ip", "link", "del", cfg.Bridge).Run()
	})
	return &testNet{Network: n, seq: seq}
}

// newNetns makes a namespace removed when the test ends.
func newNetns(t testing.TB, dir, name string) string {
	t.Helper()
	p, err := CreateNetns(dir, name)
	if err != nil {
		t.Fatalf("CreateNetns: %v", err)
	}
	t.Cleanup(func() {
		if err := RemoveNetns(p); err != nil {
			t.Errorf("RemoveNetns: %v", err)
		}
	})
	return p
}

// run runs a command, inside the namespace at ns unless ns is "".
func run(t testing.TB, ns string, args ...string) string {
	t.Helper()
	var out []byte
	do := func() error {
		var err error
		out, err = exec.Command(args[0], args[1:]...).CombinedOutput()
		return err
	}
	var err error
	if ns == "" {
		err = do()
	} else {
		err = InNetns(ns, do)
	}
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// peer makes a namespace linked to the box by a veth pair on the /30
// 198.18.<third>.0: the box is .1, the namespace .2.
func peer(t testing.TB, name string, third int32) (ns string, boxAddr, peerAddr netip.Addr) {
	t.Helper()
	ns = newNetns(t, t.TempDir(), name)
	boxEnd, nsEnd := fmt.Sprintf("%sa%d", name, third), fmt.Sprintf("%sb%d", name, third)
	boxAddr = netip.MustParseAddr(fmt.Sprintf("198.18.%d.1", third))
	peerAddr = netip.MustParseAddr(fmt.Sprintf("198.18.%d.2", third))
	run(t, "", "ip", "link", "add", boxEnd, "type", "veth", "peer", "name", nsEnd)
	t.Cleanup(func() { exec.Command("ip", "link", "del", boxEnd).Run() })
	run(t, "", "ip", "link", "set", nsEnd, "netns", ns)
	run(t, "", "ip", "addr", "add", boxAddr.String()+"/30", "dev", boxEnd)
	run(t, "", "ip", "link", "set", boxEnd, "up")
	run(t, ns, "ip", "link", "set", "lo", "up")
	run(t, ns, "ip", "addr", "add", peerAddr.String()+"/30", "dev", nsEnd)
	run(t, ns, "ip", "link", "set", nsEnd, "up")
	return ns, boxAddr, peerAddr
}

// serve answers HTTP on addr inside the namespace at ns with the text
// "<name> saw <client address>", until the test ends.
func serve(t *testing.T, ns, addr, name string) {
	t.Helper()
	var l net.Listener
	if err := InNetns(ns, func() (err error) { l, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatalf("listening in %s: %v", name, err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			host, _, _ := net.SplitHostPort(r.RemoteAddr)
			fmt.Fprintf(w, "%s saw %s", name, host)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(l) }()
	t.Cleanup(func() { srv.Close(); <-done })
}

// get fetches http://addr/ from inside the namespace at ns.
func get(ns, addr string) (string, error) {
	var conn net.Conn
	err := InNetns(ns, func() (err error) {
		conn, err = (&net.Dialer{Timeout: 20 * time.Second}).Dial("tcp", addr)
		return err
	})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	req, _ := http.NewRequest("GET", "http://"+addr+"/", nil)
	req.Close = true
	if err := req.Write(conn); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return string(b), err
}

// attach makes a namespace for id and attaches it.
func (n *testNet) attach(t *testing.T, id string, ports []Port) (string, Result) {
	t.Helper()
	ns, err := CreateNetns(n.cfg.NetnsDir, id)
	if err != nil {
		t.Fatalf("CreateNetns: %v", err)
	}
	res, err := n.Attach(context.Background(), id, ns, ports)
	if err != nil {
		RemoveNetns(ns)
		t.Fatalf("Attach %s: %v", id, err)
	}
	t.Cleanup(func() {
		if err := n.Detach(context.Background(), id, ns, ports); err != nil {
			t.Errorf("Detach %s: %v", id, err)
		}
		RemoveNetns(ns)
	})
	if !n.subnet.Contains(res.IP) || res.Gateway != n.subnet.Addr().Next() || res.HostInterface == "" {
		t.Fatalf("Attach %s = %+v, want an address in %s, the gateway %s and a host interface", id, res, n.subnet, n.subnet.Addr().Next())
	}
	return ns, res
}

// state is every trace of a workload on the box: its lease, host
// interface, iptables rules and CNI cache entries.
func (n *testNet) state(t *testing.T, id string, res Result) []string {
	t.Helper()
	var found []string
	if _, err := os.Stat(filepath.Join(ipamDir(n.cfg), n.cfg.Name, res.IP.String())); err == nil {
		found = append(found, "lease of "+res.IP.String())
	}
	if _, err := net.InterfaceByName(res.HostInterface); err == nil {
		found = append(found, "interface "+res.HostInterface)
	}
	for _, table := range []string{"nat", "filter"} {
		out, err := exec.Command("iptables-save", "-t", table).Output()
		if err != nil {
			t.Fatalf("iptables-save: %v", err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, `name: \"`+n.cfg.Name+`\" id: \"`+id+`\"`) || strings.Contains(line, res.IP.String()+"/32") {
				found = append(found, table+" rule "+line)
			}
		}
	}
	for _, name := range []string{n.cfg.Name + "-" + id + "-eth0", "cni-loopback-" + id + "-lo"} {
		if _, err := os.Stat(filepath.Join(libcni.CacheDir, "results", name)); err == nil {
			found = append(found, "cache entry "+name)
		}
	}
	return found
}

// left is what is still there of a detached workload. The kernel
// removes the veth pair of a namespace that went in the background after
// its last reference, so it waits for that, up to a deadline.
func (n *testNet) left(t *testing.T, id string, res Result) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		found := n.state(t, id, res)
		if len(found) == 0 || time.Now().After(deadline) {
			return found
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWorkloadReachesInternetAndPublishesPort is the path of a robot: it
// fetches a page from a server in the "internet" namespace through the
// bridge and NAT, answers on its published port from the "LAN"
// namespace, and leaves nothing once detached.
func TestWorkloadReachesInternetAndPublishesPort(t *testing.T) {
	t.Parallel()
	n := newTestNet(t)
	inet, inetBox, inetServer := peer(t, "ebi", n.seq)
	lan, lanBox, lanClient := peer(t, "ebl", n.seq+100)
	serve(t, inet, inetServer.String()+":80", "internet")

	hostPort := 20000 + int(n.seq)
	ports := []Port{{HostPort: hostPort, ContainerPort: 8080}}
	id := "robot-" + n.cfg.Bridge
	ns, res := n.attach(t, id, ports)
	t.Logf("workload %s got %s via %s", id, res.IP, res.HostInterface)
	if len(n.state(t, id, res)) == 0 {
		t.Fatal("an attached workload has no lease, interface, rule or cache entry")
	}

	got, err := get(ns, inetServer.String()+":80")
	if err != nil {
		t.Fatalf("fetching from the internet: %v", err)
	}
	if want := "internet saw " + inetBox.String(); got != want {
		t.Fatalf("the internet got %q, want %q (the workload's traffic masqueraded as the box)", got, want)
	}

	// Refused without harming the attached workload: the same id again, a
	// second workload on its published port, and a path that is no
	// namespace.
	other := newNetns(t, n.cfg.NetnsDir, "other-"+n.cfg.Bridge)
	refused := []struct {
		name      string
		id, netns string
		ports     []Port
		kind      error
		want      string
	}{
		{"same id", id, ns, ports, errdefs.ErrConflict, "already attached"},
		{"same port", "other-" + n.cfg.Bridge, other, []Port{{HostPort: hostPort, ContainerPort: 9}}, errdefs.ErrConflict, "already published by workload " + id},
		{"no namespace", "other-" + n.cfg.Bridge, t.TempDir(), nil, errdefs.ErrInvalid, "not a network namespace"},
		{"bad port", "other-" + n.cfg.Bridge, other, []Port{{HostPort: hostPort + 1, ContainerPort: 9, Protocol: "icmp"}}, errdefs.ErrInvalid, "want tcp or udp"},
	}
	for _, r := range refused {
		if _, err := n.Attach(context.Background(), r.id, r.netns, r.ports); !errors.Is(err, r.kind) || !strings.Contains(err.Error(), r.want) {
			t.Fatalf("Attach (%s) = %v, want a %v error mentioning %q", r.name, err, r.kind, r.want)
		}
	}
	if got, err := get(ns, inetServer.String()+":80"); err != nil || !strings.HasPrefix(got, "internet saw") {
		t.Fatalf("after the refused attaches the workload fetched %q, %v", got, err)
	}

	serve(t, ns, ":8080", "workload")
	got, err = get(lan, fmt.Sprintf("%s:%d", lanBox, hostPort))
	if err != nil {
		t.Fatalf("reaching the published port from the LAN: %v", err)
	}
	if want := "workload saw " + lanClient.String(); got != want {
		t.Fatalf("the published port answered %q, want %q", got, want)
	}

	if err := n.Detach(context.Background(), id, ns, ports); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if left := n.left(t, id, res); len(left) > 0 {
		t.Fatalf("after Detach these are left:\n%s", strings.Join(left, "\n"))
	}
	if _, err := get(lan, fmt.Sprintf("%s:%d", lanBox, hostPort)); err == nil {
		t.Fatal("the published port still answers after Detach")
	}
	if err := n.Detach(context.Background(), id, ns, ports); err != nil {
		t.Fatalf("Detach again: %v", err)
	}
	if err := n.Detach(context.Background(), "never-attached", "", nil); err != nil {
		t.Fatalf("Detach of a workload never attached: %v", err)
	}
}

// TestSweepAfterCrash is a kill -9 of the agent: three workloads were
// attached and forgotten (one's namespace is gone too, as when its
// container went; one has no libcni cache entry, as when the agent died
// during its Attach), one is still running. Sweep at the next start
// removes everything of the three and keeps the third; the next Attach gets
// an address nobody holds.
func TestSweepAfterCrash(t *testing.T) {
	t.Parallel()
	n := newTestNet(t)
	ctx := context.Background()
	ports := func(i int) []Port {
		p := 21000 + int(n.seq)*4 + i
		return []Port{{HostPort: p, ContainerPort: 80}, {HostPort: p, ContainerPort: 53, Protocol: "udp"}}
	}
	type workload struct {
		id  string
		ns  string
		res Result
	}
	var ws []workload
	for i, id := range []string{"gone-a", "gone-b", "gone-c", "alive"} {
		ns, err := CreateNetns(n.cfg.NetnsDir, id)
		if err != nil {
			t.Fatal(err)
		}
		res, err := n.Attach(ctx, id, ns, ports(i))
		if err != nil {
			t.Fatalf("Attach %s: %v", id, err)
		}
		ws = append(ws, workload{id, ns, res})
	}
	t.Cleanup(func() {
		n.Detach(ctx, "alive", ws[3].ns, ports(3))
		RemoveNetns(ws[3].ns)
	})
	// gone-b's namespace went with its container: its veth went with it,
	// its NAT rules stay.
	if err := RemoveNetns(ws[1].ns); err != nil {
		t.Fatal(err)
	}

	// gone-c's agent died before libcni wrote its cache entries.
	for _, name := range []string{n.cfg.Name + "-gone-c-eth0", "cni-loopback-gone-c-lo"} {
		if err := os.Remove(filepath.Join(libcni.CacheDir, "results", name)); err != nil {
			t.Fatal(err)
		}
	}

	aliveBefore := n.state(t, "alive", ws[3].res)

	// The agent restarts.
	again, err := New(n.cfg, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Sweep(ctx, func(id string) bool { return id == "alive" }); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	for _, w := range ws[:3] {
		if left := n.left(t, w.id, w.res); len(left) > 0 {
			t.Errorf("after Sweep, %s left:\n%s", w.id, strings.Join(left, "\n"))
		}
		if _, err := os.Stat(w.ns); err == nil {
			t.Errorf("after Sweep, %s's namespace %s is left", w.id, w.ns)
		}
	}
	if alive := n.state(t, "alive", ws[3].res); strings.Join(alive, "\n") != strings.Join(aliveBefore, "\n") || len(alive) < 4 {
		t.Fatalf("Sweep changed the live workload; before:\n%s\nafter:\n%s", strings.Join(aliveBefore, "\n"), strings.Join(alive, "\n"))
	}
	if err := again.Sweep(ctx, func(id string) bool { return id == "alive" }); err != nil {
		t.Fatalf("Sweep again: %v", err)
	}

	for _, id := range []string{"new-a", "new-b", "new-c"} {
		_, res := n.attach(t, id, nil)
		if res.IP == ws[3].res.IP {
			t.Fatalf("%s got %s, the live workload's address", id, res.IP)
		}
	}
}

func TestNetnsCrashSafe(t *testing.T) {
	t.Parallel()
	needPlugins(t)
	dir := t.TempDir()
	p, err := CreateNetns(dir, "w1")
	if err != nil {
		t.Fatal(err)
	}
	// A second create reuses the namespace: an address set in it stays.
	run(t, p, "ip", "link", "set", "lo", "up")
	if p2, err := CreateNetns(dir, "w1"); err != nil || p2 != p {
		t.Fatalf("CreateNetns again = %q, %v; want %q", p2, err, p)
	}
	if out := run(t, p, "ip", "-o", "link", "show", "lo"); !strings.Contains(out, "UP") {
		t.Fatalf("the namespace was replaced: lo is %s", out)
	}
	// A mount point left without its mount by a crash is reused.
	if err := os.WriteFile(filepath.Join(dir, "w2"), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	p3, err := CreateNetns(dir, "w2")
	if err != nil || !isNetns(p3) {
		t.Fatalf("CreateNetns over a bare file = %q, %v", p3, err)
	}
	for _, path := range []string{p, p3} {
		if err := RemoveNetns(path); err != nil {
			t.Fatalf("RemoveNetns: %v", err)
		}
		if err := RemoveNetns(path); err != nil {
			t.Fatalf("RemoveNetns of a removed namespace: %v", err)
		}
		if _, err := os.Stat(path); err == nil {
			t.Fatalf("%s is left", path)
		}
	}
	if _, err := CreateNetns(dir, "../escape"); err == nil {
		t.Fatal("CreateNetns accepted a name with a slash")
	}
}

// TestConcurrentAttachAndDetachWithoutNamespace attaches workloads at
// once (each gets its own address) and detaches them after their
// namespaces went, as when a container's shim was killed: nothing of
// them is left.
func TestConcurrentAttachAndDetachWithoutNamespace(t *testing.T) {
	t.Parallel()
	n := newTestNet(t)
	ctx := context.Background()
	const count = 6
	type attached struct {
		id, ns string
		ports  []Port
		res    Result
		err    error
	}
	out := make([]attached, count)
	done := make(chan int)
	for i := range count {
		go func() {
			a := &out[i]
			a.id = fmt.Sprintf("w%d", i)
			a.ports = []Port{{HostPort: 23000 + int(n.seq)*count + i, ContainerPort: 80}}
			a.ns, a.err = CreateNetns(n.cfg.NetnsDir, a.id)
			if a.err == nil {
				a.res, a.err = n.Attach(ctx, a.id, a.ns, a.ports)
			}
			done <- i
		}()
	}
	for range count {
		<-done
	}
	seen := map[netip.Addr]string{}
	for _, a := range out {
		if a.err != nil {
			t.Fatalf("Attach %s: %v", a.id, a.err)
		}
		if other, ok := seen[a.res.IP]; ok {
			t.Fatalf("%s and %s both got %s", a.id, other, a.res.IP)
		}
		seen[a.res.IP] = a.id
	}
	for _, a := range out {
		if err := RemoveNetns(a.ns); err != nil {
			t.Fatal(err)
		}
		if err := n.Detach(ctx, a.id, a.ns, a.ports); err != nil {
			t.Fatalf("Detach %s after its namespace went: %v", a.id, err)
		}
		if left := n.left(t, a.id, a.res); len(left) > 0 {
			t.Fatalf("after Detach, %s left:\n%s", a.id, strings.Join(left, "\n"))
		}
	}
}

// TestNetnsLeavesNoThreadBehind checks that no thread of the process is
// left in a namespace CreateNetns made or InNetns entered: such a thread
// (Go parks the main thread for good instead of ending it) would keep a
// removed workload's namespace and veth pair alive.
func TestNetnsLeavesNoThreadBehind(t *testing.T) {
	// Not parallel: another test's InNetns may hold a thread in its
	// namespace for a moment, which is not one left behind.
	needPlugins(t)
	host, err := os.Readlink("/proc/thread-self/ns/net") // a thread the tests do not move
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for i := range 50 {
		p, err := CreateNetns(dir, fmt.Sprintf("n%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if err := InNetns(p, func() error { return nil }); err != nil {
			t.Fatal(err)
		}
		if err := RemoveNetns(p); err != nil {
			t.Fatal(err)
		}
	}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/ns/net", os.Getpid()))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("listing the process's threads: %v", err)
	}
	for _, task := range tasks {
		if ns, err := os.Readlink(task); err == nil && ns != host {
			t.Errorf("thread %s is in %s, not the box's namespace %s", task, ns, host)
		}
	}
}
