package packages

import (
	"archive/zip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/edgebox/edgebox/internal/test/require"
)

// buildAgent builds the agent for goos/goarch as make dist does.
func buildAgent(t *testing.T, goos, goarch, out string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, "github.com/edgebox/edgebox/cmd/edgebox-agent")
	cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
}

func TestDebAndRPM(t *testing.T) {
	require.Tools(t, "lintian", "lintian")
	require.Tools(t, "rpm", "rpm")
	require.Tools(t, "util-linux", "unshare")
	require.Root(t, "installing the .deb")
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "edgebox-agent-linux-"+runtime.GOARCH)
	buildAgent(t, "linux", runtime.GOARCH, bin)
	made, err := Build(Spec{Program: Agent(), Version: "v1.2.3-rc.1", Arch: runtime.GOARCH, Binary: bin, Out: dir})
	if err != nil {
		t.Fatal(err)
	}
	var deb, rpm string
	for _, m := range made {
		switch filepath.Ext(m) {
		case ".deb":
			deb = m
		case ".rpm":
			rpm = m
		}
	}
	if deb == "" || rpm == "" {
		t.Fatalf("made %v", made)
	}

	out, err := exec.Command("lintian", "--fail-on", "error", "--allow-root", deb).CombinedOutput()
	if err != nil || strings.Contains(string(out), "E: ") {
		t.Fatalf("lintian: %v\n%s", err, out)
	}
	t.Logf("lintian (warnings only):\n%s", out)

	out, err = exec.Command("rpm", "-qip", rpm).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Name        : edgebox-agent") || !strings.Contains(string(out), "Version     : 1.2.3~rc.1") {
		t.Fatalf("rpm -qip: %v\n%s", err, out)
	}
	out, err = exec.Command("rpm", "-qlp", rpm).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "/usr/bin/edgebox-agent") || !strings.Contains(string(out), "/lib/systemd/system/edgebox-agent.service") {
		t.Fatalf("rpm -qlp: %v\n%s", err, out)
	}

	// dpkg installs and removes it, in a mount namespace whose /usr, /etc
	// and /var are overlays, so this machine is not changed.
	script := `set -eu
for d in usr etc var; do
	mkdir -p "$T/$d.up" "$T/$d.work"
	mount -t overlay overlay -o lowerdir=/$d,upperdir="$T/$d.up",workdir="$T/$d.work" /$d
done
dpkg -i "$DEB"
/usr/bin/edgebox-agent --version
test -f /lib/systemd/system/edgebox-agent.service
test -d /var/lib/edgebox-agent
dpkg -s edgebox-agent | grep -q "Status: install ok installed"
dpkg -r edgebox-agent
test ! -e /usr/bin/edgebox-agent
test ! -e /lib/systemd/system/edgebox-agent.service
dpkg -P edgebox-agent
if dpkg -s edgebox-agent 2>/dev/null | grep -q "Status: install"; then echo "still known to dpkg"; exit 1; fi
echo CLEAN
`
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "T="+t.TempDir(), "DEB="+deb)
	out, err = cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "CLEAN") {
		t.Fatalf("dpkg install and remove: %v\n%s", err, out)
	}
}

func TestWindowsZip(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	exe := filepath.Join(dir, "edgebox-agent.exe")
	buildAgent(t, "windows", "amd64", exe)
	zipPath := filepath.Join(dir, "agent.zip")
	if err := WindowsZip(exe, "../../scripts/install.ps1", zipPath); err != nil {
		t.Fatal(err)
	}
	zr, err := zip.OpenReader(zipPath)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	got := map[string][]byte{}
	for _, f := range zr.File {
		r, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		got[f.Name], _ = io.ReadAll(r)
		r.Close()
	}
	if len(got) != 2 || !strings.HasPrefix(string(got["edgebox-agent.exe"]), "MZ") {
		t.Fatalf("zip holds %d files; the agent starts %q", len(got), got["edgebox-agent.exe"][:2])
	}
	ps := string(got["install.ps1"])
	for _, want := range []string{"Join-Path $PSScriptRoot \"edgebox-agent.exe\"", "Get-FileHash -Algorithm SHA256", "ServerCertificateValidationCallback"} {
		if !strings.Contains(ps, want) {
			t.Errorf("install.ps1 lacks %q", want)
		}
	}
}

func TestDebianVersion(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"v1.2.3": "1.2.3", "1.2.3-rc.1": "1.2.3~rc.1", "45f12ac-dirty": "45f12ac~dirty", "dev": "0.0.0~dev"} {
		if got := debianVersion(in); got != want {
			t.Errorf("debianVersion(%q) = %q, want %q", in, got, want)
		}
	}
}
