package network

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/edgebox/edgebox/errdefs"
)

// Egress is a workload's egress policy: where it may open connections.
// The zero Egress allows nothing but its DNS servers; ParseEgress makes
// one from a release's entries.
type Egress struct {
	// Any allows every destination; the other fields are then unused.
	Any bool
	// Names are DNS names, in lower case without a final dot. The
	// addresses they resolve to are allowed, and followed as they change.
	Names []string
	// Prefixes are IPv4 networks allowed; an address is a /32.
	Prefixes []netip.Prefix
	// DNS are the resolvers the workload may query on port 53 (UDP and
	// TCP) whatever the rest of the policy says: the servers of the
	// resolv.conf it was given (see ResolvConf and ResolvConfServers).
	DNS []netip.Addr
}

// Bounds on one workload's policy, so that a release cannot make the box
// build rule sets without end.
const (
	// MaxEgressEntries is the most entries (names and prefixes) a policy
	// has.
	MaxEgressEntries = 256
	// maxAddrsPerName is the most addresses one name keeps allowed: the
	// newest seen. A bank's name resolves to a handful.
	maxAddrsPerName = 64
	// maxDNS is the most resolvers a workload may query.
	maxDNS = 8
)

// AnyEgress is the entry that allows every destination.
const AnyEgress = "any"

// ParseEgress reads a release's egress entries: DNS names, IPv4
// addresses and CIDR prefixes, or the single entry "any". No entries
// also allow everything, as the release's egress field says. Names are
// put in lower case without a final dot; duplicates are dropped. A bad
// entry is an errdefs.ErrInvalid error naming it.
func ParseEgress(entries []string) (Egress, error) {
	if len(entries) == 0 {
		return Egress{Any: true}, nil
	}
	if len(entries) > MaxEgressEntries {
		return Egress{}, errdefs.Invalid("network: egress has %d entries, at most %d are allowed", len(entries), MaxEgressEntries)
	}
	var e Egress
	for _, raw := range entries {
		s := strings.TrimSpace(raw)
		if strings.EqualFold(s, AnyEgress) {
			if len(entries) > 1 {
				return Egress{}, errdefs.Invalid("network: egress entry %q allows every destination and cannot be listed with other entries", raw)
			}
			return Egress{Any: true}, nil
		}
		name, prefix, err := parseEgressEntry(s)
		if err != nil {
			return Egress{}, err
		}
		if name != "" && !slices.Contains(e.Names, name) {
			e.Names = append(e.Names, name)
		}
		if prefix.IsValid() && !slices.Contains(e.Prefixes, prefix) {
			e.Prefixes = append(e.Prefixes, prefix)
		}
	}
	return e, nil
}

// parseEgressEntry reads one entry other than "any": a name or a prefix.
func parseEgressEntry(s string) (string, netip.Prefix, error) {
	invalid := func(why string, a ...any) error {
		return errdefs.Invalid("network: egress entry %q: %s", s, fmt.Sprintf(why, a...))
	}
	switch {
	case s == "":
		return "", netip.Prefix{}, invalid("empty")
	case s == "*":
		return "", netip.Prefix{}, invalid("write %q to allow every destination", AnyEgress)
	case strings.Contains(s, "://") || strings.Contains(s, "/") && !looksLikePrefix(s):
		return "", netip.Prefix{}, invalid("want a DNS name, an IPv4 address or a CIDR prefix, not a URL")
	case strings.HasPrefix(s, "*."):
		return "", netip.Prefix{}, invalid("wildcards cannot be followed; list each name the workload connects to")
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return "", netip.Prefix{}, invalid("not a CIDR prefix like 203.0.113.0/24")
		}
		if p.Bits() == 0 && p.Addr().Is4() {
			return "", netip.Prefix{}, invalid("allows every destination: write %q", AnyEgress)
		}
		if err := checkEgressAddr(p.Addr()); err != nil {
			return "", netip.Prefix{}, invalid("%v", err)
		}
		if p.Masked() != p {
			return "", netip.Prefix{}, invalid("has host bits set; did you mean %s?", p.Masked())
		}
		return "", p, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if err := checkEgressAddr(a); err != nil {
			return "", netip.Prefix{}, invalid("%v", err)
		}
		return "", netip.PrefixFrom(a, 32), nil
	}
	if host, port, ok := strings.Cut(s, ":"); ok && host != "" && port != "" && !strings.Contains(port, ":") {
		return "", netip.Prefix{}, invalid("ports cannot be given; an entry allows every port of %s", host)
	}
	if strings.Contains(s, ":") {
		return "", netip.Prefix{}, invalid("only IPv4 destinations can be allowed: workloads have IPv4 only")
	}
	name, err := canonicalName(s)
	if err != nil {
		return "", netip.Prefix{}, invalid("%v", err)
	}
	return name, netip.Prefix{}, nil
}

