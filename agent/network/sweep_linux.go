package network

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	gocni "github.com/containerd/go-cni"
	"github.com/containernetworking/cni/libcni"
)

// Sweep removes the network state of every workload keep says is gone:
// its attachment (through the plugins, as Detach does), then whatever the
// plugins could not reach: address leases, NAT, published-port and
// forwarding rules, libcni cache entries and its namespace under NetnsDir.
// The agent runs it at start, before attaching anything, so that a kill -9
// of the agent or the box leaks no address and no rule. It does not run
// concurrently with Attach or Detach. A failure on one workload does not
// stop the others; all are returned, joined.
func (n *Network) Sweep(ctx context.Context, keep func(id string) bool) error {
	atts, err := n.cachedAttachments()
	if err != nil {
		return err
	}
	leases, err := n.leases()
	if err != nil {
		return err
	}
	rules, err := n.natRulesByID(ctx)
	if err != nil {
		return err
	}
	stale := map[string]bool{}
	consider := func(id string) {
		if validID(id) == nil && !stale[id] && !keep(id) {
			stale[id] = true
		}
	}
	for id := range atts {
		consider(id)
	}
	for _, id := range leases {
		consider(id)
	}
	for id := range rules {
		consider(id)
	}
	if entries, err := os.ReadDir(n.cfg.NetnsDir); err == nil {
		for _, e := range entries {
			consider(e.Name())
		}
	}
	if len(stale) == 0 {
		return nil
	}

	// The plugins undo what they can; with part of their state lost (no
	// cache entry, no namespace) some of them fail, which is expected, and
	// what they could not remove is removed below.
	for id := range stale {
		netns, ports := "", []gocni.PortMapping(nil)
		if a, ok := atts[id]; ok {
			netns, ports = a.NetNS, a.ports
		}
		if !isNetns(netns) {
			netns = ""
			if p := n.NetnsPath(id); isNetns(p) {
				netns = p
			}
		}
		if err := n.cni.Remove(ctx, id, netns, gocni.WithCapabilityPortMap(ports)); err != nil {
			n.log.Info("the plugins could not detach a gone workload; removing its state directly", "workload", id, "err", err)
		}
	}
	var errs []error
	if err := n.removeLeftovers(ctx, stale, addrsOf(leases, stale)); err != nil {
		errs = append(errs, err)
	}
	for id := range stale {
		if err := RemoveNetns(n.NetnsPath(id)); err != nil {
			errs = append(errs, err)
		}
	}
	n.log.Info("swept gone workloads", "count", len(stale))
	return errors.Join(errs...)
}

// attachment is one libcni cache entry of this network.
type attachment struct {
	NetNS string
	ports []gocni.PortMapping
}

// cachedAttachments reads libcni's cache entries of this network, by
// workload id.
func (n *Network) cachedAttachments() (map[string]attachment, error) {
	all, err := libcni.NewCNIConfig(nil, nil).GetCachedAttachments("")
	if err != nil {
		return nil, fmt.Errorf("network: reading the CNI cache: %w", err)
	}
	out := map[string]attachment{}
	for _, a := range all {
		if a.Network != n.cfg.Name || validID(a.ContainerID) != nil {
			continue
		}
		att := attachment{NetNS: a.NetNS}
		if pm, ok := a.CapabilityArgs["portMappings"]; ok {
			b, _ := json.Marshal(pm)
			_ = json.Unmarshal(b, &att.ports) // a mapping that does not decode is only not passed on
		}
		out[a.ContainerID] = att
	}
	return out, nil
}

// leases reads host-local's leases of this network: address to workload
// id. host-local keeps one file per address holding the id on its first
// line.
func (n *Network) leases() (map[string]string, error) {
	dir := filepath.Join(ipamDir(n.cfg), n.cfg.Name)
	entries, err := os.ReadDir(dir)
	if errNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("network: reading address leases: %w", err)
	}
	out := map[string]string{}
	for _, e := range entries {
		if !e.Type().IsRegular() || !n.subnet.Contains(parseAddr(e.Name())) {
			continue // the lock and last_reserved_ip files
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		id, _, _ := strings.Cut(string(b), "\n")
		out[e.Name()] = strings.TrimSpace(id)
	}
	return out, nil
}

// addrsOf are the leased addresses of ids.
func addrsOf(leases map[string]string, ids map[string]bool) map[string]bool {
	addrs := map[string]bool{}
	for ip, id := range leases {
		if ids[id] {
			addrs[ip] = true
		}
	}
	return addrs
}

