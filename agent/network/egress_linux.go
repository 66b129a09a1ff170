package network

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/edgebox/edgebox/errdefs"
)

// Egress policies are iptables rules in the filter table, written with
// iptables-restore: each change is one transaction (one nf_tables batch
// with the nft backend Debian uses), so a workload's rules are swapped
// whole and never seen half-written.
//
// The layout, for EgressConfig.Chain "EDGEBOX-EGRESS":
//
//	FORWARD, INPUT     first rule: -m comment --comment edgebox-egress -j EDGEBOX-EGRESS
//	EDGEBOX-EGRESS     per workload with a policy, its dispatch rules:
//	                   -s <workload>/32 [-i <bridge>] -m comment --comment edgebox-egress:<id> -j EDGEBOX-EGRESS-<h>
//	                   and with a host interface, what it sends from other addresses:
//	                   ! -s <workload>/32 -m physdev --physdev-in <veth or tap> -m comment ... -j EDGEBOX-EGRESS-<h>
//	EDGEBOX-EGRESS-<h> the workload's policy, rebuilt whole on each change:
//	                   established and related: RETURN; DNS to its resolvers: RETURN;
//	                   each allowed prefix and resolved address: RETURN; then -j EDGEBOX-EGRESS-<h>-R
//	EDGEBOX-EGRESS-<h>-R  written once, so its counters are the workload's refusals:
//	                   -p tcp -j REJECT --reject-with tcp-reset
//	                   -j REJECT --reject-with icmp-admin-prohibited
//
// <h> is 10 hex digits of the SHA-256 of the workload id. Allowed traffic
// RETURNs to the box's own rules (CNI's forwarding rules, a host
// firewall), so a policy only ever takes away. Refused traffic is
// rejected rather than silently dropped: the packet goes no further, and
// the workload learns at once (a TCP reset, an ICMP "administratively
// prohibited") instead of waiting out its connect timeout, so one refused
// TCP connection counts as one refused packet.
//
// A connection already open when its destination stops being allowed
// (a policy narrowed, a name moved) goes on until it closes. Traffic a
// workload does not send through the bridge (QEMU's user-mode network,
// which leaves from the QEMU process on the box) is not seen here.

const (
	// egressJumpComment marks the jumps from FORWARD and INPUT.
	egressJumpComment = "edgebox-egress"
	// egressIDComment prefixes the workload id on its dispatch rule.
	egressIDComment = "edgebox-egress:"
	// egressHashLen is the hex digits of a workload chain's hash.
	egressHashLen = 10
	// maxEgressChain leaves room for "-<hash>-R" in iptables' 28
	// characters.
	maxEgressChain = 28 - 1 - egressHashLen - 2
)

// egressHooks are the built-in chains that jump to the policies: traffic
// through the box, and traffic to the box itself.
var egressHooks = []string{"FORWARD", "INPUT"}

// Resolver resolves names for egress policies; *net.Resolver is one.
// network is "ip4".
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// EgressConfig says how Policies enforces egress policies.
type EgressConfig struct {
	// Chain is the filter-table chain that FORWARD and INPUT jump to first
	// and that holds one rule per workload; the workloads' chains are
	// named after it. At most 15 letters, digits, '_' or '-'.
	Chain string
	// Bridge, when set, limits the rules to traffic that comes in on the
	// workloads' bridge, so that no other interface's traffic can match.
	Bridge string
	// Period is how often names are resolved again ("30s" by default: a
	// bank's name that moves is followed within that).
	Period time.Duration
	// Linger is how long an address a name no longer resolves to stays
	// allowed. A workload asks its resolver itself and may hold an answer
	// the box has not seen (a rotating CDN, a cached answer); 5 minutes
	// covers the caches of common HTTP clients and runtimes.
	Linger time.Duration
	// ResolveTimeout bounds one lookup of one name.
	ResolveTimeout time.Duration
	// Resolver resolves names; nil is the box's resolver.
	Resolver Resolver
}

// DefaultEgressConfig is edgebox's egress enforcement on its bridge.
func DefaultEgressConfig() EgressConfig {
	return EgressConfig{
		Chain:          "EDGEBOX-EGRESS",
		Bridge:         DefaultConfig().Bridge,
		Period:         30 * time.Second,
		Linger:         5 * time.Minute,
		ResolveTimeout: 5 * time.Second,
	}
}

var egressChainPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_\-]*$`)

// Validate says what is wrong with c, as an errdefs.ErrInvalid error.
func (c EgressConfig) Validate() error {
	if len(c.Chain) > maxEgressChain || !egressChainPattern.MatchString(c.Chain) {
		return errdefs.Invalid("network: egress chain %q: want 1 to %d letters, digits, '_' or '-'", c.Chain, maxEgressChain)
	}
	if c.Bridge != "" && (len(c.Bridge) > 15 || !bridgePattern.MatchString(c.Bridge)) {
		return errdefs.Invalid("network: egress bridge %q: want 1 to 15 letters, digits, '_', '.' or '-'", c.Bridge)
	}
	if c.Period <= 0 {
		return errdefs.Invalid("network: egress period %s: want a positive duration such as \"30s\"", c.Period)
	}
	if c.Linger < 0 {
		return errdefs.Invalid("network: egress linger %s is negative", c.Linger)
	}
	if c.ResolveTimeout <= 0 {
		return errdefs.Invalid("network: egress resolve timeout %s: want a positive duration such as \"5s\"", c.ResolveTimeout)
	}
	return nil
}

// Policies enforces workloads' egress policies on the box. Apply, Remove,
// Refused and Sweep are safe for concurrent use; Run follows the policies'
// names until its context ends. Rules outlive the process (not a reboot),
// so at start the agent calls Sweep for the workloads that are gone and
// Apply again for the others.
type Policies struct {
	cfg      EgressConfig
	resolver Resolver
	log      *slog.Logger
	now      func() time.Time // tests move time
	// warnHooks logs once that host interfaces cannot be matched.
	warnHooks sync.Once

	// mu guards policies and serializes the iptables transactions, each of
	// which is built from a fresh read of the table.
	mu       sync.Mutex
	policies map[string]*policy
}

// policy is one workload's policy as last applied.
type policy struct {
	src    Source
	egress Egress
	// seen is when each name last resolved to each address.
	seen map[string]map[netip.Addr]time.Time
	// failing are the names whose failure to resolve was logged; one is
	// logged again only after it resolved.
	failing map[string]bool
	// allowed is what the workload's chain allows now.
	allowed []netip.Prefix
	// gen changes with each Apply, so that a refresh that resolved while
	// an Apply ran does not write over it.
	gen uint64
}

// NewPolicies checks cfg; it changes nothing on the box.
func NewPolicies(cfg EgressConfig, log *slog.Logger) (*Policies, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := exec.LookPath("iptables-restore"); err != nil {
		return nil, errdefs.Unavailable("network: egress policies need iptables-restore (install iptables): %v", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := cfg.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	return &Policies{
		cfg:      cfg,
		resolver: r,
		log:      log.With("component", "egress"),
		now:      time.Now,
		policies: map[string]*policy{},
	}, nil
}

// Source says whose traffic a policy is for.
type Source struct {
	// Addr is the workload's IPv4 address on the bridge.
	Addr netip.Addr
	// HostInterface, when set, is the box's end of the workload's link to
	// the bridge (its veth or tap). All that comes in through it is then
	// under the policy whatever its source address, so a workload that
	// can change its address (a VM's guest, a container with
	// CAP_NET_ADMIN) cannot leave its policy. It takes the bridge's
	// netfilter hooks (sysctl net.bridge.bridge-nf-call-iptables = 1, the
	// kernel's default once br_netfilter is loaded); without them only
	// Addr is matched, and a warning is logged.
	HostInterface string
}

func (s Source) String() string {
	if s.HostInterface == "" {
		return s.Addr.String()
	}
	return s.Addr.String() + " on " + s.HostInterface
}

// Apply enforces e for workload id, whose traffic comes from src:
// its traffic to e's destinations and its DNS servers, and replies on its
// connections, pass; all else it sends is refused and counted. Its names
// are resolved first; one that does not resolve allows nothing until it
// does (a warning is logged). Applying again replaces the policy, keeping
// the refusal count. An Egress with Any removes the workload's rules.
// Another workload's policy on the same address is an errdefs.ErrConflict
// error.
func (p *Policies) Apply(ctx context.Context, id string, src Source, e Egress) error {
	if err := validID(id); err != nil {
		return err
	}
	if a := src.Addr; !a.Is4() || a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() {
		return errdefs.Invalid("network: egress of %s: source %s is not a workload's IPv4 address", id, a)
	}
	if src.HostInterface != "" {
		if len(src.HostInterface) > 15 || !bridgePattern.MatchString(src.HostInterface) {
			return errdefs.Invalid("network: egress of %s: host interface %q: want 1 to 15 letters, digits, '_', '.' or '-'", id, src.HostInterface)
		}
		p.checkBridgeHooks()
	}
	if err := e.Validate(); err != nil {
		return err
	}
	if e.Any {
		return p.Remove(ctx, id)
	}
	e = Egress{
		Names:    slices.Clone(e.Names),
		Prefixes: slices.Clone(e.Prefixes),
		DNS:      slices.Clone(e.DNS),
	}
	found := p.resolve(ctx, e.Names)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("network: egress of %s: %w", id, err)
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	pol := &policy{src: src, egress: e, seen: map[string]map[netip.Addr]time.Time{}, failing: map[string]bool{}}
	if old, ok := p.policies[id]; ok {
		pol.gen = old.gen + 1
		for _, n := range e.Names { // what the names resolved to before still lingers
			if s, ok := old.seen[n]; ok {
				pol.seen[n] = s
				pol.failing[n] = old.failing[n]
			}
		}
	}
	p.merge(id, pol, found)
	allowed := p.allowedOf(pol)
	if err := p.write(ctx, id, src, e.DNS, allowed); err != nil {
		return fmt.Errorf("network: egress of %s: %w", id, err)
	}
	pol.allowed = allowed
	p.policies[id] = pol
	p.log.Info("egress policy applied", "workload", id, "source", src, "egress", e, "allowed", len(allowed))
	return nil
}

// Remove takes away workload id's rules, if it has any.
func (p *Policies) Remove(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.policies, id)
	if err := p.remove(ctx, func(got string) bool { return got == id }); err != nil {
		return fmt.Errorf("network: removing the egress policy of %s: %w", id, err)
	}
	return nil
}

// Sweep removes the rules of every workload keep says is gone, and rules
// of this chain that no workload's rule leads to (none are left by this
// package, but a box's admin may have been at work). The agent runs it at
// start.
func (p *Policies) Sweep(ctx context.Context, keep func(id string) bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id := range p.policies {
		if !keep(id) {
			delete(p.policies, id)
		}
	}
	if err := p.remove(ctx, func(id string) bool { return !keep(id) }); err != nil {
		return fmt.Errorf("network: sweeping egress policies: %w", err)
	}
	return nil
}

// Refused is how many packets workload id's policy refused since it was
// first applied; for TCP, one per refused connection. A workload with no
// policy has refused nothing.
func (p *Policies) Refused(ctx context.Context, id string) (uint64, error) {
	if err := validID(id); err != nil {
		return 0, err
	}
	t, err := readFilter(ctx)
	if err != nil {
		return 0, fmt.Errorf("network: egress refusals of %s: %w", id, err)
	}
	var n uint64
	refuse := p.refuseChain(id)
	for _, r := range t.rules {
		if r.chain == refuse {
			n += r.packets
		}
	}
	return n, nil
}

// RefusedAll is Refused of every workload with a policy in the chain, by
// id, from one read of the rules: for a status report of all workloads.
func (p *Policies) RefusedAll(ctx context.Context) (map[string]uint64, error) {
	t, err := readFilter(ctx)
	if err != nil {
		return nil, fmt.Errorf("network: egress refusals: %w", err)
	}
	byChain := map[string]uint64{}
	for _, r := range t.rules {
		byChain[r.chain] += r.packets
	}
	out := map[string]uint64{}
	for _, r := range t.rules {
		if id := r.egressID(); r.chain == p.cfg.Chain && id != "" {
			out[id] = byChain[p.refuseChain(id)]
		}
	}
	return out, nil
}

// Run resolves the policies' names again every Period, and again puts the
// jumps to the policies first in FORWARD and INPUT if something was
// inserted before them, until ctx ends. Errors are logged; it returns nil
// when ctx ends.
func (p *Policies) Run(ctx context.Context) error {
	tick := time.NewTicker(p.cfg.Period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			p.refresh(ctx)
		}
	}
}

// refresh resolves every policy's names and rewrites the chains whose
// allowed addresses changed.
func (p *Policies) refresh(ctx context.Context) {
	type job struct {
		id    string
		gen   uint64
		names []string
	}
	p.mu.Lock()
	var jobs []job
	var names []string
	for id, pol := range p.policies {
		jobs = append(jobs, job{id, pol.gen, pol.egress.Names})
		for _, n := range pol.egress.Names {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	p.mu.Unlock()
	if len(jobs) == 0 {
		return
	}
	found := p.resolve(ctx, names)
	if ctx.Err() != nil {
		return // the lookups were cut short, not failed
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	t, err := readFilter(ctx)
	if err != nil {
		p.log.Warn("checking egress policies", "err", err)
		return
	}
	for _, j := range jobs {
		pol, ok := p.policies[j.id]
		if !ok || pol.gen != j.gen {
			continue // removed or applied again meanwhile, with fresh answers
		}
		p.merge(j.id, pol, found)
		allowed := p.allowedOf(pol)
		intact := p.intact(t, j.id)
		if slices.Equal(allowed, pol.allowed) && intact {
			continue
		}
		if err := p.write(ctx, j.id, pol.src, pol.egress.DNS, allowed); err != nil {
			p.log.Warn("updating an egress policy", "workload", j.id, "err", err)
			continue
		}
		if intact {
			p.log.Info("egress policy follows its names", "workload", j.id, "allowed", len(allowed), "was", len(pol.allowed))
		} else {
			p.log.Warn("an egress policy's rules were changed on the box; written again", "workload", j.id)
		}
		pol.allowed = allowed
	}
	if len(p.policies) > 0 {
		if err := p.ensureHooks(ctx); err != nil {
			p.log.Warn("checking the egress jumps", "err", err)
		}
	}
}

// intact says whether workload id's rules are in t as write leaves them:
// its dispatch rule, its chain ending in its refusal chain, and that
// chain's two rules.
func (p *Policies) intact(t *filterTable, id string) bool {
	chain, refuse := p.policyChain(id), p.refuseChain(id)
	dispatch, last := false, ""
	for _, r := range t.rules {
		switch r.chain {
		case p.cfg.Chain:
			dispatch = dispatch || r.egressID() == id && r.target() == chain
		case chain:
			last = r.target()
		}
	}
	return dispatch && last == refuse && countRejects(t, refuse) == 2
}

// countRejects is how many REJECT rules refusal chain refuse holds in t.
func countRejects(t *filterTable, refuse string) int {
	n := 0
	for _, r := range t.rules {
		if r.chain == refuse && r.target() == "REJECT" {
			n++
		}
	}
	return n
}

// lookup is one name's answer.
type lookup struct {
	addrs []netip.Addr
	err   error
}

// resolve looks names up, a few at a time, each within ResolveTimeout.
func (p *Policies) resolve(ctx context.Context, names []string) map[string]lookup {
	out := make(map[string]lookup, len(names))
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, name := range names {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			lctx, cancel := context.WithTimeout(ctx, p.cfg.ResolveTimeout)
			defer cancel()
			addrs, err := p.resolver.LookupNetIP(lctx, "ip4", name)
			var l lookup
			for _, a := range addrs {
				a = a.Unmap()
				if len(l.addrs) == maxAddrsPerName {
					break // an answer is bounded like what is kept of it
				}
				if checkEgressAddr(a) == nil && !slices.Contains(l.addrs, a) {
					l.addrs = append(l.addrs, a)
				}
			}
			if err == nil && len(l.addrs) == 0 {
				err = errors.New("no IPv4 address")
			}
			l.err = err
			mu.Lock()
			out[name] = l
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// merge records what pol's names resolved to. A name that failed keeps
// its addresses; its failure is logged once.
func (p *Policies) merge(id string, pol *policy, found map[string]lookup) {
	now := p.now()
	for _, name := range pol.egress.Names {
		l, ok := found[name]
		if !ok {
			continue
		}
		if l.err != nil {
			if !pol.failing[name] {
				pol.failing[name] = true
				p.log.Warn("an egress name does not resolve; its last addresses stay allowed",
					"workload", id, "name", name, "addresses", len(pol.seen[name]), "err", l.err)
			}
			continue
		}
		if pol.failing[name] {
			delete(pol.failing, name)
			p.log.Info("an egress name resolves again", "workload", id, "name", name)
		}
		s := pol.seen[name]
		if s == nil {
			s = map[netip.Addr]time.Time{}
			pol.seen[name] = s
		}
		for _, a := range l.addrs {
			s[a] = now
		}
		// Expired addresses go; the newest are kept.
		for a, t := range s {
			if now.Sub(t) > p.cfg.Linger && !slices.Contains(l.addrs, a) {
				delete(s, a)
			}
		}
		if len(s) > maxAddrsPerName {
			addrs := slices.Collect(maps.Keys(s))
			slices.SortFunc(addrs, func(a, b netip.Addr) int { return s[b].Compare(s[a]) })
			for _, a := range addrs[maxAddrsPerName:] {
				delete(s, a)
			}
		}
	}
}

// allowedOf is the sorted prefixes pol allows now: its own and its names'
// addresses.
func (p *Policies) allowedOf(pol *policy) []netip.Prefix {
	set := map[netip.Prefix]bool{}
	for _, pr := range pol.egress.Prefixes {
		set[pr] = true
	}
	for _, s := range pol.seen {
		for a := range s {
			set[netip.PrefixFrom(a, 32)] = true
		}
	}
	out := slices.Collect(maps.Keys(set))
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return out
}

// policyChain and refuseChain are workload id's chains.
func (p *Policies) policyChain(id string) string {
	h := sha256.Sum256([]byte(id))
	return p.cfg.Chain + "-" + strings.ToUpper(hex.EncodeToString(h[:]))[:egressHashLen]
}

func (p *Policies) refuseChain(id string) string { return p.policyChain(id) + "-R" }

// isOwnChain says whether chain is a workload chain of this Chain.
func (p *Policies) isOwnChain(chain string) bool {
	rest, ok := strings.CutPrefix(chain, p.cfg.Chain+"-")
	if !ok {
		return false
	}
	rest = strings.TrimSuffix(rest, "-R")
	return len(rest) == egressHashLen && strings.Trim(rest, "0123456789ABCDEF") == ""
}

// write installs or replaces workload id's rules in one transaction. The
// caller holds mu.
func (p *Policies) write(ctx context.Context, id string, src Source, dns []netip.Addr, allowed []netip.Prefix) error {
	t, err := readFilter(ctx)
	if err != nil {
		return err
	}
	chain, refuse := p.policyChain(id), p.refuseChain(id)
	var decl, body bytes.Buffer
	for _, r := range t.rules {
		if r.chain != p.cfg.Chain {
			continue
		}
		other := r.egressID()
		switch {
		case other == id:
			fmt.Fprintf(&body, "-D %s\n", r.spec) // replaced below
		case other != "" && r.source() == src.Addr:
			return errdefs.Conflict("address %s is under the egress policy of workload %s; remove that first", src.Addr, other)
		case other != "" && src.HostInterface != "" && r.field("--physdev-in") == src.HostInterface:
			return errdefs.Conflict("interface %s is under the egress policy of workload %s; remove that first", src.HostInterface, other)
		case other != "" && r.target() == chain:
			return errdefs.Conflict("workload %s's egress chain %s is also workload %s's", id, chain, other)
		}
	}
	p.hooksScript(t, &decl, &body)
	if t.chains[chain] {
		fmt.Fprintf(&body, "-F %s\n", chain)
	} else {
		fmt.Fprintf(&decl, ":%s - [0:0]\n", chain)
	}
	if rejects := countRejects(t, refuse); !t.chains[refuse] || rejects != 2 {
		// Declared only when missing: iptables-restore flushes a chain it
		// is told about, which would lose the count. One present without
		// its two rejects (flushed on the box) is written again, or what
		// it should refuse would fall through to the box's own rules.
		if t.chains[refuse] {
			fmt.Fprintf(&body, "-F %s\n", refuse)
		} else {
			fmt.Fprintf(&decl, ":%s - [0:0]\n", refuse)
		}
		fmt.Fprintf(&body, "-A %s -p tcp -j REJECT --reject-with tcp-reset\n", refuse)
		fmt.Fprintf(&body, "-A %s -j REJECT --reject-with icmp-admin-prohibited\n", refuse)
	}
	fmt.Fprintf(&body, "-A %s -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN\n", chain)
	for _, d := range dns {
		for _, proto := range []string{"udp", "tcp"} {
			fmt.Fprintf(&body, "-A %s -d %s/32 -p %s -m %s --dport 53 -j RETURN\n", chain, d, proto, proto)
		}
	}
	for _, a := range allowed {
		fmt.Fprintf(&body, "-A %s -d %s -j RETURN\n", chain, a)
	}
	fmt.Fprintf(&body, "-A %s -j %s\n", chain, refuse)
	fmt.Fprintf(&body, "-A %s -s %s/32%s -m comment --comment %s%s -j %s\n", p.cfg.Chain, src.Addr, p.inBridge(), egressIDComment, id, chain)
	if src.HostInterface != "" {
		// What the workload sends from another address; from its own, the
		// rule above has been through the chain already.
		fmt.Fprintf(&body, "-A %s -m physdev --physdev-in %s ! -s %s/32 -m comment --comment %s%s -j %s\n",
			p.cfg.Chain, src.HostInterface, src.Addr, egressIDComment, id, chain)
	}
	return restoreFilter(ctx, decl.String()+body.String())
}

// bridgeHooks is where the kernel says whether bridged traffic passes
// iptables.
const bridgeHooks = "/proc/sys/net/bridge/bridge-nf-call-iptables"

// checkBridgeHooks warns, once, when a host interface cannot be matched.
func (p *Policies) checkBridgeHooks() {
	b, err := os.ReadFile(bridgeHooks)
	if err == nil && strings.TrimSpace(string(b)) == "1" {
		return
	}
	p.warnHooks.Do(func() {
		p.log.Warn("bridged traffic does not pass iptables; a workload that changes its address leaves its egress policy",
			"sysctl", "net.bridge.bridge-nf-call-iptables", "want", 1, "err", err)
	})
}

func (p *Policies) inBridge() string {
	if p.cfg.Bridge == "" {
		return ""
	}
	return " -i " + p.cfg.Bridge
}

// hooksScript adds to a transaction what makes the chain exist and the
// jumps to it come first in FORWARD and INPUT, ahead of rules that accept
// (CNI's firewall plugin inserts its own jump first, once). Jumps of other
// egress chains (another edgebox on the box, tests) may stay ahead.
func (p *Policies) hooksScript(t *filterTable, decl, body *bytes.Buffer) {
	if !t.chains[p.cfg.Chain] {
		fmt.Fprintf(decl, ":%s - [0:0]\n", p.cfg.Chain)
	}
	jump := fmt.Sprintf("-m comment --comment %s -j %s", egressJumpComment, p.cfg.Chain)
	for _, hook := range egressHooks {
		first, has := true, false
		for _, r := range t.rules {
			if r.chain != hook {
				continue
			}
			if r.target() == p.cfg.Chain {
				has = true
				break
			}
			if r.comment() != egressJumpComment {
				first = false
			}
		}
		if has && first {
			continue
		}
		if has {
			fmt.Fprintf(body, "-D %s %s\n", hook, jump)
		}
		fmt.Fprintf(body, "-I %s 1 %s\n", hook, jump)
	}
}

// ensureHooks puts the jumps back first if they are not. The caller holds
// mu.
func (p *Policies) ensureHooks(ctx context.Context) error {
	t, err := readFilter(ctx)
	if err != nil {
		return err
	}
	var decl, body bytes.Buffer
	p.hooksScript(t, &decl, &body)
	if decl.Len()+body.Len() == 0 {
		return nil
	}
	p.log.Info("putting the egress jumps first again")
	return restoreFilter(ctx, decl.String()+body.String())
}

// remove deletes the rules of the workloads gone says are, and workload
// chains no rule leads to; with no workload left, the chain and its jumps
// go too. The caller holds mu.
func (p *Policies) remove(ctx context.Context, gone func(id string) bool) error {
	t, err := readFilter(ctx)
	if err != nil {
		return err
	}
	var script bytes.Buffer
	kept, live := 0, map[string]bool{}
	for _, r := range t.rules {
		if r.chain != p.cfg.Chain {
			continue
		}
		if id := r.egressID(); id != "" && gone(id) {
			fmt.Fprintf(&script, "-D %s\n", r.spec)
			continue
		}
		kept++
		if c := r.target(); p.isOwnChain(c) {
			live[c], live[c+"-R"] = true, true
		}
	}
	var drop []string
	for c := range t.chains {
		if p.isOwnChain(c) && !live[c] {
			drop = append(drop, c)
		}
	}
	slices.Sort(drop) // a policy chain before the refusal chain it jumps to
	for _, c := range drop {
		fmt.Fprintf(&script, "-F %s\n", c)
	}
	for _, c := range drop {
		fmt.Fprintf(&script, "-X %s\n", c)
	}
	if kept == 0 && t.chains[p.cfg.Chain] {
		for _, r := range t.rules {
			if slices.Contains(egressHooks, r.chain) && r.target() == p.cfg.Chain {
				fmt.Fprintf(&script, "-D %s\n", r.spec)
			}
		}
		fmt.Fprintf(&script, "-X %s\n", p.cfg.Chain)
	}
	if script.Len() == 0 {
		return nil
	}
	if n := len(drop) / 2; n > 0 {
		p.log.Info("egress policies removed", "count", n)
	}
	return restoreFilter(ctx, script.String())
}
