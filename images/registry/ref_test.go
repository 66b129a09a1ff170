package registry

import "testing"

func TestParseRef(t *testing.T) {
	t.Parallel()
	const d = "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, c := range []struct {
		in   string
		want Ref
	}{
		{"127.0.0.1:8443/robots/icbc:1.2", Ref{Host: "127.0.0.1:8443", Repo: "robots/icbc", Tag: "1.2"}},
		{"console.example/robots/icbc@" + d, Ref{Host: "console.example", Repo: "robots/icbc", Digest: d}},
		{"robots/icbc:1.2", Ref{Repo: "robots/icbc", Tag: "1.2"}},
		{"icbc", Ref{Repo: "library/icbc"}},
		{"localhost:5000/a:b@" + d, Ref{Host: "localhost:5000", Repo: "a", Tag: "b", Digest: d}},
	} {
		got, err := ParseRef(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseRef(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "robots/UPPER", "a:b:c", "x@sha256:short", string(make([]byte, 600))} {
		if _, err := ParseRef(bad); err == nil {
			t.Errorf("ParseRef(%q) accepted", bad)
		}
	}
}
