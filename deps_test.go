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
