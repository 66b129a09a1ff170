package network

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/edgebox/edgebox/errdefs"
)

// egressCases are the entries a release may carry, good and bad; they
// seed FuzzParseEgress too.
var egressCases = []struct {
	name    string
	entries []string
	want    Egress
	err     string // in the error; "" for none
}{
	{"none allows all", nil, Egress{Any: true}, ""},
	{"any", []string{"any"}, Egress{Any: true}, ""},
	{"ANY in capitals", []string{" ANY "}, Egress{Any: true}, ""},
	{"names, addresses and prefixes", []string{"Bank.Example.COM.", "203.0.113.7", "198.51.100.0/24", "bank.example.com", "203.0.113.7/32"},
		Egress{Names: []string{"bank.example.com"}, Prefixes: []netip.Prefix{netip.MustParsePrefix("203.0.113.7/32"), netip.MustParsePrefix("198.51.100.0/24")}}, ""},
	{"single label name", []string{"fileserver"}, Egress{Names: []string{"fileserver"}}, ""},
	{"digits and hyphens", []string{"a-1.b2.example"}, Egress{Names: []string{"a-1.b2.example"}}, ""},
	{"link-local metadata address", []string{"169.254.169.254"}, Egress{Prefixes: []netip.Prefix{netip.MustParsePrefix("169.254.169.254/32")}}, ""},

	{"any with others", []string{"any", "bank.test"}, Egress{}, "cannot be listed with other entries"},
	{"empty entry", []string{"bank.test", " "}, Egress{}, "empty"},
	{"star", []string{"*"}, Egress{}, `write "any"`},
	{"wildcard", []string{"*.bank.test"}, Egress{}, "wildcards cannot be followed"},
	{"url", []string{"https://bank.test/login"}, Egress{}, "not a URL"},
	{"path", []string{"bank.test/login"}, Egress{}, "not a URL"},
	{"name with port", []string{"bank.test:443"}, Egress{}, "ports cannot be given"},
	{"address with port", []string{"203.0.113.7:443"}, Egress{}, "ports cannot be given"},
	{"ipv6 address", []string{"2001:db8::1"}, Egress{}, "only IPv4"},
	{"ipv6 prefix", []string{"2001:db8::/32"}, Egress{}, "only IPv4"},
	{"host bits", []string{"198.51.100.1/24"}, Egress{}, "did you mean 198.51.100.0/24?"},
	{"bad length", []string{"198.51.100.0/33"}, Egress{}, "not a CIDR prefix"},
	{"everything as a prefix", []string{"0.0.0.0/0"}, Egress{}, `allows every destination: write "any"`},
	{"unspecified", []string{"0.0.0.0"}, Egress{}, "unspecified"},
	{"loopback", []string{"127.0.0.1"}, Egress{}, "loopback"},
	{"multicast", []string{"224.0.0.1"}, Egress{}, "not a unicast"},
	{"broadcast", []string{"255.255.255.255"}, Egress{}, "not a unicast"},
	{"bad address", []string{"203.0.113.300"}, Egress{}, "not a valid IPv4 address"},
	{"short address", []string{"10.1.2"}, Egress{}, "not a valid IPv4 address"},
	{"underscore", []string{"bank_1.test"}, Egress{}, "not a letter, digit"},
	{"space inside", []string{"bank .test"}, Egress{}, "not a letter, digit"},
	{"empty label", []string{"bank..test"}, Egress{}, "label has 1 to 63"},
	{"hyphen first", []string{"-bank.test"}, Egress{}, "cannot start or end with '-'"},
	{"long label", []string{strings.Repeat("a", 64) + ".test"}, Egress{}, "label has 1 to 63"},
	{"long name", []string{strings.Repeat("a.", 127) + "test"}, Egress{}, "1 to 253 characters"},
	{"unicode", []string{"bänk.test"}, Egress{}, "not a letter, digit"},
	{"too many", manyEntries(MaxEgressEntries + 1), Egress{}, "at most 256"},
}

