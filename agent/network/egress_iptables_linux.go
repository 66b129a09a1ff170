package network

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
)

// What egress policies read and write of iptables: the filter table as
// iptables-save -c shows it, and transactions through iptables-restore.

// filterTable is what iptables-save shows of the filter table.
type filterTable struct {
	chains map[string]bool
	rules  []filterRule
}

// filterRule is one rule: its chain, its spec as iptables-save writes it
// after "-A " (what -D takes), and its packet counter.
type filterRule struct {
	chain   string
	spec    string
	packets uint64
}

// field is the word after flag in the rule, or "".
func (r filterRule) field(flag string) string {
	f := saveWords(r.spec)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == flag {
			return f[i+1]
		}
	}
	return ""
}

// saveWords splits a rule as iptables-save writes it into words: a word
// in double quotes may hold spaces, and \" and \\ in it stand for " and \.
func saveWords(s string) []string {
	var words []string
	var w strings.Builder
	in, quoted := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quoted && c == '\\' && i+1 < len(s):
			i++
			w.WriteByte(s[i])
		case c == '"':
			quoted, in = !quoted, true
		case c == ' ' && !quoted:
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteByte(c)
			in = true
		}
	}
	if in {
		words = append(words, w.String())
	}
	return words
}

func (r filterRule) target() string  { return r.field("-j") }
func (r filterRule) comment() string { return r.field("--comment") }

// egressID is the workload id of a dispatch rule, or "".
func (r filterRule) egressID() string {
	id, ok := strings.CutPrefix(r.comment(), egressIDComment)
	if !ok || validID(id) != nil {
		return ""
	}
	return id
}

func (r filterRule) source() netip.Addr {
	p, err := netip.ParsePrefix(r.field("-s"))
	if err != nil {
		return netip.Addr{}
	}
	return p.Addr()
}

// readFilter reads the filter table with its counters.
func readFilter(ctx context.Context) (*filterTable, error) {
	out, err := exec.CommandContext(ctx, "iptables-save", "-c", "-t", "filter").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
		}
		return nil, fmt.Errorf("reading iptables' filter table: %w", err)
	}
	return parseFilter(out)
}

// parseFilter reads iptables-save -c output of the filter table.
func parseFilter(out []byte) (*filterTable, error) {
	t := &filterTable{chains: map[string]bool{}}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, ":"); ok {
			if f := strings.Fields(name); len(f) > 0 {
				t.chains[f[0]] = true
			}
			continue
		}
		var packets uint64
		if strings.HasPrefix(line, "[") {
			counters, rest, ok := strings.Cut(line[1:], "] ")
			if !ok {
				continue
			}
			pk, _, _ := strings.Cut(counters, ":")
			packets, _ = strconv.ParseUint(pk, 10, 64)
			line = rest
		}
		spec, ok := strings.CutPrefix(line, "-A ")
		if !ok {
			continue
		}
		chain, _, _ := strings.Cut(spec, " ")
		t.rules = append(t.rules, filterRule{chain: chain, spec: spec, packets: packets})
	}
	return t, sc.Err()
}

// restoreFilter runs script, lines of iptables commands on the filter
// table, as one transaction that changes nothing else.
func restoreFilter(ctx context.Context, script string) error {
	cmd := exec.CommandContext(ctx, "iptables-restore", "--noflush", "--wait", xtablesWait)
	cmd.Stdin = strings.NewReader("*filter\n" + script + "COMMIT\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("writing iptables rules: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// xtablesWait is how long, in seconds, an iptables write waits for the
// xtables lock another program holds before it fails, rather than wait
// for ever with the policies' lock held.
const xtablesWait = "10"
