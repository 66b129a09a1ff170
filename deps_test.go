package edgebox_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestDependencyRules keeps the architecture's arrows pointing one way:
// the box never links console code, the tunnel links neither side, and the
// CLI links only the API client and the contracts.
func TestDependencyRules(t *testing.T) {
	t.Parallel()
	const mod = "github.com/edgebox/edgebox/"
	rules := []struct {
		pkgs   string
		banned []string
		except []string // allowed although under a banned prefix
	}{
		{"./agent/...", []string{mod + "console", mod + "images/registry", "github.com/gin-gonic/gin", "go.etcd.io/etcd/server", "github.com/distribution/distribution"}, nil},
		{"./cmd/edgebox-agent", []string{mod + "console", mod + "images/registry", "github.com/gin-gonic/gin", "go.etcd.io/etcd/server", "github.com/distribution/distribution"}, nil},
		{"./tunnel/...", []string{mod + "agent", mod + "console", mod + "cmd"}, nil},
		{"./enroll/...", []string{mod + "agent", mod + "console", mod + "tunnel"}, nil},
		// The CLI carries a port forward's bytes as the tunnel's forwarding
		// package frames them, without the tunnel itself.
		{"./cmd/edgebox", []string{mod + "agent", mod + "console", mod + "tunnel"}, []string{mod + "tunnel/forwarding"}},
		{"./api/...", []string{mod + "agent", mod + "console", mod + "tunnel"}, nil},
		// What the binaries link never includes the test harness.
		{"./cmd/...", []string{mod + "internal/test"}, nil},
	}
	for _, r := range rules {
		out, err := exec.Command("go", "list", "-deps", r.pkgs).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", r.pkgs, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			if slices.Contains(r.except, dep) {
				continue
			}
			for _, b := range r.banned {
				if dep == b || strings.HasPrefix(dep, b+"/") {
					t.Errorf("%s depends on %s, which it must not", r.pkgs, dep)
				}
			}
		}
	}
}

// TestDirectImportRules keeps a dependency inside the one package that
// owns it: a package outside owner may not import banned itself, in its
// code or its tests (it may still link it through owner).
func TestDirectImportRules(t *testing.T) {
	t.Parallel()
	const mod = "github.com/edgebox/edgebox/"
	rules := []struct {
		owner  string
		banned string
	}{
		// The multiplexer is the tunnel's to change: callers see tunnel.Conn.
		{mod + "tunnel", "github.com/hashicorp/yamux"},
	}
	const format = `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}{{range .TestImports}} {{.}}{{end}}{{range .XTestImports}} {{.}}{{end}}`
	out, err := exec.Command("go", "list", "-f", format, "./...").Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 10 {
		t.Fatalf("go list ./... listed %d packages; the rules below would check nothing", len(lines))
	}
	for _, line := range lines {
		f := strings.Fields(line)
		pkg, imports := f[0], f[1:]
		for _, r := range rules {
			if pkg == r.owner || strings.HasPrefix(pkg, r.owner+"/") {
				continue
			}
			for _, imp := range imports {
				if imp == r.banned || strings.HasPrefix(imp, r.banned+"/") {
					t.Errorf("%s imports %s, which only %s may", pkg, imp, r.owner)
				}
			}
		}
	}
}

// TestConsoleLayers keeps the HTTP API at the console's edge. Each package
// under console/ is checked on its own: what its code links (directly or
// through other packages) and what its tests import. The root composes
// everything, so it links httpapi and, through it, api; it still may not
// import api itself.
func TestConsoleLayers(t *testing.T) {
	t.Parallel()
	const mod = "github.com/edgebox/edgebox/"
	rules := []struct {
		banned string
		// mayLink may link banned through other packages; mayImport may
		// import it themselves. Every other console package may do
		// neither, in its code or its tests.
		mayLink, mayImport []string
		why                string
	}{
		{mod + "api", []string{mod + "console", mod + "console/httpapi"}, []string{mod + "console/httpapi"},
			"api's types stop at httpapi, which converts them to each package's own"},
		// Presence (with its own Status type, not one of httpapi's), the
		// sync server, the agent service and every other service serve
		// httpapi through interfaces it declares; none depends on it.
		{mod + "console/httpapi", []string{mod + "console", mod + "console/httpapi"}, []string{mod + "console", mod + "console/httpapi"},
			"services are below the HTTP API, which only the root wires to them"},
	}
	const format = `{{.ImportPath}}|{{join .Imports " "}}|{{join .Deps " "}}|{{join .TestImports " "}} {{join .XTestImports " "}}`
	out, err := exec.Command("go", "list", "-f", format, "./console/...").Output()
	if err != nil {
		t.Fatalf("go list ./console/...: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 5 {
		t.Fatalf("go list ./console/... listed %d packages; the rules below would check nothing", len(lines))
	}
	// The services the rules are about must be there to be checked.
	checked := map[string]bool{}
	for _, line := range lines {
		f := strings.Split(line, "|")
		if len(f) != 4 {
			t.Fatalf("go list printed %q", line)
		}
		pkg, imports, deps, testImports := f[0], strings.Fields(f[1]), strings.Fields(f[2]), strings.Fields(f[3])
		checked[pkg] = true
		for _, r := range rules {
			var seen []string
			switch {
			case !slices.Contains(r.mayLink, pkg):
				seen = slices.Concat(deps, testImports)
			case !slices.Contains(r.mayImport, pkg):
				seen = slices.Concat(imports, testImports)
			}
			for _, dep := range seen {
				if dep == r.banned || strings.HasPrefix(dep, r.banned+"/") {
					t.Errorf("%s imports or links %s: %s", pkg, dep, r.why)
				}
			}
		}
	}
	for _, pkg := range []string{"console/presence", "console/boxsync", "console/agentrpc", "console/port"} {
		if !checked[mod+pkg] {
			t.Errorf("go list ./console/... did not list %s; the rules above did not check it", mod+pkg)
		}
	}
}