// removeLeftovers removes what the plugins left of the workloads in ids:
// their leases, their rules in the nat table (the bridge's masquerading
// and portmap's forwarding, both marked with a comment naming the
// network and the id), rules of the filter table naming their addresses
// (the firewall plugin's; addrs are the addresses they held before the
// plugins ran, which may have released the leases), and their libcni
// cache entries.
func (n *Network) removeLeftovers(ctx context.Context, ids, addrs map[string]bool) error {
	leases, err := n.leases()
	if err != nil {
		return err
	}
	for ip, id := range leases {
		if ids[id] {
			addrs[ip] = true
		}
	}
	// The rules before the leases: a sweep killed in between finds the
	// addresses again next time, and the rules that name them.
	if err := n.removeRules(ctx, ids, addrs); err != nil {
		return err
	}
	for ip, id := range leases {
		if ids[id] {
			if err := os.Remove(filepath.Join(ipamDir(n.cfg), n.cfg.Name, ip)); err != nil && !errNotExist(err) {
				return fmt.Errorf("network: releasing %s: %w", ip, err)
			}
		}
	}
	for id := range ids {
		for _, name := range []string{n.cfg.Name + "-" + id + "-" + ifName, "cni-loopback-" + id + "-lo"} {
			p := filepath.Join(libcni.CacheDir, "results", name)
			if err := os.Remove(p); err != nil && !errNotExist(err) {
				return fmt.Errorf("network: removing CNI cache entry: %w", err)
			}
		}
	}
	return nil
}

// natRulesByID lists the nat table's rules that carry this network's
// comment, by workload id.
func (n *Network) natRulesByID(ctx context.Context) (map[string][]string, error) {
	out, err := iptablesSave(ctx, "nat")
	if err != nil {
		return nil, err
	}
	rules := map[string][]string{}
	for _, line := range out {
		if id := n.ruleID(line); id != "" {
			rules[id] = append(rules[id], line)
		}
	}
	return rules, nil
}

// ruleID is the workload id in the comment the bridge and portmap
// plugins put on their rules (`name: "edgebox" id: "ID"`), or "".
func (n *Network) ruleID(line string) string {
	if !strings.HasPrefix(line, "-A ") {
		return ""
	}
	marker := `name: \"` + n.cfg.Name + `\" id: \"`
	i := strings.Index(line, marker)
	if i < 0 {
		return ""
	}
	rest := line[i+len(marker):]
	end := strings.Index(rest, `\"`)
	if end < 0 {
		return ""
	}
	return rest[:end]
}

// removeRules deletes the nat rules of ids with the per-workload chains
// they jump to, and the filter rules naming addrs, in one
// iptables-restore transaction per table.
func (n *Network) removeRules(ctx context.Context, ids, addrs map[string]bool) error {
	nat, err := iptablesSave(ctx, "nat")
	if err != nil {
		return err
	}
	var del, chains []string
	seen := map[string]bool{}
	for _, line := range nat {
		if !ids[n.ruleID(line)] {
			continue
		}
		del = append(del, "-D"+strings.TrimPrefix(line, "-A"))
		if f := strings.Fields(line); len(f) >= 2 && f[len(f)-2] == "-j" && isWorkloadChain(f[len(f)-1]) && !seen[f[len(f)-1]] {
			seen[f[len(f)-1]] = true
			chains = append(chains, f[len(f)-1])
		}
	}
	var script bytes.Buffer
	if len(del) > 0 {
		script.WriteString("*nat\n")
		for _, d := range del {
			script.WriteString(d + "\n")
		}
		for _, c := range chains {
			fmt.Fprintf(&script, "-F %s\n-X %s\n", c, c)
		}
		script.WriteString("COMMIT\n")
	}
	if len(addrs) > 0 {
		filter, err := iptablesSave(ctx, "filter")
		if err != nil {
			return err
		}
		var fdel []string
		for _, line := range filter {
			f := strings.Fields(line)
			if len(f) < 2 || f[0] != "-A" || !strings.HasPrefix(f[1], "CNI-") {
				continue
			}
			for i := 2; i+1 < len(f); i++ {
				if (f[i] == "-s" || f[i] == "-d") && addrs[strings.TrimSuffix(f[i+1], "/32")] {
					fdel = append(fdel, "-D"+strings.TrimPrefix(line, "-A"))
					break
				}
			}
		}
		if len(fdel) > 0 {
			script.WriteString("*filter\n")
			for _, d := range fdel {
				script.WriteString(d + "\n")
			}
			script.WriteString("COMMIT\n")
		}
	}
	if script.Len() == 0 {
		return nil
	}
	cmd := exec.CommandContext(ctx, "iptables-restore", "--noflush", "--wait", xtablesWait)
	cmd.Stdin = &script
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("network: removing iptables rules: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// isWorkloadChain says whether a chain belongs to one workload: the
// bridge plugin's CNI-<hash> and portmap's CNI-DN-<hash>, not the shared
// CNI-HOSTPORT-* and CNI-FORWARD chains.
func isWorkloadChain(c string) bool {
	return strings.HasPrefix(c, "CNI-") && !strings.HasPrefix(c, "CNI-HOSTPORT-") &&
		c != "CNI-FORWARD" && c != "CNI-ADMIN"
}

// iptablesSave returns the rule lines of one table; a table that does not
// exist yet is empty.
func iptablesSave(ctx context.Context, table string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "iptables-save", "-t", table).Output()
	if err != nil {
		return nil, fmt.Errorf("network: reading iptables table %s: %w", table, err)
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "-A ") {
			lines = append(lines, l)
		}
	}
	return lines, sc.Err()
}
