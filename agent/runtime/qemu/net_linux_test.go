package qemu_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent/network"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/qemu"
	"github.com/edgebox/edgebox/agent/runtime/runtimetest"
	"github.com/edgebox/edgebox/internal/test/require"
	"github.com/edgebox/edgebox/internal/test/vmtest"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// bootWait is how long a guest under TCG may take to boot, bring its NIC
// up and fetch a page, on a loaded two-core machine.
const bootWait = 3 * time.Minute

// logs is VM name's serial console so far.
func logs(t *testing.T, d *qemu.Driver, name string) string {
	t.Helper()
	var b strings.Builder
	if err := d.Logs(context.Background(), name, 0, &b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// values are what follows each line starting with prefix in out, in order.
func values(out, prefix string) []string {
	var vs []string
	for _, line := range strings.Split(out, "\n") {
		if _, v, ok := strings.Cut(line, prefix); ok {
			vs = append(vs, strings.TrimSpace(v))
		}
	}
	return vs
}

// waitLines waits until VM name has printed n lines starting with
// prefix, and returns their values.
func waitLines(t *testing.T, d *qemu.Driver, name, prefix string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(bootWait)
	for {
		out := logs(t, d, name)
		if vs := values(out, prefix); len(vs) >= n {
			return vs
		}
		if time.Now().After(deadline) {
			t.Fatalf("VM %s printed no %q (%d wanted) in %s:\n%s", name, prefix, n, bootWait, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// fetch gets http://addr/ from the namespace at ns ("" for the box's),
// trying until the deadline: a guest's web server starts a little after
// it says so.
func fetch(t *testing.T, ns, addr string) string {
	t.Helper()
	deadline := time.Now().Add(bootWait)
	for {
		got, err := get(ns, addr)
		if err == nil {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET http://%s/ from %q: %v", addr, ns, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func get(ns, addr string) (string, error) {
	var conn net.Conn
	dial := func() (err error) {
		conn, err = (&net.Dialer{Timeout: 10 * time.Second}).Dial("tcp", addr)
		return err
	}
	var err error
	if ns == "" {
		err = dial()
	} else {
		err = network.InNetns(ns, dial)
	}
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
	return strings.TrimSpace(string(b)), err
}

// freePort is a TCP port nothing listens on just now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestUserNetwork: a VM on QEMU's user-mode network gets its address by
// DHCP from QEMU, reaches a web server on the box's loopback as 10.0.2.2,
// answers on its published port (hostfwd) from the box, and has the same
// MAC after a restart.
func TestUserNetwork(t *testing.T) {
	vmtest.RequireNet(t)
	d, ref := guest(t)
	host := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "the box's page")
	}))
	t.Cleanup(host.Close)
	_, hostSrvPort, _ := net.SplitHostPort(host.Listener.Addr().String())
	hostPort := freePort(t)
	const name = "userland"
	w := &edgeboxv1.Workload{Runtime: "qemu", Image: ref, Network: "user",
		Env:   []string{"FETCH=http://10.0.2.2:" + hostSrvPort + "/"},
		Ports: []*edgeboxv1.PortMapping{{HostPort: uint32(hostPort), Port: 80}}}
	boot(t, d, runtime.NewSpec(name, w))

	if got := waitLines(t, d, name, vmtest.FetchedLine, 1)[0]; got != "the box's page" {
		t.Fatalf("the guest fetched %q from the box, want %q:\n%s", got, "the box's page", logs(t, d, name))
	}
	if got := values(logs(t, d, name), vmtest.AddrLine); len(got) != 1 || got[0] != "10.0.2.15/24" {
		t.Errorf("the guest's address is %q, want QEMU's DHCP lease 10.0.2.15/24", got)
	}
	if got := fetch(t, "", "127.0.0.1:"+strconv.Itoa(hostPort)); got != vmtest.Page {
		t.Errorf("the published port answered %q, want %q", got, vmtest.Page)
	}
	in, err := d.Inspect(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{strconv.Itoa(hostPort) + ":80/tcp"}; in.Address != "" || !slices.Equal(in.Ports, want) {
		t.Errorf("Inspect: address %q ports %q, want no address on the bridge and %q", in.Address, in.Ports, want)
	}

	macs := waitLines(t, d, name, vmtest.MACLine, 1)
	if want := qemu.MAC(name).String(); macs[0] != want {
		t.Fatalf("the guest's MAC is %s, want %s", macs[0], want)
	}
	if err := d.Stop(context.Background(), name, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	macs = waitLines(t, d, name, vmtest.MACLine, 2)
	if macs[1] != macs[0] {
		t.Fatalf("the MAC changed across a restart: %s, then %s", macs[0], macs[1])
	}
}

// TestNoNetwork: network none gives the guest no NIC; a network a VM
// cannot have, a bad port or an egress policy user mode cannot enforce is
// refused at start with a clear error.
func TestNoNetwork(t *testing.T) {
	vmtest.RequireNet(t)
	d, ref := guest(t)
	boot(t, d, runtime.NewSpec("island", &edgeboxv1.Workload{Runtime: "qemu", Image: ref, Network: "none"}))
	waitLines(t, d, "island", vmtest.Up, 1)
	if out := logs(t, d, "island"); strings.Contains(out, vmtest.MACLine) {
		t.Fatalf("a VM on network none has a NIC:\n%s", out)
	}
	for _, tc := range []struct {
		name string
		w    *edgeboxv1.Workload
		want string
	}{
		{"hosted", &edgeboxv1.Workload{Runtime: "qemu", Image: ref, Network: "host"}, "for containers"},
		{"unheard", &edgeboxv1.Workload{Runtime: "qemu", Image: ref, Network: "macvtap"}, "unknown network"},
		// User mode cannot enforce an egress policy: refused, not ignored.
		{"leaky", &edgeboxv1.Workload{Runtime: "qemu", Image: ref, Network: "user", Egress: []string{"bank.test"}}, "restricts egress"},
		{"porty", &edgeboxv1.Workload{Runtime: "qemu", Image: ref, Network: "user", Ports: []*edgeboxv1.PortMapping{{HostPort: 0, Port: 80}}}, "from 1 to 65535"},
	} {
		if err := d.Create(context.Background(), runtime.NewSpec(tc.name, tc.w)); err != nil {
			t.Fatal(err)
		}
		if err := d.Start(context.Background(), tc.name); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("starting VM %s: %v, want a refusal saying %q", tc.name, err, tc.want)
		}
		if in, _ := d.Inspect(context.Background(), tc.name); in.State != runtime.StateCreated {
			t.Errorf("VM %s is %s after a refused start", tc.name, in.State)
		}
	}
}

// bridgeNet is a test's workload network: a bridge, subnet and state of
// its own, and an "internet" and a "LAN" namespace linked to the box.
type bridgeNet struct {
	*network.Network
	inet, lan           string // namespaces
	inetBox, inetServer string // addresses on the internet link
	lanBox, lanClient   string
}

func newBridgeNet(t testing.TB) *bridgeNet {
	t.Helper()
	require.Root(t, "bridged VMs")
	require.File(t, "/usr/lib/cni/bridge", "Debian's containernetworking-plugins")
	require.Tools(t, "iproute2", "ip")
	var r [3]byte
	rand.Read(r[:])
	third := int(r[0]) % 120
	cfg := network.DefaultConfig()
	cfg.Name = "ebvm-" + hex.EncodeToString(r[:])
	cfg.Bridge = "ebv" + hex.EncodeToString(r[:])
	cfg.Subnet = fmt.Sprintf("10.237.%d.0/24", r[1])
	cfg.StateDir = t.TempDir()
	cfg.NetnsDir = t.TempDir()
	n, err := network.New(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Sweep(context.Background(), func(string) bool { return false })
		exec.Command("ip", "link", "del", cfg.Bridge).Run()
	})
	b := &bridgeNet{Network: n}
	b.inet, b.inetBox, b.inetServer = peer(t, "evi"+hex.EncodeToString(r[:2]), 120+third)
	b.lan, b.lanBox, b.lanClient = peer(t, "evl"+hex.EncodeToString(r[:2]), third)
	return b
}

// run runs a command, inside the namespace at ns unless ns is "".
func run(t testing.TB, ns string, args ...string) string {
	t.Helper()
	var out []byte
	do := func() (err error) {
		out, err = exec.Command(args[0], args[1:]...).CombinedOutput()
		return err
	}
	var err error
	if ns == "" {
		err = do()
	} else {
		err = network.InNetns(ns, do)
	}
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// peer makes a namespace linked to the box by a veth pair on the /30
// 100.100.<third>.0: the box is .1, the namespace .2.
func peer(t testing.TB, name string, third int) (ns, boxAddr, peerAddr string) {
	t.Helper()
	ns, err := network.CreateNetns(t.TempDir(), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { network.RemoveNetns(ns) })
	boxEnd, nsEnd := name+"a", name+"b"
	boxAddr, peerAddr = fmt.Sprintf("100.100.%d.1", third), fmt.Sprintf("100.100.%d.2", third)
	run(t, "", "ip", "link", "add", boxEnd, "type", "veth", "peer", "name", nsEnd)
	t.Cleanup(func() { exec.Command("ip", "link", "del", boxEnd).Run() })
	run(t, "", "ip", "link", "set", nsEnd, "netns", ns)
	run(t, "", "ip", "addr", "add", boxAddr+"/30", "dev", boxEnd)
	run(t, "", "ip", "link", "set", boxEnd, "up")
	run(t, ns, "ip", "link", "set", "lo", "up")
	run(t, ns, "ip", "addr", "add", peerAddr+"/30", "dev", nsEnd)
	run(t, ns, "ip", "link", "set", nsEnd, "up")
	return ns, boxAddr, peerAddr
}

// serve answers HTTP on addr inside the namespace at ns with "<name> saw
// <client address>" until the test ends.
func serve(t *testing.T, ns, addr, name string) {
	t.Helper()
	var l net.Listener
	if err := network.InNetns(ns, func() (err error) { l, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(w, "%s saw %s", name, host)
	}), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(l) }()
	t.Cleanup(func() { srv.Close(); <-done })
}

// traces are what is on the box of VM name's attachment at ip: its
// namespace, address lease, iptables rules and devices.
func (b *bridgeNet) traces(t *testing.T, name, ip string) []string {
	t.Helper()
	var found []string
	cfg := b.Config()
	id := "VM-" + name
	if _, err := os.Stat(filepath.Join(cfg.NetnsDir, id)); err == nil {
		found = append(found, "namespace "+id)
	}
	if ip != "" {
		if _, err := os.Stat(filepath.Join(cfg.StateDir, "ipam", cfg.Name, ip)); err == nil {
			found = append(found, "lease of "+ip)
		}
	}
	for _, table := range []string{"nat", "filter"} {
		out := run(t, "", "iptables-save", "-t", table)
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, `id: \"`+id+`\"`) || (ip != "" && strings.Contains(line, ip+"/32")) {
				found = append(found, table+" rule "+line)
			}
		}
	}
	for _, dev := range []string{network.TapName, "br0"} {
		if _, err := net.InterfaceByName(dev); err == nil {
			found = append(found, "device "+dev+" on the box")
		}
	}
	return found
}

// left waits for the kernel to drop what went with a namespace.
func (b *bridgeNet) left(t *testing.T, name, ip string) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		found := b.traces(t, name, ip)
		if len(found) == 0 || time.Now().After(deadline) {
			return found
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBridgeNetwork is a robot VM on the box's bridge: it has its address
// from the workload network (one VM reads it from fw_cfg, another asks the
// driver's DHCP server), fetches a page from the "internet" namespace
// through NAT, answers on its published port from the "LAN", keeps its
// MAC and address across a restart, and leaves nothing behind when
// removed.
func TestBridgeNetwork(t *testing.T) {
	vmtest.RequireNet(t)
	b := newBridgeNet(t)
	ref, pull := guestRegistry(t)
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	ecfg := network.DefaultEgressConfig()
	ecfg.Chain, ecfg.Bridge, ecfg.Period = "EBQ"+strings.ToUpper(b.Config().Bridge[3:]), b.Config().Bridge, time.Hour
	pol, err := network.NewPolicies(ecfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pol.Sweep(context.Background(), func(string) bool { return false }); err != nil {
			t.Errorf("sweeping egress policies: %v", err)
		}
	})
	d := vmtest.DriverWith(t, qemu.Config{Network: b.Network, Egress: pol, Log: log})
	pull(d)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	serve(t, b.inet, b.inetServer+":80", "internet")
	hostPort := 20000 + freePort(t)%20000
	const name = "banker"
	w := &edgeboxv1.Workload{Runtime: "qemu", Image: ref,
		Env:   []string{"FETCH=http://" + b.inetServer + "/"},
		Ports: []*edgeboxv1.PortMapping{{HostPort: uint32(hostPort), Port: 80}}}
	boot(t, d, runtime.NewSpec(name, w))
	// teller may reach the internet server only, blocked only an address
	// that is not it.
	const dhcp, blocked = "teller", "blocked"
	boot(t, d, runtime.NewSpec(dhcp, &edgeboxv1.Workload{Runtime: "qemu", Image: ref, Egress: []string{b.inetServer},
		Env: []string{"FETCH=http://" + b.inetServer + "/", "DHCP=1"}}))
	boot(t, d, runtime.NewSpec(blocked, &edgeboxv1.Workload{Runtime: "qemu", Image: ref, Egress: []string{"192.0.2.1"},
		Env: []string{"FETCH=http://" + b.inetServer + "/"}}))

	in, err := d.Inspect(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{strconv.Itoa(hostPort) + ":80/tcp"}; !strings.HasPrefix(in.Address, "10.237.") || !slices.Equal(in.Ports, want) {
		t.Fatalf("Inspect: address %q ports %q, want one on %s and %q", in.Address, in.Ports, b.Config().Subnet, want)
	}
	if got, want := waitLines(t, d, name, vmtest.FetchedLine, 1)[0], "internet saw "+b.inetBox; got != want {
		t.Fatalf("the guest fetched %q, want %q (its traffic masqueraded as the box):\n%s", got, want, logs(t, d, name))
	}
	if got := values(logs(t, d, name), vmtest.AddrLine); len(got) != 1 || !strings.HasPrefix(got[0], in.Address+"/") {
		t.Errorf("the guest's address is %q, want %s", got, in.Address)
	}
	if got := fetch(t, b.lan, b.lanBox+":"+strconv.Itoa(hostPort)); got != vmtest.Page {
		t.Errorf("the published port answered the LAN %q, want %q", got, vmtest.Page)
	}
	if len(b.traces(t, name, in.Address)) == 0 {
		t.Fatal("a bridged VM has no namespace, lease or rule")
	}
	teller, err := d.Inspect(context.Background(), dhcp)
	if err != nil {
		t.Fatal(err)
	}
	if got := waitLines(t, d, dhcp, vmtest.FetchedLine, 1)[0]; got != "internet saw "+b.inetBox {
		t.Fatalf("the DHCP guest fetched %q:\n%s", got, logs(t, d, dhcp))
	}
	if got := values(logs(t, d, dhcp), vmtest.AddrLine); len(got) != 1 || got[0] != teller.Address+"/24" || teller.Address == in.Address {
		t.Errorf("the DHCP guest's address is %q, want %s/24 (and not %s)", got, teller.Address, in.Address)
	}
	if got := waitLines(t, d, blocked, vmtest.FetchedLine, 1)[0]; got != "" {
		t.Errorf("a VM whose egress allows only 192.0.2.1 fetched %q from the internet server", got)
	}
	if n, err := d.EgressRefused(context.Background(), blocked); err != nil || n == 0 {
		t.Errorf("EgressRefused(%s) = %d, %v; want its refused connections counted", blocked, n, err)
	}
	// teller's DHCP exchange stays in its namespace: its only refusals are
	// the IGMP reports its kernel sends when its NIC comes up (two or
	// three; a DHCP exchange through the box's bridge added a dozen).
	if n, err := d.EgressRefused(context.Background(), dhcp); err != nil || n > 5 {
		t.Errorf("EgressRefused(%s) = %d, %v; want at most its IGMP reports", dhcp, n, err)
	}

	macs := waitLines(t, d, name, vmtest.MACLine, 1)
	if want := qemu.MAC(name).String(); macs[0] != want {
		t.Fatalf("the guest's MAC is %s, want %s", macs[0], want)
	}
	if err := d.Stop(context.Background(), name, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	macs = waitLines(t, d, name, vmtest.MACLine, 2)
	if macs[1] != macs[0] {
		t.Fatalf("the MAC changed across a restart: %s, then %s", macs[0], macs[1])
	}
	if again, _ := d.Inspect(context.Background(), name); again.Address != in.Address {
		t.Errorf("the address changed across a restart: %s, then %s", in.Address, again.Address)
	}
	if got := waitLines(t, d, name, vmtest.FetchedLine, 2)[1]; !strings.HasPrefix(got, "internet saw") {
		t.Errorf("after the restart the guest fetched %q", got)
	}

	if err := d.Remove(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	if left := b.left(t, name, in.Address); len(left) > 0 {
		t.Fatalf("after Remove these are left:\n%s", strings.Join(left, "\n"))
	}
	if _, err := get(b.lan, b.lanBox+":"+strconv.Itoa(hostPort)); err == nil {
		t.Error("the published port still answers after Remove")
	}
}

// TestBridgeSweep is an agent killed with bridged VMs on the box: one VM
// was being removed (its directory renamed aside), one is gone but for
// its namespace, one still exists. The restarted agent's sweeps (the
// driver's, then the network's keeping what the driver holds) remove
// everything of the first two and leave the third attached, with the
// same address when it starts again.
func TestBridgeSweep(t *testing.T) {
	vmtest.RequireNet(t)
	b := newBridgeNet(t)
	ref, pull := guestRegistry(t)
	dir, err := os.MkdirTemp("", "q") // short: socket paths must fit 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	newDriver := func() *qemu.Driver {
		// Held before the guest runs (-S): QEMU holds the tap all the same.
		d, err := qemu.New(qemu.Config{StateDir: dir, Accel: "tcg", ExtraArgs: []string{"-S"}, Network: b.Network, Log: log})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := newDriver()
	t.Cleanup(func() {
		list, _ := d.List(context.Background())
		for _, in := range list {
			d.Remove(context.Background(), in.Name)
		}
		d.Sweep(context.Background())
		os.RemoveAll(dir)
	})
	pull(d)
	addr := map[string]string{}
	for _, name := range []string{"keeper", "goner", "ghost"} {
		boot(t, d, runtime.NewSpec(name, &edgeboxv1.Workload{Runtime: "qemu", Image: ref}))
		in, err := d.Inspect(context.Background(), name)
		if err != nil || in.Address == "" || in.State != runtime.StateRunning {
			t.Fatalf("Inspect %s: %+v, %v", name, in, err)
		}
		addr[name] = in.Address
	}
	vmDir := func(name string) string { return filepath.Dir(d.OverlayPath(name)) }
	// The kill: goner's removal got as far as renaming its directory;
	// ghost's directory is gone altogether (its QEMU still runs).
	if err := os.Rename(vmDir("goner"), filepath.Join(filepath.Dir(vmDir("goner")), ".rm-goner-1")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(vmDir("ghost")); err != nil {
		t.Fatal(err)
	}

	d = newDriver()
	orphans, err := d.Sweep(context.Background())
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	t.Logf("swept %+v", orphans)
	for _, name := range []string{"goner", "ghost"} {
		if left := b.left(t, name, addr[name]); len(left) > 0 {
			t.Errorf("after the driver's sweep these are left of %s:\n%s", name, strings.Join(left, "\n"))
		}
	}
	if err := b.Sweep(context.Background(), d.HoldsNetwork); err != nil {
		t.Fatalf("the network's Sweep: %v", err)
	}
	in, err := d.Inspect(context.Background(), "keeper")
	if err != nil || in.State != runtime.StateRunning || in.Address != addr["keeper"] {
		t.Fatalf("keeper after the sweeps: %+v, %v; want it running at %s", in, err, addr["keeper"])
	}
	if found := b.traces(t, "keeper", addr["keeper"]); !slices.Contains(found, "lease of "+addr["keeper"]) || !slices.Contains(found, "namespace VM-keeper") {
		t.Fatalf("the sweeps took keeper's attachment: only %q is left", found)
	}
	if err := d.Stop(context.Background(), "keeper", time.Second); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background(), "keeper"); err != nil {
		t.Fatal(err)
	}
	if in, _ := d.Inspect(context.Background(), "keeper"); in.Address != addr["keeper"] {
		t.Errorf("keeper started again at %s, was %s", in.Address, addr["keeper"])
	}

	// A reboot: the namespaces (in /run) are gone, the leases and the
	// record stay. keeper starts again attached anew, and holds one
	// address, not two.
	if err := d.Stop(context.Background(), "keeper", time.Second); err != nil {
		t.Fatal(err)
	}
	ns := b.NetnsPath("VM-keeper")
	if err := network.RemoveTap(ns); err != nil {
		t.Fatal(err)
	}
	if err := network.RemoveNetns(ns); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background(), "keeper"); err != nil {
		t.Fatalf("starting again after a reboot: %v", err)
	}
	in, err = d.Inspect(context.Background(), "keeper")
	if err != nil || in.State != runtime.StateRunning || in.Address == "" {
		t.Fatalf("keeper after a reboot: %+v, %v", in, err)
	}
	leases, _ := filepath.Glob(filepath.Join(b.Config().StateDir, "ipam", b.Config().Name, "10.*"))
	if len(leases) != 1 || filepath.Base(leases[0]) != in.Address {
		t.Errorf("after a reboot keeper (at %s) has the leases %q, want its one", in.Address, leases)
	}
	if in.Address != addr["keeper"] {
		if left := b.left(t, "", addr["keeper"]); len(left) > 0 {
			t.Errorf("keeper's address before the reboot left:\n%s", strings.Join(left, "\n"))
		}
	}
	addr["keeper"] = in.Address
	if err := d.Remove(context.Background(), "keeper"); err != nil {
		t.Fatal(err)
	}
	if left := b.left(t, "keeper", addr["keeper"]); len(left) > 0 {
		t.Errorf("after Remove these are left of keeper:\n%s", strings.Join(left, "\n"))
	}
}

// TestConformanceBridged runs the drivers' suite with every VM on the
// bridge, its crash points too (an agent killed at each step of create,
// start, stop and remove of a bridged VM), and then checks that the
// network holds nothing: no address lease, namespace or rule of any VM.
func TestConformanceBridged(t *testing.T) {
	vmtest.RequireNet(t)
	b := newBridgeNet(t)
	ref, fetch := guestRegistry(t)
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	runtimetest.Run(t, runtimetest.Harness{
		New: func(t *testing.T) runtime.Driver {
			d := vmtest.DriverWith(t, qemu.Config{Network: b.Network, Log: log})
			fetch(d)
			return d
		},
		Workload: func(greeting string) *edgeboxv1.Workload {
			return &edgeboxv1.Workload{Runtime: "qemu", Image: ref, Env: []string{"GREETING=" + greeting}}
		},
		Output: func(greeting string) string { return "hello " + greeting },
		Restart: func(t *testing.T) func(runtime.CrashHook) runtime.Driver {
			dir, err := os.MkdirTemp("", "q")
			if err != nil {
				t.Fatal(err)
			}
			var last *qemu.Driver
			t.Cleanup(func() {
				if last != nil {
					list, _ := last.List(context.Background())
					for _, in := range list {
						last.Remove(context.Background(), in.Name)
					}
					last.Sweep(context.Background())
				}
				os.RemoveAll(dir)
			})
			return func(crash runtime.CrashHook) runtime.Driver {
				d, err := qemu.New(qemu.Config{StateDir: dir, ExtraArgs: []string{"-S"}, Crash: crash, Network: b.Network, Log: log})
				if err != nil {
					t.Fatal(err)
				}
				if last == nil {
					fetch(d)
				}
				last = d
				return d
			}
		},
		Copies: runtimetest.Processes,
	})
	cfg := b.Config()
	for _, d := range []string{filepath.Join(cfg.StateDir, "ipam", cfg.Name), cfg.NetnsDir} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), "last_reserved_ip") && e.Name() != "lock" {
				t.Errorf("after the suite %s holds %s", d, e.Name())
			}
		}
	}
	for _, table := range []string{"nat", "filter"} {
		for _, line := range strings.Split(run(t, "", "iptables-save", "-t", table), "\n") {
			if strings.Contains(line, `name: \"`+cfg.Name+`\"`) {
				t.Errorf("after the suite this rule is left: %s", line)
			}
		}
	}
}
