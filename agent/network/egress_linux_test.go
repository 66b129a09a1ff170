package network

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// testDNS is a tiny DNS server: it answers A queries for the names it
// holds, NXDOMAIN for others, and SERVFAIL for the names set failing.
type testDNS struct {
	mu      sync.Mutex
	names   map[string]netip.Addr // "bank.test." → address
	failing map[string]bool
	queries atomic.Int32
}

// serveDNS runs d on addr:53 (UDP) inside the namespace at ns until the
// test ends.
func serveDNS(t *testing.T, ns string, addr netip.Addr, d *testDNS) {
	t.Helper()
	var pc net.PacketConn
	if err := InNetns(ns, func() (err error) {
		pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(addr, 53).String())
		return err
	}); err != nil {
		t.Fatalf("DNS server: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return // closed by the cleanup
			}
			if resp := d.answer(buf[:n]); resp != nil {
				pc.WriteTo(resp, from)
			}
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
}

func (d *testDNS) set(name string, a netip.Addr, failing bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.names[name+"."] = a
	d.failing[name+"."] = failing
}

func (d *testDNS) answer(req []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(req)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	d.queries.Add(1)
	d.mu.Lock()
	a, known := d.names[strings.ToLower(q.Name.String())]
	failing := d.failing[strings.ToLower(q.Name.String())]
	d.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	switch {
	case failing:
		rh.RCode = dnsmessage.RCodeServerFailure
	case !known:
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	b.StartQuestions()
	b.Question(q)
	b.StartAnswers()
	if known && !failing && q.Type == dnsmessage.TypeA {
		b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}, dnsmessage.AResource{A: a.As4()})
	}
	out, _ := b.Finish()
	return out
}

// lookupIn resolves name from inside the namespace at ns by asking the
// server directly, as the workload's resolver would.
func lookupIn(ns string, server netip.Addr, name string) (netip.Addr, error) {
	var conn net.Conn
	if err := InNetns(ns, func() (err error) {
		conn, err = net.Dial("udp4", netip.AddrPortFrom(server, 53).String())
		return err
	}); err != nil {
		return netip.Addr{}, err
	}
	defer conn.Close()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name + "."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	req, _ := b.Finish()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write(req); err != nil {
		return netip.Addr{}, err
	}
	buf := make([]byte, 512)
	n, err := conn.Read(buf)
	if err != nil {
		return netip.Addr{}, err
	}
	var msg dnsmessage.Message
	if err := msg.Unpack(buf[:n]); err != nil {
		return netip.Addr{}, err
	}
	for _, a := range msg.Answers {
		if r, ok := a.Body.(*dnsmessage.AResource); ok {
			return netip.AddrFrom4(r.A), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no address for %s: %v", name, msg.RCode)
}

// resolverAt is a resolver of the box that asks server.
func resolverAt(server netip.Addr) *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "udp4", netip.AddrPortFrom(server, 53).String())
	}}
}

// warnCounter counts warning records with one message, and passes every
// record to the test's log.
type warnCounter struct {
	slog.Handler
	msg string
	n   *atomic.Int32
}

func (h warnCounter) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn && r.Message == h.msg {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h warnCounter) WithAttrs(as []slog.Attr) slog.Handler {
	return warnCounter{h.Handler.WithAttrs(as), h.msg, h.n}
}

func (h warnCounter) WithGroup(g string) slog.Handler {
	return warnCounter{h.Handler.WithGroup(g), h.msg, h.n}
}

// newPolicies makes Policies with a chain of the test's own on n's
// bridge; when the test ends it checks that Sweep leaves nothing of it.
func newPolicies(t *testing.T, n *testNet, cfg EgressConfig, log *slog.Logger) *Policies {
	t.Helper()
	var r [3]byte
	rand.Read(r[:])
	if cfg.Chain == "" {
		cfg.Chain = "EBT" + strings.ToUpper(hex.EncodeToString(r[:]))
	}
	cfg.Bridge = n.cfg.Bridge
	if cfg.Period == 0 {
		cfg.Period = time.Hour
	}
	if cfg.ResolveTimeout == 0 {
		cfg.ResolveTimeout = 5 * time.Second
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	p, err := NewPolicies(cfg, log)
	if err != nil {
		t.Fatalf("NewPolicies: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Sweep(context.Background(), func(string) bool { return false }); err != nil {
			t.Errorf("Sweep: %v", err)
		}
		if left := egressRules(t, cfg.Chain, ""); len(left) > 0 {
			t.Errorf("after sweeping everything, these are left:\n%s", strings.Join(left, "\n"))
		}
	})
	return p
}

