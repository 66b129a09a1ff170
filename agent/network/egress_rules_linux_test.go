package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgebox/edgebox/errdefs"
)

// TestEgressLinger follows a name through its moves with the clock
// moved by hand: an address the name left stays allowed for Linger, then
// goes; answers the box never had do not count. Real iptables, no
// traffic.
func TestEgressLinger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := newTestNet(t)
	res := &mapResolver{addrs: map[string][]netip.Addr{"bank.test": {netip.MustParseAddr("192.0.2.1")}}}
	p := newPolicies(t, n, EgressConfig{Resolver: res, Linger: time.Hour}, nil)
	now := time.Unix(1_000_000, 0)
	p.now = func() time.Time { return now }
	id := "linger-" + n.cfg.Bridge
	src := n.subnet.Addr().Next().Next()
	if err := p.Apply(ctx, id, Source{Addr: src}, Egress{Names: []string{"bank.test"}, Prefixes: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}}); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	steps := []struct {
		name    string
		advance time.Duration
		answer  []string // nil: the lookup fails
		want    []string
	}{
		{"first answer", 0, []string{"192.0.2.1"}, []string{"192.0.2.1/32", "198.51.100.0/24"}},
		{"moved", time.Minute, []string{"192.0.2.2"}, []string{"192.0.2.1/32", "192.0.2.2/32", "198.51.100.0/24"}},
		{"rotating", time.Minute, []string{"192.0.2.3", "192.0.2.2"}, []string{"192.0.2.1/32", "192.0.2.2/32", "192.0.2.3/32", "198.51.100.0/24"}},
		{"first expires", time.Hour - time.Minute, []string{"192.0.2.3"}, []string{"192.0.2.2/32", "192.0.2.3/32", "198.51.100.0/24"}},
		{"failing keeps all", 10 * time.Hour, nil, []string{"192.0.2.2/32", "192.0.2.3/32", "198.51.100.0/24"}},
		{"back, the rest expired", 0, []string{"192.0.2.9"}, []string{"192.0.2.9/32", "198.51.100.0/24"}},
		{"loopback and multicast answers are no destinations", time.Minute, []string{"127.0.0.1", "224.0.0.1", "192.0.2.9"}, []string{"192.0.2.9/32", "198.51.100.0/24"}},
		{"a huge answer is bounded", 2 * time.Hour, hugeAnswer(1000), append(hugeAnswer(maxAddrsPerName), "198.51.100.0/24")},
	}
	for _, s := range steps {
		now = now.Add(s.advance)
		res.set("bank.test", s.answer)
		p.refresh(ctx)
		var got []string
		for _, line := range egressRules(t, p.cfg.Chain, id) {
			f := strings.Fields(line)
			if len(f) > 4 && f[0] == "-A" && f[2] == "-d" && f[len(f)-1] == "RETURN" && !strings.Contains(line, "--dport") {
				got = append(got, f[3])
			}
		}
		if strings.Join(got, " ") != strings.Join(s.want, " ") {
			t.Fatalf("%s: the policy allows %v, want %v", s.name, got, s.want)
		}
	}
}

// hugeAnswer is n addresses of 10.240.0.0/16, sorted.
func hugeAnswer(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.240.%d.%d/32", i/250, i%250+1)
	}
	return out
}

// mapResolver answers from a map; a name with no entry fails.
type mapResolver struct {
	mu    sync.Mutex
	addrs map[string][]netip.Addr
}

func (r *mapResolver) set(name string, addrs []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if addrs == nil {
		delete(r.addrs, name)
		return
	}
	r.addrs[name] = nil
	for _, a := range addrs {
		r.addrs[name] = append(r.addrs[name], netip.MustParseAddr(strings.TrimSuffix(a, "/32")))
	}
}

func (r *mapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.addrs[host]
	if !ok {
		return nil, &net.DNSError{Err: "server misbehaving", Name: host, IsTemporary: true}
	}
	return a, nil
}

