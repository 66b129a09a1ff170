//go:build linux

package containerd

import (
	"bufio"
	"bytes"
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
	"golang.org/x/net/dns/dnsmessage"

	"github.com/edgebox/edgebox/agent/network"
	"github.com/edgebox/edgebox/internal/test/ctrdtest"
	"github.com/edgebox/edgebox/internal/test/require"
)

// Helpers of the network tests: a workload network of the test's own,
// namespaces standing in for "the internet" and "the branch LAN", a DNS
// server and an HTTP server in them.

// needCNI needs the CNI plugins and iptables.
func needCNI(t testing.TB) {
	t.Helper()
	require.Root(t, "workload networking")
	require.File(t, "/usr/lib/cni/bridge", "Debian's containernetworking-plugins; make test installs it")
	require.Tools(t, "iptables", "iptables-save", "iptables-restore")
	require.Tools(t, "iproute2", "ip")
}

// randHex is n random bytes in hex: test networks, bridges and links are
// named apart from other tests' running at the same time.
func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// randByte is a random number from 1 to 250.
func randByte() int {
	var b [1]byte
	rand.Read(b[:])
	return 1 + int(b[0])%250
}

// nextByte is a number from 1 to 250 that no other call in this process
// returns until 250 more were: subnets and links of one test run never
// share one (another process's may; each package's tests use ranges of
// their own).
func nextByte() int { return 1 + int(byteBase+byteSeq.Add(1))%250 }

var (
	byteSeq  atomic.Int32
	byteBase = int32(randByte())
)

// newTestNetwork is a workload network of the test's own: its own CNI
// name, bridge and /24, removed with all it holds when the test ends.
func newTestNetwork(t testing.TB, stateDir, netnsDir string) *network.Network {
	t.Helper()
	needCNI(t)
	r := randHex(3)
	cfg := network.DefaultConfig()
	cfg.Name = "ctrdtest-" + r
	cfg.Bridge = "ebc" + r
	cfg.Subnet = fmt.Sprintf("10.236.%d.0/24", nextByte())
	cfg.StateDir = stateDir
	cfg.NetnsDir = netnsDir
	n, err := network.New(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatalf("network.New: %v", err)
	}
	t.Cleanup(func() {
		if err := n.Sweep(context.Background(), func(string) bool { return false }); err != nil {
			t.Errorf("sweeping the test network: %v", err)
		}
		exec.Command("ip", "link", "del", cfg.Bridge).Run()
	})
	return n
}

