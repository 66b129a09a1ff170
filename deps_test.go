package edgebox_test

import (
	"os/exec"
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
	}{
		{"./agent/...", []string{mod + "console", mod + "images/registry", "github.com/gin-gonic/gin", "go.etcd.io/etcd/server", "github.com/distribution/distribution"}},
		{"./cmd/edgebox-agent", []string{mod + "console", mod + "images/registry", "github.com/gin-gonic/gin", "go.etcd.io/etcd/server", "github.com/distribution/distribution"}},
		{"./tunnel/...", []string{mod + "agent", mod + "console", mod + "cmd"}},
		{"./enroll/...", []string{mod + "agent", mod + "console", mod + "tunnel"}},
		{"./cmd/edgebox", []string{mod + "agent", mod + "console", mod + "tunnel"}},
		{"./api/...", []string{mod + "agent", mod + "console", mod + "tunnel"}},
	}
	for _, r := range rules {
		out, err := exec.Command("go", "list", "-deps", r.pkgs).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", r.pkgs, err)
		}
		for _, dep := range strings.Fields(string(out)) {
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
