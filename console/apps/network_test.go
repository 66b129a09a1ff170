package apps

import (
	"errors"
	"strings"
	"testing"

	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/errdefs"
)

// TestDeployRefusesHostPortClash: a deploy whose release would publish,
// on some box it covers, a host port and protocol another app there
// already publishes is refused as a conflict naming the box and both
// apps, and changes nothing; other protocols, other boxes and other
// addresses that do not overlap deploy.
func TestDeployRefusesHostPortClash(t *testing.T) {
	t.Parallel()
	fl := boxes{box("bx-a", "east", "s1"), box("bx-b", "east", "s2"), box("bx-c", "west", "s3")}
	a, d := newApps(t, fl)
	pub := func(ip string, hostPort int, proto string) []Port {
		return []Port{{Port: 80, HostPort: hostPort, HostIP: ip, Protocol: proto}}
	}
	for _, r := range []struct {
		app, version string
		ports        []Port
	}{
		{"web", "1", pub("", 8080, "")},
		{"api", "1", pub("", 8080, "tcp")},
		{"api", "2", pub("", 8080, "udp")},
		{"api", "3", pub("127.0.0.1", 8080, "")},
		{"lan", "1", pub("192.0.2.10", 9000, "")},
		{"lan", "2", pub("192.0.2.11", 9000, "")},
		{"tool", "1", []Port{{Port: 8080}}},
	} {
		if _, err := a.CreateApp(ctx, admin, r.app, ""); err != nil && !errors.Is(err, errdefs.ErrConflict) {
			t.Fatal(err)
		}
		if _, err := a.CreateRelease(ctx, admin, r.app, Spec{Version: r.version, Runtime: "containerd", Image: "robots/clock:1", Ports: r.ports}); err != nil {
			t.Fatal(err)
		}
	}
	// The steps run in order, each on what the ones before left.
	steps := []struct {
		app, version, scope, target string
		clash                       []string // substrings of the conflict; none: deployed
	}{
		{"web", "1", ScopeRegion, "east", nil},
		{"api", "1", ScopeSite, "s1", []string{"api@1 cannot run beside what site s1 runs",
			"on box bx-a, api@1 would publish host port 8080/tcp, which web@1 publishes", "publish another host port"}},
		{"api", "1", ScopeRegion, "west", nil},
		{"api", "2", ScopeSite, "s1", nil}, // udp
		{"api", "3", ScopeBox, "bx-b", []string{"on box bx-b, api@3 would publish host port 8080/tcp, which web@1 publishes"}},
		{"tool", "1", ScopeRegion, "east", nil}, // serves 8080, publishes nothing
		{"web", "1", ScopeRegion, "east", nil},  // again: nothing changes on its boxes
		{"web", "1", ScopeRegion, "west", []string{"on box bx-c, web@1 would publish host port 8080/tcp, which api@1 publishes"}},
		{"lan", "1", ScopeBox, "bx-c", nil},
		{"lan", "2", ScopeBox, "bx-c", nil}, // replaces lan@1 there: no clash with itself
		{"lan", "2", ScopeSite, "s3", nil},  // the box pin still wins on bx-c
	}
	for _, st := range steps {
		name := st.app + "@" + st.version + " to " + st.scope + " " + st.target
		pinsBefore, _ := a.Pins(ctx, fleet.DefaultTenant, st.app)
		_, _, err := a.Deploy(ctx, admin, st.app, st.version, st.scope, st.target)
		if len(st.clash) == 0 {
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			continue
		}
		if !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("%s: got %v, want a conflict", name, err)
		}
		for _, w := range st.clash {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", name, err, w)
			}
		}
		if pins, _ := a.Pins(ctx, fleet.DefaultTenant, st.app); len(pins) != len(pinsBefore) {
			t.Errorf("%s: refused, yet the app has %d pins, had %d", name, len(pins), len(pinsBefore))
		}
	}
	want := map[string]map[string]string{
		"bx-a": {"web": "1", "api": "2", "tool": "1"},
		"bx-b": {"web": "1", "tool": "1"},
		"bx-c": {"api": "1", "lan": "2"},
	}
	for id, apps := range want {
		got := workloads(t, d, id)
		if len(got) != len(apps) {
			t.Errorf("box %s runs %d workloads, want %v", id, len(got), apps)
		}
		for app, v := range apps {
			if got[app].GetRelease() != v {
				t.Errorf("box %s runs %s@%s, want %s", id, app, got[app].GetRelease(), v)
			}
		}
	}
}
