// Package require lets a test ask for what it needs from the machine: root,
// programs, files. When one is missing the test skips and names it, unless
// EDGEBOX_TEST_STRICT=1, which make test (and so CI) sets after installing
// every one of them: there a missing prerequisite is a broken install step
// and the test fails.
package require

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// strictEnv is the variable make test sets.
const strictEnv = "EDGEBOX_TEST_STRICT"

func missing(t testing.TB, format string, a ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, a...)
	if os.Getenv(strictEnv) == "1" {
		t.Fatalf("%s, and %s=1 says make test installed everything", msg, strictEnv)
	}
	t.Skip(msg)
}

// Root needs the test to run as root, for why.
func Root(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, "%s needs root (make test runs as root in CI)", why)
	}
}

// Tools needs programs on PATH; from names the package that has them.
func Tools(t testing.TB, from string, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			missing(t, "%s is not installed (Debian's %s; make test installs it)", n, from)
		}
	}
}

// File needs path to exist; from names what provides it.
func File(t testing.TB, path, from string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		missing(t, "%s is missing (%s)", path, from)
	}
}