func manyEntries(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("host-%d.test", i)
	}
	return out
}

func TestParseEgress(t *testing.T) {
	t.Parallel()
	for _, tc := range egressCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseEgress(tc.entries)
			if tc.err != "" {
				if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseEgress(%q) = %v, %v; want an invalid-argument error mentioning %q", tc.entries, got, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseEgress(%q): %v", tc.entries, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseEgress(%q) = %+v, want %+v", tc.entries, got, tc.want)
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("what ParseEgress returned does not validate: %v", err)
			}
		})
	}
	if _, err := ParseEgress(manyEntries(MaxEgressEntries)); err != nil {
		t.Fatalf("ParseEgress of %d entries: %v", MaxEgressEntries, err)
	}
}

// TestEgressValidate is the box's check of a policy it was handed, built
// by hand rather than parsed.
func TestEgressValidate(t *testing.T) {
	t.Parallel()
	dns := []netip.Addr{netip.MustParseAddr("192.0.2.53")}
	cases := []struct {
		name string
		e    Egress
		err  string
	}{
		{"zero allows only DNS", Egress{DNS: dns}, ""},
		{"any", Egress{Any: true, DNS: dns}, ""},
		{"name and prefix", Egress{Names: []string{"bank.test"}, Prefixes: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}}, ""},
		{"name in capitals", Egress{Names: []string{"Bank.test"}}, `write it as "bank.test"`},
		{"name with a final dot", Egress{Names: []string{"bank.test."}}, `write it as "bank.test"`},
		{"bad name", Egress{Names: []string{"bank/test"}}, "not a letter, digit"},
		{"host bits", Egress{Prefixes: []netip.Prefix{netip.MustParsePrefix("198.51.100.1/24")}}, "host bits"},
		{"all", Egress{Prefixes: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}, "allows every destination"},
		{"zero prefix", Egress{Prefixes: []netip.Prefix{{}}}, "invalid prefix"},
		{"ipv6 prefix", Egress{Prefixes: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}}, "only IPv4"},
		{"loopback DNS", Egress{DNS: []netip.Addr{netip.MustParseAddr("127.0.0.53")}}, "loopback"},
		{"ipv6 DNS", Egress{DNS: []netip.Addr{netip.MustParseAddr("2001:db8::53")}}, "only IPv4"},
		{"too many DNS", Egress{DNS: make([]netip.Addr, maxDNS+1)}, "DNS servers"},
		{"too many names", Egress{Names: manyEntries(MaxEgressEntries + 1)}, "at most 256"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.e.Validate()
			if tc.err == "" {
				if err != nil {
					t.Fatalf("Validate(%+v): %v", tc.e, err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Validate(%+v) = %v, want an invalid-argument error mentioning %q", tc.e, err, tc.err)
			}
		})
	}
}

func TestResolvConfServers(t *testing.T) {
	t.Parallel()
	conf := "# Written by edgebox\nnameserver 192.0.2.53\nnameserver 2001:db8::53\nnameserver  198.51.100.53 \nnameserver 192.0.2.53\nnameserver bad\nsearch example.com\n"
	got := ResolvConfServers([]byte(conf))
	want := []netip.Addr{netip.MustParseAddr("192.0.2.53"), netip.MustParseAddr("198.51.100.53")}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ResolvConfServers = %v, want %v", got, want)
	}
}

// FuzzParseEgress checks that whatever a release carries, ParseEgress
// either refuses it or returns a policy that validates.
func FuzzParseEgress(f *testing.F) {
	for _, tc := range egressCases {
		if len(tc.entries) < 8 {
			f.Add(strings.Join(tc.entries, ","))
		}
	}
	f.Fuzz(func(t *testing.T, s string) {
		entries := strings.Split(s, ",")
		e, err := ParseEgress(entries)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("ParseEgress(%q): %v is not an invalid-argument error", entries, err)
			}
			return
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("ParseEgress(%q) = %+v, which does not validate: %v", entries, e, err)
		}
	})
}