// netDriver is a containerd driver on the containerd at sock with the
// network n, whose box resolver is resolvConf.
func netDriver(t testing.TB, sock string, n *network.Network, stateDir, resolvConf string, image []byte) *Driver {
	t.Helper()
	d, err := New(Config{Address: sock, LogDir: t.TempDir(), RuncRoot: ctrdtest.RuncRoot(sock), Network: n, StateDir: stateDir,
		ResolvConf: resolvConf, UpstreamResolvConf: filepath.Join(t.TempDir(), "none"), Proxy: "http://proxy.test:3128",
		Log: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if image != nil {
		if _, err := d.Import(context.Background(), bytes.NewReader(image)); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// cmd runs a command, inside the namespace at ns unless ns is "".
func cmd(t testing.TB, ns string, args ...string) string {
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

// place is a namespace linked to the box by a veth pair on a /30 of
// 100.102.0.0/16 (agent/network's tests use 198.18-19, qemu's 100.100):
// the box is .1, the place .2.
type place struct {
	ns       string
	box, its netip.Addr
}

func newPlace(t testing.TB, kind string) place {
	t.Helper()
	r := randHex(3)
	path, err := network.CreateNetns(t.TempDir(), kind+"-"+r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { network.RemoveNetns(path) })
	third := nextByte()
	p := place{ns: path,
		box: netip.MustParseAddr(fmt.Sprintf("100.102.%d.1", third)),
		its: netip.MustParseAddr(fmt.Sprintf("100.102.%d.2", third))}
	boxEnd, nsEnd := kind[:1]+"b"+r, kind[:1]+"p"+r
	cmd(t, "", "ip", "link", "add", boxEnd, "type", "veth", "peer", "name", nsEnd)
	t.Cleanup(func() { exec.Command("ip", "link", "del", boxEnd).Run() })
	cmd(t, "", "ip", "link", "set", nsEnd, "netns", path)
	cmd(t, "", "ip", "addr", "add", p.box.String()+"/30", "dev", boxEnd)
	cmd(t, "", "ip", "link", "set", boxEnd, "up")
	cmd(t, path, "ip", "link", "set", "lo", "up")
	cmd(t, path, "ip", "addr", "add", p.its.String()+"/30", "dev", nsEnd)
	cmd(t, path, "ip", "link", "set", nsEnd, "up")
	return p
}

// serveHTTP answers HTTP on addr in the namespace at ns (the box's when
// "") with "<name> saw <client address>", until the test ends.
func serveHTTP(t testing.TB, ns, addr, name string) {
	t.Helper()
	var l net.Listener
	listen := func() (err error) { l, err = net.Listen("tcp", addr); return err }
	var err error
	if ns == "" {
		err = listen()
	} else {
		err = network.InNetns(ns, listen)
	}
	if err != nil {
		t.Fatalf("listening for %s: %v", name, err)
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

// serveDNS answers A queries for names on addr (UDP) in the namespace at
// ns, until the test ends; other names get NXDOMAIN.
func serveDNS(t testing.TB, ns, addr string, names map[string]netip.Addr) {
	t.Helper()
	var pc net.PacketConn
	if err := network.InNetns(ns, func() (err error) { pc, err = net.ListenPacket("udp", addr); return err }); err != nil {
		t.Fatalf("listening for DNS: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return // closed
			}
			if resp, ok := answerDNS(buf[:n], names); ok {
				pc.WriteTo(resp, from)
			}
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
}

// answerDNS answers one query: A records for names, an empty answer for
// other types of a known name, NXDOMAIN for the rest. A message that does
// not parse gets no answer.
func answerDNS(query []byte, names map[string]netip.Addr) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, false
	}
	name := strings.ToLower(strings.TrimSuffix(q.Name.String(), "."))
	addr, known := names[name]
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), rh)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(q) != nil || b.StartAnswers() != nil {
		return nil, false
	}
	if known && q.Type == dnsmessage.TypeA && q.Class == dnsmessage.ClassINET {
		if b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}, dnsmessage.AResource{A: addr.As4()}) != nil {
			return nil, false
		}
	}
	out, err := b.Finish()
	return out, err == nil
}

// httpGet fetches http://addr/ from inside the namespace at ns.
func httpGet(ns, addr string) (string, error) {
	var conn net.Conn
	err := network.InNetns(ns, func() (err error) {
		conn, err = (&net.Dialer{Timeout: 10 * time.Second}).Dial("tcp", addr)
		return err
	})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
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

// waitLog waits for the workload's output to hold want, and returns it.
func waitLog(t testing.TB, d *Driver, name, want string) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var out bytes.Buffer
	for {
		out.Reset()
		d.Logs(context.Background(), name, 0, &out)
		if strings.Contains(out.String(), want) {
			return out.String()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's output never said %q; it says:\n%s", name, want, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// execOut runs argv in the workload and returns its output; it must exit 0.
func execOut(t testing.TB, d *Driver, name string, argv ...string) string {
	t.Helper()
	var out bytes.Buffer
	code, err := d.Exec(context.Background(), name, argv, &out, &out)
	if err != nil || code != 0 {
		t.Fatalf("exec %v in %s: code %d, %v: %s", argv, name, code, err, out.String())
	}
	return out.String()
}

// bridgePorts are the box's interfaces on the bridge: the workloads'
// ends of their veth pairs.
func bridgePorts(t testing.TB, bridge string) []string {
	t.Helper()
	out, err := exec.Command("ip", "-o", "link", "show", "master", bridge).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "does not exist") {
			return nil
		}
		t.Fatalf("ip link show master %s: %v: %s", bridge, err, out)
	}
	var ports []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			ports = append(ports, name)
		}
	}
	return ports
}

// traces is every trace of workload name on the box: its lease of addr,
// the host interfaces veths lists (gone or not), iptables rules naming it
// or its address, libcni's cache entries, its namespace and its files.
func traces(t testing.TB, n *network.Network, d *Driver, name, addr string, veths []string) []string {
	t.Helper()
	cfg := n.Config()
	var found []string
	if addr != "" {
		if _, err := os.Stat(filepath.Join(cfg.StateDir, "ipam", cfg.Name, addr)); err == nil {
			found = append(found, "lease of "+addr)
		}
	}
	for _, v := range veths {
		if _, err := net.InterfaceByName(v); err == nil {
			found = append(found, "interface "+v)
		}
	}
	for _, table := range []string{"nat", "filter"} {
		out, err := exec.Command("iptables-save", "-t", table).Output()
		if err != nil {
			t.Fatalf("iptables-save: %v", err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, `name: \"`+cfg.Name+`\" id: \"`+name+`\"`) || (addr != "" && strings.Contains(line, addr+"/32")) {
				found = append(found, table+" rule "+line)
			}
		}
	}
	for _, entry := range []string{cfg.Name + "-" + name + "-eth0", "cni-loopback-" + name + "-lo"} {
		if _, err := os.Stat(filepath.Join(libcni.CacheDir, "results", entry)); err == nil {
			found = append(found, "CNI cache entry "+entry)
		}
	}
	if _, err := os.Stat(n.NetnsPath(name)); err == nil {
		found = append(found, "namespace "+n.NetnsPath(name))
	}
	if _, err := os.Stat(d.netDir(name)); err == nil {
		found = append(found, "files "+d.netDir(name))
	}
	return found
}

// noTraces waits for the traces of name to go (the kernel removes a veth
// pair after its namespace's last reference, in the background) and
// fails the test with what is left.
func noTraces(t testing.TB, n *network.Network, d *Driver, name, addr string, veths []string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		left := traces(t, n, d, name, addr, veths)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s left:\n%s", name, strings.Join(left, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// isErr says whether err is of kind and mentions want.
func isErr(err, kind error, want string) bool {
	return err != nil && errors.Is(err, kind) && strings.Contains(err.Error(), want)
}
