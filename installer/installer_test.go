package installer

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
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

func TestWaitOnlineWaitsForTheHello(t *testing.T) {
	t.Parallel()
	start := time.Now()
	for _, c := range []struct {
		approved bool
		want     string
	}{
		{true, "online: till (box bx-1)"},
		{false, "online, waiting for an operator: edgebox boxes approve bx-1"},
	} {
		dir := t.TempDir()
		write := func(s agent.Status) {
			t.Helper()
			s.BoxID, s.Name, s.PID, s.UpdatedAt = "bx-1", "till", 1, time.Now()
			raw, _ := json.Marshal(s)
			if err := os.WriteFile(filepath.Join(dir, "status.json"), raw, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		// Connected, the console not yet heard from on this connection;
		// what Approved says is from before.
		since := time.Now()
		write(agent.Status{Connected: true, Since: since, HelloAt: since.Add(-time.Hour)})
		var out bytes.Buffer
		done := make(chan error, 1)
		go func() { done <- waitOnline(context.Background(), dir, start, 10*time.Second, &out) }()
		select {
		case err := <-done:
			t.Fatalf("returned before the hello: %v, %q", err, out.String())
		case <-time.After(700 * time.Millisecond):
		}
		write(agent.Status{Connected: true, Since: since, HelloAt: time.Now(), Approved: c.approved})
		if err := <-done; err != nil || !strings.Contains(out.String(), c.want) {
			t.Fatalf("approved %v: %v, %q; want %q", c.approved, err, out.String(), c.want)
		}
	}
}