// looksLikePrefix says whether s is written as an address and a length,
// so that a bad one gets an error about prefixes, not URLs.
func looksLikePrefix(s string) bool {
	a, b, _ := strings.Cut(s, "/")
	return a != "" && b != "" && strings.Trim(a, "0123456789abcdefABCDEF.:") == "" && strings.Trim(b, "0123456789") == ""
}

// checkEgressAddr refuses addresses no rule could usefully allow.
func checkEgressAddr(a netip.Addr) error {
	switch {
	case a.Zone() != "":
		return fmt.Errorf("an address with a zone cannot be allowed")
	case !a.Is4():
		return fmt.Errorf("only IPv4 destinations can be allowed: workloads have IPv4 only")
	case a.IsUnspecified():
		return fmt.Errorf("the unspecified address is no destination")
	case a.IsLoopback():
		return fmt.Errorf("a workload's own loopback is always reachable and needs no entry")
	case a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return fmt.Errorf("not a unicast destination")
	}
	return nil
}

// canonicalName checks a DNS host name (RFC 1123: labels of letters,
// digits and inner hyphens, 1 to 63 characters each, at most 253 in all)
// and returns it in lower case without a final dot.
func canonicalName(s string) (string, error) {
	name := strings.ToLower(strings.TrimSuffix(s, "."))
	if name == "" || len(name) > 253 {
		return "", fmt.Errorf("a DNS name has 1 to 253 characters")
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return "", fmt.Errorf("not a DNS name: each label has 1 to 63 characters")
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return "", fmt.Errorf("not a DNS name: a label cannot start or end with '-'")
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return "", fmt.Errorf("not a DNS name: %q is not a letter, digit, '-' or '.'", c)
			}
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return "", fmt.Errorf("not a valid IPv4 address, and a DNS name does not end in a number")
	}
	return name, nil
}

// Validate says what is wrong with e, as an errdefs.ErrInvalid error; the
// box checks a policy again whatever the console checked.
func (e Egress) Validate() error {
	if len(e.DNS) > maxDNS {
		return errdefs.Invalid("network: egress: %d DNS servers, at most %d", len(e.DNS), maxDNS)
	}
	for _, a := range e.DNS {
		if err := checkEgressAddr(a); err != nil {
			return errdefs.Invalid("network: egress DNS server %s: %v", a, err)
		}
	}
	if e.Any {
		return nil
	}
	if n := len(e.Names) + len(e.Prefixes); n > MaxEgressEntries {
		return errdefs.Invalid("network: egress has %d entries, at most %d are allowed", n, MaxEgressEntries)
	}
	for _, n := range e.Names {
		c, err := canonicalName(n)
		if err != nil {
			return errdefs.Invalid("network: egress name %q: %v", n, err)
		}
		if c != n {
			return errdefs.Invalid("network: egress name %q: write it as %q", n, c)
		}
	}
	for _, p := range e.Prefixes {
		if !p.IsValid() {
			return errdefs.Invalid("network: egress: an invalid prefix")
		}
		if p.Bits() == 0 && p.Addr().Is4() {
			return errdefs.Invalid("network: egress prefix %s allows every destination: set Any", p)
		}
		if err := checkEgressAddr(p.Addr()); err != nil {
			return errdefs.Invalid("network: egress prefix %s: %v", p, err)
		}
		if p.Masked() != p {
			return errdefs.Invalid("network: egress prefix %s has host bits set", p)
		}
	}
	return nil
}

// String is for logs: "any", or the names and prefixes.
func (e Egress) String() string {
	if e.Any {
		return AnyEgress
	}
	parts := slices.Clone(e.Names)
	for _, p := range e.Prefixes {
		parts = append(parts, p.String())
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// ResolvConfServers are the nameservers a resolv.conf (as ResolvConf
// writes it) lists, for Egress.DNS.
func ResolvConfServers(resolvConf []byte) []netip.Addr {
	var out []netip.Addr
	for _, line := range strings.Split(string(resolvConf), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		if a, err := netip.ParseAddr(f[1]); err == nil && a.Is4() && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}