// TestEgressApplyRefuses is what Apply refuses, leaving the rules as
// they were.
func TestEgressApplyRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := newTestNet(t)
	p := newPolicies(t, n, EgressConfig{Resolver: &mapResolver{addrs: map[string][]netip.Addr{}}}, nil)
	src := n.subnet.Addr().Next().Next()
	held := "held-" + n.cfg.Bridge
	good := Egress{Prefixes: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}
	if err := p.Apply(ctx, held, Source{src, "vethheld"}, good); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	before := egressRules(t, p.cfg.Chain, "")
	cases := []struct {
		name   string
		id     string
		src    netip.Addr
		hostIf string
		e      Egress
		kind   error
		want   string
	}{
		{"bad id", "../x", src.Next(), "", good, errdefs.ErrInvalid, "workload id"},
		{"no source", "w1", netip.Addr{}, "", good, errdefs.ErrInvalid, "not a workload's IPv4 address"},
		{"IPv6 source", "w1", netip.MustParseAddr("fd00::2"), "", good, errdefs.ErrInvalid, "not a workload's IPv4 address"},
		{"loopback source", "w1", netip.MustParseAddr("127.0.0.2"), "", good, errdefs.ErrInvalid, "not a workload's IPv4 address"},
		{"bad name", "w1", src.Next(), "", Egress{Names: []string{"Bank.test"}}, errdefs.ErrInvalid, "write it as"},
		{"bad prefix", "w1", src.Next(), "", Egress{Prefixes: []netip.Prefix{netip.MustParsePrefix("192.0.2.1/24")}}, errdefs.ErrInvalid, "host bits"},
		{"address under another policy", "w1", src, "", good, errdefs.ErrConflict, "under the egress policy of workload " + held},
		{"bad interface", "w1", src.Next(), "veth 1", good, errdefs.ErrInvalid, "host interface"},
		{"interface under another policy", "w1", src.Next(), "vethheld", good, errdefs.ErrConflict, "interface vethheld is under the egress policy of workload " + held},
	}
	for _, c := range cases {
		if err := p.Apply(ctx, c.id, Source{c.src, c.hostIf}, c.e); !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Apply (%s) = %v, want a %v error mentioning %q", c.name, err, c.kind, c.want)
		}
	}
	if after := egressRules(t, p.cfg.Chain, ""); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Fatalf("refused applies changed the rules:\n%s\nwas:\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
	// Any takes the policy away.
	if err := p.Apply(ctx, held, Source{Addr: src}, Egress{Any: true}); err != nil {
		t.Fatalf("Apply any: %v", err)
	}
	if left := egressRules(t, p.cfg.Chain, ""); len(left) > 0 {
		t.Fatalf("after Apply with Any these are left:\n%s", strings.Join(left, "\n"))
	}
	for _, bad := range []EgressConfig{
		{Chain: "", Period: time.Second, ResolveTimeout: time.Second},
		{Chain: "EDGEBOX-EGRESS-X", Period: time.Second, ResolveTimeout: time.Second},
		{Chain: "EB EG", Period: time.Second, ResolveTimeout: time.Second},
		{Chain: "EB", Period: 0, ResolveTimeout: time.Second},
		{Chain: "EB", Period: time.Second, ResolveTimeout: time.Second, Linger: -1},
		{Chain: "EB", Period: time.Second, ResolveTimeout: time.Second, Bridge: "bridge-name-too-long"},
	} {
		if _, err := NewPolicies(bad, nil); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("NewPolicies(%+v) = %v, want an invalid-argument error", bad, err)
		}
	}
	if err := DefaultEgressConfig().Validate(); err != nil {
		t.Errorf("the default configuration: %v", err)
	}
}