// egressRules are the filter table's lines naming chain, or (id not "")
// those of workload id's policy.
func egressRules(t *testing.T, chain, id string) []string {
	t.Helper()
	out, err := exec.Command("iptables-save", "-t", "filter").Output()
	if err != nil {
		t.Fatalf("iptables-save: %v", err)
	}
	var found []string
	for _, line := range strings.Split(string(out), "\n") {
		if id == "" && strings.Contains(line, chain) ||
			id != "" && strings.Contains(line, chain) && (dispatchOf(id).MatchString(line) || strings.Contains(line, chain+"-"+workloadHash(id))) {
			found = append(found, line)
		}
	}
	return found
}

// dispatchOf matches the comment of workload id's dispatch rule as
// iptables-save writes it, in quotes or not.
func dispatchOf(id string) *regexp.Regexp {
	return regexp.MustCompile(`--comment "?` + regexp.QuoteMeta(egressIDComment+id) + `("| |$)`)
}

// workloadHash is the hash in workload id's chain names.
func workloadHash(id string) string {
	p := &Policies{cfg: EgressConfig{Chain: "X"}}
	return strings.TrimPrefix(p.policyChain(id), "X-")
}

// internet is a namespace standing for the internet: HTTP servers
// "bank-a", "other", "bank-b" on .1, .2, .3 of 198.19.<n.seq>.0/24, one
// named "dns-host" on .53 port 80, and a DNS server on .53 port 53. The box
// routes that network to it.
type internet struct {
	ns                        string
	box                       netip.Addr // the box's address as the internet sees it (NAT)
	bankA, other, bankB, dnsA netip.Addr
	dns                       *testDNS
}

func newInternet(t *testing.T, n *testNet) *internet {
	t.Helper()
	ns, boxAddr, peerAddr := peer(t, "ebe", n.seq)
	in := &internet{ns: ns, box: boxAddr, dns: &testDNS{names: map[string]netip.Addr{}, failing: map[string]bool{}}}
	at := func(last int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("198.19.%d.%d", n.seq, last)) }
	in.bankA, in.other, in.bankB, in.dnsA = at(1), at(2), at(3), at(53)
	for _, a := range []netip.Addr{in.bankA, in.other, in.bankB, in.dnsA} {
		run(t, ns, "ip", "addr", "add", a.String()+"/32", "dev", "lo")
	}
	route := fmt.Sprintf("198.19.%d.0/24", n.seq)
	run(t, "", "ip", "route", "add", route, "via", peerAddr.String())
	t.Cleanup(func() { exec.Command("ip", "route", "del", route).Run() })
	serve(t, ns, in.bankA.String()+":80", "bank-a")
	serve(t, ns, in.other.String()+":80", "other")
	serve(t, ns, in.bankB.String()+":80", "bank-b")
	serve(t, ns, in.dnsA.String()+":80", "dns-host")
	serveDNS(t, ns, in.dnsA, in.dns)
	serveDNS(t, ns, in.other, in.dns) // a DNS server workloads are not given
	in.dns.set("bank.test", in.bankA, false)
	in.dns.set("other.test", in.other, false)
	return in
}

// reaches says whether a page from addr:80 reached the namespace at ns:
// nil when it did, an error wrapping ECONNREFUSED when the policy refused
// the connection.
func (in *internet) reaches(ns string, addr netip.Addr, server string) error {
	got, err := get(ns, addr.String()+":80")
	if err != nil {
		return err
	}
	if want := server + " saw " + in.box.String(); got != want {
		return fmt.Errorf("got %q, want %q", got, want)
	}
	return nil
}

// mustReach and mustBeRefused check one fetch of a workload.
func mustReach(t *testing.T, in *internet, who, ns string, addr netip.Addr, server string) {
	t.Helper()
	if err := in.reaches(ns, addr, server); err != nil {
		t.Fatalf("%s fetching from %s (%s): %v", who, server, addr, err)
	}
}

