//go:build linux

package process

import (
	"bytes"
	"context"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/internal/test/require"
)

// TestASessionRunsAsTheWorkloadsUser: a command in a native workload runs
// as the workload's own user, in its home, with its environment; a
// workload that does not run has no session.
func TestASessionRunsAsTheWorkloadsUser(t *testing.T) {
	require.Root(t, "running programs as other users")
	d, err := New(Config{StateDir: stateDir(t), CgroupRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := d.Create(ctx, runtime.NewSpec("robot", workload("there"))); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Session(ctx, "robot", runtime.SessionSpec{Command: []string{"id", "-u"}}); err == nil {
		t.Fatal("a session in a workload that does not run")
	}
	if err := d.Start(ctx, "robot"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Remove(context.Background(), "robot") })
	rec, err := d.load("robot")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	p, err := d.Session(ctx, "robot", runtime.SessionSpec{Command: []string{"sh", "-c", `echo "$(id -u) $(pwd) $GREETING"`},
		Stdin: strings.NewReader(""), Stdout: &out, Stderr: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	code, _, err := p.Wait()
	p.Close()
	want := strconv.Itoa(rec.UID) + " " + d.dir("robot") + "/home there"
	if err != nil || code != 0 || strings.TrimSpace(out.String()) != want {
		t.Fatalf("the session said %q (exit %d, %v), want %q", out.String(), code, err, want)
	}
}
