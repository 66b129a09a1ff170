package installer

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgebox/edgebox/internal/require"
)

func TestSystemdUnitPassesSystemdAnalyze(t *testing.T) {
	t.Parallel()
	require.Tools(t, "systemd", "systemd-analyze")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []Layout{
		{Bin: exe, DataDir: "/var/lib/edgebox-agent"},
		{Bin: exe, DataDir: "/srv/edge box/agent data"}, // quoting
	} {
		unit := filepath.Join(t.TempDir(), ServiceName+".service")
		if err := os.WriteFile(unit, []byte(SystemdUnit(l)), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("systemd-analyze", "verify", "--man=no", unit).CombinedOutput()
		if err != nil || strings.Contains(string(out), ServiceName) {
			t.Fatalf("systemd-analyze verify: %v\n%s\n%s", err, out, SystemdUnit(l))
		}
	}
}

func TestServiceDefinitions(t *testing.T) {
	t.Parallel()
	win := serviceConfig(layoutFor("windows"))
	if win.Executable != `C:\Program Files\edgebox\edgebox-agent.exe` || win.Option["OnFailure"] != "restart" ||
		win.Option["OnFailureDelayDuration"] != "5s" || win.Option["StartType"] != "automatic" {
		t.Fatalf("Windows service: %+v", win)
	}
	lin := serviceConfig(layoutFor("linux"))
	if got := strings.Join(lin.Arguments, " "); got != "run --data /var/lib/edgebox-agent" {
		t.Fatalf("service arguments %q", got)
	}
	unit := SystemdUnit(layoutFor("linux"))
	for _, want := range []string{"ExecStart=/usr/local/bin/edgebox-agent run --data /var/lib/edgebox-agent", "Restart=always", "StartLimitIntervalSec=0", "WantedBy=multi-user.target"} {
		if !strings.Contains(unit, want) {
			t.Errorf("the unit lacks %q", want)
		}
	}
	if lin.Option["SystemdScript"] != unit {
		t.Error("kardianos/service would not install our unit")
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"http://user:secret@proxy:3128": "http://…@proxy:3128",
		"http://proxy:3128":             "http://proxy:3128",
	} {
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}