func mustBeRefused(t *testing.T, in *internet, who, ns string, addr netip.Addr, server string) {
	t.Helper()
	if err := in.reaches(ns, addr, server); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("%s fetching from %s (%s) = %v, want the connection refused", who, server, addr, err)
	}
}

func refused(t *testing.T, p *Policies, id string) uint64 {
	t.Helper()
	n, err := p.Refused(context.Background(), id)
	if err != nil {
		t.Fatalf("Refused(%s): %v", id, err)
	}
	return n
}

// eventually waits for cond, up to a deadline generous enough for a slow
// machine.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %v after a minute", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestEgressPolicy is a robot allowed only its bank: it resolves
// bank.test through its DNS server and reaches it, is refused other.test
// and every other port of the DNS server, and its refusals are counted.
// Another workload, another policy and the box's own traffic are
// untouched. When bank.test moves, the policy follows; when it stops
// resolving, the last address stays allowed and one warning is logged.
// Remove leaves no rule.
func TestEgressPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := newTestNet(t)
	in := newInternet(t, n)
	const failMsg = "an egress name does not resolve; its last addresses stay allowed"
	var warnings atomic.Int32
	log := slog.New(warnCounter{slog.NewTextHandler(t.Output(), nil), failMsg, &warnings})
	p := newPolicies(t, n, EgressConfig{Resolver: resolverAt(in.dnsA)}, log)

	robot := "robot-" + n.cfg.Bridge
	robotNs, robotRes := n.attach(t, robot, nil)
	free := "free-" + n.cfg.Bridge
	freeNs, _ := n.attach(t, free, nil)
	dns := []netip.Addr{in.dnsA}
	if err := p.Apply(ctx, robot, Source{robotRes.IP, robotRes.HostInterface}, Egress{Names: []string{"bank.test"}, DNS: dns}); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	// A workload attached after the policy: the CNI firewall plugin runs
	// again and must not put its accepting rules ahead of the policy.
	other := "other-" + n.cfg.Bridge
	otherNs, otherRes := n.attach(t, other, nil)
	if err := p.Apply(ctx, other, Source{otherRes.IP, otherRes.HostInterface}, Egress{Prefixes: []netip.Prefix{netip.PrefixFrom(in.other, 32)}, DNS: dns}); err != nil {
		t.Fatalf("Apply: %v", err)
	}

	bank, err := lookupIn(robotNs, in.dnsA, "bank.test")
	if err != nil || bank != in.bankA {
		t.Fatalf("the robot resolving bank.test = %v, %v; want %s", bank, err, in.bankA)
	}
	mustReach(t, in, "the robot", robotNs, bank, "bank-a")
	if n := refused(t, p, robot); n != 0 {
		t.Fatalf("Refused(robot) = %d before anything was refused", n)
	}
	otherAddr, err := lookupIn(robotNs, in.dnsA, "other.test")
	if err != nil || otherAddr != in.other {
		t.Fatalf("the robot resolving other.test = %v, %v; want %s", otherAddr, err, in.other)
	}
	mustBeRefused(t, in, "the robot", robotNs, otherAddr, "other")
	afterOne := refused(t, p, robot)
	if afterOne == 0 {
		t.Fatal("the refused connection was not counted")
	}
	mustBeRefused(t, in, "the robot", robotNs, in.dnsA, "dns-host") // only port 53 of its resolver
	if n := refused(t, p, robot); n <= afterOne {
		t.Fatalf("Refused(robot) = %d after a second refusal, was %d", n, afterOne)
	}

	// Others: no policy, another policy, the box itself.
	mustReach(t, in, "a workload with no policy", freeNs, in.other, "other")
	mustReach(t, in, "a workload with no policy", freeNs, in.bankA, "bank-a")
	mustReach(t, in, "the workload allowed other", otherNs, in.other, "other")
	robotRefused := refused(t, p, robot)
	mustBeRefused(t, in, "the workload allowed other", otherNs, in.bankA, "bank-a")
	if refused(t, p, other) == 0 || refused(t, p, robot) != robotRefused {
		t.Fatalf("a refusal of one workload counted as the other's: robot %d (was %d), other %d", refused(t, p, robot), robotRefused, refused(t, p, other))
	}
	all, err := p.RefusedAll(ctx)
	if err != nil || len(all) != 2 || all[robot] != refused(t, p, robot) || all[other] != refused(t, p, other) {
		t.Fatalf("RefusedAll = %v, %v; want robot %d and other %d", all, err, refused(t, p, robot), refused(t, p, other))
	}
	if got, err := get(inBox(t), in.other.String()+":80"); err != nil || !strings.HasPrefix(got, "other saw") {
		t.Fatalf("the box itself fetching from other = %q, %v", got, err)
	}

	// Not TCP: a DNS server the robot was not given is refused with an
	// ICMP error, and counted.
	if a, err := lookupIn(freeNs, in.other, "bank.test"); err != nil || a != in.bankA {
		t.Fatalf("a workload with no policy asking the DNS server on other = %v, %v", a, err)
	}
	robotRefused = refused(t, p, robot)
	if _, err := lookupIn(robotNs, in.other, "bank.test"); !errors.Is(err, syscall.EHOSTUNREACH) {
		t.Fatalf("the robot asking a DNS server it was not given = %v, want the packet refused (host unreachable)", err)
	}
	if refused(t, p, robot) <= robotRefused {
		t.Fatal("the refused UDP packet was not counted")
	}

	// The box itself: the robot is refused its services (INPUT), but
	// answers connections the box opens to it (replies are let through).
	var l net.Listener
	if l, err = net.Listen("tcp", netip.AddrPortFrom(robotRes.Gateway, 0).String()); err != nil {
		t.Fatalf("listening on the bridge: %v", err)
	}
	boxSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "box") }), ReadHeaderTimeout: 10 * time.Second}
	boxDone := make(chan struct{})
	go func() { defer close(boxDone); boxSrv.Serve(l) }()
	t.Cleanup(func() { boxSrv.Close(); <-boxDone })
	if got, err := get(freeNs, l.Addr().String()); err != nil || got != "box" {
		t.Fatalf("a workload with no policy fetching from the box = %q, %v", got, err)
	}
	if _, err := get(robotNs, l.Addr().String()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("the robot fetching from the box's own address = %v, want the connection refused", err)
	}
	serve(t, robotNs, ":8080", "robot")
	if got, err := get(inBox(t), netip.AddrPortFrom(robotRes.IP, 8080).String()); err != nil || got != "robot saw "+robotRes.Gateway.String() {
		t.Fatalf("the box fetching from the robot = %q, %v; want the robot's answer", got, err)
	}

	// The robot takes another address on the bridge's network, as a VM's
	// guest can: what it sends from it is still under its policy.
	if b, err := os.ReadFile(bridgeHooks); err != nil || strings.TrimSpace(string(b)) != "1" {
		t.Logf("%s is %q (%v): setting it to 1, as the box needs", bridgeHooks, b, err)
		if err := os.WriteFile(bridgeHooks, []byte("1\n"), 0o644); err != nil {
			t.Fatalf("the bridge's netfilter hooks: %v", err)
		}
	}
	spoof := n.subnet.Addr().As4()
	spoof[3] = 200
	spoofed := netip.AddrFrom4(spoof)
	run(t, robotNs, "ip", "addr", "add", netip.PrefixFrom(spoofed, n.subnet.Bits()).String(), "dev", "eth0")
	var conn net.Conn
	err = InNetns(robotNs, func() (err error) {
		d := net.Dialer{Timeout: 20 * time.Second, LocalAddr: &net.TCPAddr{IP: spoofed.AsSlice()}}
		conn, err = d.Dial("tcp", netip.AddrPortFrom(in.other, 80).String())
		return err
	})
	if err == nil {
		conn.Close()
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("the robot connecting to other from %s = %v, want the connection refused", spoofed, err)
	}
	// The bridge plugin detaches every address it finds on eth0.
	run(t, robotNs, "ip", "addr", "del", netip.PrefixFrom(spoofed, n.subnet.Bits()).String(), "dev", "eth0")

	// Something inserted ahead of the policy that accepts the robot's
	// traffic is passed again by Run.
	ahead := []string{"FORWARD", "-s", robotRes.IP.String(), "-m", "comment", "--comment", "ahead-" + n.cfg.Bridge, "-j", "ACCEPT"}
	run(t, "", append([]string{"iptables", "-w", "-I"}, ahead...)...)
	t.Cleanup(func() { exec.Command("iptables", append([]string{"-w", "-D"}, ahead...)...).Run() })
	if err := in.reaches(robotNs, in.other, "other"); err != nil {
		t.Fatalf("with an accepting rule ahead, the robot still could not reach other: %v (the test's rule did not work)", err)
	}

	// bank.test moves; Run follows it.
	p.cfg.Period, p.cfg.Linger = 100*time.Millisecond, 0
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	eventually(t, "Run putting the policy first again", func() error {
		if err := in.reaches(robotNs, in.other, "other"); !errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("fetching from other: %v", err)
		}
		return nil
	})
	// Rules changed behind its back are written again.
	for _, line := range egressRules(t, p.cfg.Chain, robot) {
		if dispatchOf(robot).MatchString(line) {
			run(t, "", append([]string{"iptables", "-w", "-D"}, saveWords(strings.TrimPrefix(line, "-A "))...)...)
		}
	}
	if len(egressRules(t, p.cfg.Chain, robot)) == 0 {
		t.Fatal("no rule of the robot was found to delete")
	}
	eventually(t, "Run writing the robot's deleted rules again", func() error {
		if err := in.reaches(robotNs, in.other, "other"); !errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("fetching from other: %v", err)
		}
		return nil
	})
	// A refusal chain flushed on the box: what it refused would fall
	// through to the box's own rules, which let it out.
	run(t, "", "iptables", "-w", "-F", p.refuseChain(robot))
	eventually(t, "Run writing the robot's flushed refusals again", func() error {
		if err := in.reaches(robotNs, in.other, "other"); !errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("fetching from other: %v", err)
		}
		return nil
	})
	in.dns.set("bank.test", in.bankB, false)
	eventually(t, "the policy following bank.test to its new address", func() error {
		return in.reaches(robotNs, in.bankB, "bank-b")
	})
	if bank, err := lookupIn(robotNs, in.dnsA, "bank.test"); err != nil || bank != in.bankB {
		t.Fatalf("the robot resolving bank.test = %v, %v; want %s", bank, err, in.bankB)
	}
	mustBeRefused(t, in, "the robot", robotNs, in.bankA, "bank-a (its old address)")

	// bank.test fails: the last address stays, one warning is logged.
	in.dns.set("bank.test", in.bankB, true)
	before := in.dns.queries.Load()
	eventually(t, "several failed resolutions", func() error {
		if q := in.dns.queries.Load(); q < before+6 {
			return fmt.Errorf("%d queries", q-before)
		}
		return nil
	})
	mustReach(t, in, "the robot while bank.test fails", robotNs, in.bankB, "bank-b")
	if w := warnings.Load(); w != 1 {
		t.Fatalf("%d warnings about bank.test failing, want 1", w)
	}

	// Remove: the robot is free, no rule of it is left, others keep theirs.
	if err := p.Remove(ctx, robot); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if left := egressRules(t, p.cfg.Chain, robot); len(left) > 0 {
		t.Fatalf("after Remove these rules are left:\n%s", strings.Join(left, "\n"))
	}
	if n := refused(t, p, robot); n != 0 {
		t.Fatalf("Refused after Remove = %d, want 0", n)
	}
	mustReach(t, in, "the robot after Remove", robotNs, in.other, "other")
	mustBeRefused(t, in, "the workload allowed other", otherNs, in.bankA, "bank-a")
	if err := p.Remove(ctx, robot); err != nil {
		t.Fatalf("Remove again: %v", err)
	}
}

