package installer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/internal/test/require"
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

// windowsFiles acts as Windows does with the file of a running program:
// it cannot be replaced or removed, but it can be renamed.
type windowsFiles struct{ running map[string]bool }

func (w *windowsFiles) files() files {
	return files{
		rename: func(from, to string) error {
			if w.running[to] {
				return &os.LinkError{Op: "rename", Old: from, New: to, Err: errors.New("Access is denied.")}
			}
			if err := os.Rename(from, to); err != nil {
				return err
			}
			if w.running[from] {
				delete(w.running, from)
				w.running[to] = true
			}
			return nil
		},
		remove: func(p string) error {
			if w.running[p] {
				return &os.PathError{Op: "remove", Path: p, Err: errors.New("Access is denied.")}
			}
			return os.Remove(p)
		},
	}
}

// TestInstallReplacesARunningBinary: installing again while the service
// runs puts the new binary in place on Linux and on Windows (where the
// running one is set aside and removed once it has ended), and leaves
// nothing else beside it.
func TestInstallReplacesARunningBinary(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		windows bool
	}{{"linux", false}, {"windows", true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			dst := filepath.Join(dir, "edgebox-agent.exe")
			if err := os.WriteFile(dst, []byte("old agent"), 0o755); err != nil {
				t.Fatal(err)
			}
			w := &windowsFiles{running: map[string]bool{}}
			fs := osFiles
			if c.windows {
				w.running[dst] = true // the service runs it
				fs = w.files()
			}
			if err := placeBinary(dst, []byte("new agent"), fs); err != nil {
				t.Fatal(err)
			}
			if raw, _ := os.ReadFile(dst); string(raw) != "new agent" {
				t.Fatalf("after the install: %q", raw)
			}
			if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o755 {
				t.Fatalf("mode %v", fi.Mode())
			}
			left := func() []string {
				ents, _ := os.ReadDir(dir)
				var names []string
				for _, e := range ents {
					names = append(names, e.Name())
				}
				return names
			}
			want := 1
			if c.windows {
				want = 2 // the running old one, set aside
			}
			if got := left(); len(got) != want {
				t.Fatalf("beside the binary: %v", got)
			}
			// The old program ended (the service restarted on the new
			// binary); the next install, or uninstall, removes it.
			clear(w.running)
			if err := placeBinary(dst, []byte("newer agent"), fs); err != nil {
				t.Fatal(err)
			}
			if got := left(); len(got) != 1 || got[0] != "edgebox-agent.exe" {
				t.Fatalf("after the old program ended: %v", got)
			}
		})
	}
}