// TestEgressConcurrent applies and removes the policies of many
// workloads at once while Run follows their names: each ends with
// exactly its own rules, then none.
func TestEgressConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := newTestNet(t)
	res := &mapResolver{addrs: map[string][]netip.Addr{}}
	p := newPolicies(t, n, EgressConfig{Resolver: res, Period: 20 * time.Millisecond}, nil)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	defer func() { stop(); <-done }()

	const count = 16
	ids := make([]string, count)
	src := n.subnet.Addr().Next()
	srcs := make([]netip.Addr, count)
	for i := range ids {
		ids[i] = fmt.Sprintf("w%d-%s", i, n.cfg.Bridge)
		src = src.Next()
		srcs[i] = src
		res.set(fmt.Sprintf("bank%d.test", i), []string{fmt.Sprintf("192.0.2.%d", i+1)})
	}
	each := func(fn func(i int) error) {
		t.Helper()
		errs := make(chan error, count)
		for i := range ids {
			go func() { errs <- fn(i) }()
		}
		for range ids {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
	each(func(i int) error {
		return p.Apply(ctx, ids[i], Source{Addr: srcs[i]}, Egress{Names: []string{fmt.Sprintf("bank%d.test", i)}})
	})
	all, err := p.RefusedAll(ctx)
	if err != nil || len(all) != count {
		t.Fatalf("RefusedAll = %v, %v; want %d workloads", all, err, count)
	}
	for i, id := range ids {
		rules := strings.Join(egressRules(t, p.cfg.Chain, id), "\n")
		if len(dispatchOf(id).FindAllString(rules, -1)) != 1 || !strings.Contains(rules, fmt.Sprintf("-d 192.0.2.%d/32 -j RETURN", i+1)) {
			t.Fatalf("the rules of %s:\n%s\nwant one dispatch rule and its bank's address", id, rules)
		}
	}
	each(func(i int) error { return p.Remove(ctx, ids[i]) })
	if left := egressRules(t, p.cfg.Chain, ""); len(left) > 0 {
		t.Fatalf("after removing every policy these are left:\n%s", strings.Join(left, "\n"))
	}
}

// TestEgressFreshBox applies the first policy on a box whose filter table
// does not exist yet (a namespace of its own), and removes it: the table
// is made, and nothing of the chain is left.
func TestEgressFreshBox(t *testing.T) {
	t.Parallel()
	needPlugins(t)
	ctx := context.Background()
	box := newNetns(t, t.TempDir(), "fresh")
	save := func() string {
		return run(t, box, "iptables-save", "-t", "filter")
	}
	if out := save(); strings.Contains(out, "-A ") {
		t.Fatalf("a fresh namespace has rules:\n%s", out)
	}
	p, err := NewPolicies(EgressConfig{Chain: "EDGEBOX-EGRESS", Bridge: "edgebox0", Period: time.Hour, ResolveTimeout: time.Second},
		slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	src := Source{netip.MustParseAddr("10.234.0.2"), "veth1234"}
	// InNetns runs on one thread, and the iptables programs start from it.
	if err := InNetns(box, func() error {
		return p.Apply(ctx, "robot", src, Egress{Prefixes: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}})
	}); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	out := save()
	for _, want := range []string{
		"-A FORWARD -m comment --comment edgebox-egress -j EDGEBOX-EGRESS",
		"-A INPUT -m comment --comment edgebox-egress -j EDGEBOX-EGRESS",
		"-A EDGEBOX-EGRESS -s 10.234.0.2/32 -i edgebox0 -m comment",
		"! -s 10.234.0.2/32 -m physdev --physdev-in veth1234",
		"-d 192.0.2.0/24 -j RETURN",
		"-p tcp -j REJECT --reject-with tcp-reset",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the rules lack %q:\n%s", want, out)
		}
	}
	if err := InNetns(box, func() error { return p.Remove(ctx, "robot") }); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if out := save(); strings.Contains(out, "EDGEBOX") {
		t.Fatalf("after Remove these are left:\n%s", out)
	}
}