// inBox is a namespace path for the box's own network namespace.
func inBox(t *testing.T) string {
	t.Helper()
	if boxNetns == nil {
		t.Fatal("the box's own network namespace was not opened")
	}
	return fmt.Sprintf("/proc/self/fd/%d", boxNetns.Fd())
}

// boxNetns is the box's own network namespace, opened before any test
// runs. "/proc/self/ns/net" is the main thread's namespace, and a
// parallel test's InNetns may be running on the main thread just then.
var boxNetns, _ = os.Open("/proc/thread-self/ns/net")

// TestEgressSweep is a restart of the agent: two workloads had policies;
// one is gone. Sweep in the new process removes the gone one's rules, and
// a chain no rule leads to, and keeps the live one's, still enforced and
// still counting; another chain's policies are not touched.
func TestEgressSweep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := newTestNet(t)
	in := newInternet(t, n)
	p := newPolicies(t, n, EgressConfig{}, nil)
	bankOnly := Egress{Prefixes: []netip.Prefix{netip.PrefixFrom(in.bankA, 32)}}

	alive, gone := "alive-"+n.cfg.Bridge, "gone-"+n.cfg.Bridge
	aliveNs, aliveRes := n.attach(t, alive, nil)
	goneNs, goneRes := n.attach(t, gone, nil)
	for _, w := range []struct {
		id  string
		src Source
	}{{alive, Source{aliveRes.IP, aliveRes.HostInterface}}, {gone, Source{goneRes.IP, goneRes.HostInterface}}} {
		if err := p.Apply(ctx, w.id, w.src, bankOnly); err != nil {
			t.Fatalf("Apply %s: %v", w.id, err)
		}
	}
	// Another edgebox's chain on the same bridge, with a policy of the
	// same id.
	q := newPolicies(t, n, EgressConfig{}, nil)
	if err := q.Apply(ctx, gone, Source{goneRes.IP, goneRes.HostInterface}, bankOnly); err != nil {
		t.Fatalf("Apply in another chain: %v", err)
	}
	mustBeRefused(t, in, "alive", aliveNs, in.other, "other")
	counted := refused(t, p, alive)
	orphan := p.cfg.Chain + "-0123456789"
	run(t, "", "iptables", "-w", "-N", orphan)

	restarted, err := NewPolicies(p.cfg, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatalf("NewPolicies: %v", err)
	}
	if err := restarted.Sweep(ctx, func(id string) bool { return id == alive }); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if left := egressRules(t, p.cfg.Chain, gone); len(left) > 0 {
		t.Fatalf("after Sweep these rules of the gone workload are left:\n%s", strings.Join(left, "\n"))
	}
	if left := egressRules(t, orphan, ""); len(left) > 0 {
		t.Fatalf("after Sweep the orphan chain is left:\n%s", strings.Join(left, "\n"))
	}
	if len(egressRules(t, p.cfg.Chain, alive)) == 0 || len(egressRules(t, q.cfg.Chain, gone)) == 0 {
		t.Fatal("Sweep removed the live workload's rules or another chain's")
	}
	if got := refused(t, restarted, alive); got != counted {
		t.Fatalf("Refused(alive) after the restart = %d, want %d", got, counted)
	}
	mustBeRefused(t, in, "alive after Sweep", aliveNs, in.other, "other")
	mustReach(t, in, "alive after Sweep", aliveNs, in.bankA, "bank-a")
	if refused(t, restarted, alive) <= counted {
		t.Fatal("a refusal after the restart was not counted")
	}
	// The new process applies the live workload's policy again, now
	// allowing other too: the count goes on.
	counted = refused(t, restarted, alive)
	both := Egress{Prefixes: []netip.Prefix{netip.PrefixFrom(in.bankA, 32), netip.PrefixFrom(in.other, 32)}}
	if err := restarted.Apply(ctx, alive, Source{aliveRes.IP, aliveRes.HostInterface}, both); err != nil {
		t.Fatalf("Apply after the restart: %v", err)
	}
	if got := refused(t, restarted, alive); got != counted {
		t.Fatalf("Refused(alive) after applying again = %d, want %d", got, counted)
	}
	mustReach(t, in, "alive allowed other too", aliveNs, in.other, "other")
	mustBeRefused(t, in, "alive allowed other too", aliveNs, in.bankB, "bank-b")
	// The gone workload's address is now only under q's policy.
	mustBeRefused(t, in, "gone, under another chain's policy", goneNs, in.other, "other")
	if err := q.Remove(ctx, gone); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	mustReach(t, in, "gone after both policies went", goneNs, in.other, "other")

	// The last policy removed, nothing of the chain is left.
	if err := restarted.Remove(ctx, alive); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if left := egressRules(t, p.cfg.Chain, ""); len(left) > 0 {
		t.Fatalf("with no policy left these rules are left:\n%s", strings.Join(left, "\n"))
	}
}
