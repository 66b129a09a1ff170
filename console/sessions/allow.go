package sessions

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/tunnel/forwarding"
)

// maxAllowEntries bounds one site's or box's forward allow list, and
// maxAllowLists the lists of a tenant.
const (
	maxAllowEntries = 256
	maxAllowLists   = 1000
)

// allowEntry is one line of a forward allow list.
type allowEntry struct {
	prefix   netip.Prefix // an address range, or
	host     string       // a host name, lower case
	low, hig int          // the ports
}

// parseAllowEntry reads ADDRESS[/BITS]:PORTS or HOSTNAME:PORTS.
func parseAllowEntry(s string) (allowEntry, error) {
	i := strings.LastIndexByte(s, ':')
	if i <= 0 {
		return allowEntry{}, fmt.Errorf("%q: use ADDRESS[/BITS]:PORTS or HOSTNAME:PORTS", s)
	}
	where, ports := strings.Trim(s[:i], "[]"), s[i+1:]
	var e allowEntry
	switch lo, hi, ok := strings.Cut(ports, "-"); {
	case ports == "*":
		e.low, e.hig = 1, 65535
	case ok:
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || a < 1 || b > 65535 || a > b {
			return allowEntry{}, fmt.Errorf("%q: ports %q are not LOW-HIGH within 1-65535", s, ports)
		}
		e.low, e.hig = a, b
	default:
		p, err := strconv.Atoi(ports)
		if err != nil || p < 1 || p > 65535 {
			return allowEntry{}, fmt.Errorf("%q: port %q is not 1-65535 or *", s, ports)
		}
		e.low, e.hig = p, p
	}
	if p, err := netip.ParsePrefix(where); err == nil {
		e.prefix = p.Masked()
	} else if a, err := netip.ParseAddr(where); err == nil {
		e.prefix = netip.PrefixFrom(a, a.BitLen())
	} else if _, _, err := forwarding.ParseTarget(where + ":1"); err == nil && !strings.Contains(where, ":") {
		e.host = strings.ToLower(where)
	} else {
		return allowEntry{}, fmt.Errorf("%q: %q is not an address, a range or a host name", s, where)
	}
	return e, nil
}

func (e allowEntry) allows(host string, port int) bool {
	if port < e.low || port > e.hig {
		return false
	}
	if e.host != "" {
		return strings.EqualFold(e.host, host)
	}
	a, err := netip.ParseAddr(host)
	return err == nil && e.prefix.Contains(a.Unmap())
}

// validateAllowLists checks every forward allow list of r.
func validateAllowLists(r Rules) error {
	if len(r.ForwardSites)+len(r.ForwardBoxes) > maxAllowLists {
		return errdefs.Invalid("session rules: at most %d forward allow lists", maxAllowLists)
	}
	for _, lists := range []map[string][]string{r.ForwardSites, r.ForwardBoxes} {
		for name, list := range lists {
			if name == "" || len(name) > 64 {
				return errdefs.Invalid("a forward allow list needs a site or box of 1-64 characters")
			}
			if len(list) > maxAllowEntries {
				return errdefs.Invalid("the forward allow list of %s: at most %d entries", name, maxAllowEntries)
			}
			for _, s := range list {
				if _, err := parseAllowEntry(s); err != nil {
					return errdefs.Invalid("the forward allow list of %s: %v", name, err)
				}
			}
		}
	}
	return nil
}

// local reports whether host is the box itself.
func local(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// ForwardAllowed says whether a forward from the box (its ID and site)
// to target is allowed by the tenant's rules, and if not, why.
func (b *Broker) ForwardAllowed(r Rules, box, boxName, site, target string) error {
	host, port, err := forwarding.ParseTarget(target)
	if err != nil {
		return errdefs.Invalid("%v", err)
	}
	if local(host) {
		return nil
	}
	for _, list := range [][]string{r.ForwardBoxes[box], r.ForwardSites[site]} {
		for _, s := range list {
			if e, err := parseAllowEntry(s); err == nil && e.allows(host, port) {
				return nil
			}
		}
	}
	return errdefs.Permission("%s is not on the forward allow list of box %s or its site %s; an admin adds it with 'edgebox session rules set --forward-site %s=%s'",
		target, cmpOr(boxName, box), site, site, target)
}
