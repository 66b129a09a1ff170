//go:build linux

package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/require"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// TestAgentUpdatesItself runs the built agent binary through its own
// updates, with a process workload that must never stop:
//   - a good version (the agent built again as 2.0.0) is rolled out,
//     runs on probation and is adopted;
//   - a version that exits at once is refused within its start counter,
//     and the box is back on 2.0.0;
//   - a version that runs but never reaches the console is refused at the
//     end of its probation;
//   - a version whose signature does not verify is refused before it is
//     even fetched.
func TestAgentUpdatesItself(t *testing.T) {
	require.Root(t, "the process driver runs workloads under users of their own")
	h := testenv.NewBinaries(t)
	admin := h.Admin()
	box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "north", Site: "n1"}), "updating-box")
	if err != nil {
		t.Fatal(err)
	}
	for d := box.DataDir(); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o711)
	}
	testenv.StartAgentArgs(t, box, "--workload-uids", "760000")
	cli := func(args ...string) string {
		t.Helper()
		out, err := h.CLI(t, args...)
		if err != nil {
			t.Fatalf("edgebox %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	agentVersion := func() string {
		b, err := admin.Box(ctx(t), box.ID())
		if err != nil {
			return ""
		}
		return b.AgentVersion
	}
	testenv.WaitFor(t, 30*time.Second, "the box's hello", func() bool { return agentVersion() == "dev" })

	// A workload that notes each start of its own.
	cli("app", "create", "robot")
	if _, err := admin.CreateRelease(ctx(t), "robot", api.ReleaseSpec{Version: "1", Runtime: "process", Image: "/bin/sh",
		Args: []string{"-c", "echo $$ >> starts; exec sleep 3600"}}); err != nil {
		t.Fatal(err)
	}
	cli("deploy", "robot@1", "--box", box.ID())
	starts := filepath.Join(box.DataDir(), "process", "robot", "home", "starts")
	testenv.WaitFor(t, 30*time.Second, "the workload started", func() bool { b, _ := os.ReadFile(starts); return len(b) > 0 })

	// Version 2.0.0: the agent itself, built again.
	bin := t.TempDir()
	build := exec.Command("go", "build", "-ldflags", "-X main.version=2.0.0", "-o", filepath.Join(bin, "edgebox-agent"), "./cmd/edgebox-agent")
	build.Dir = moduleRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building 2.0.0: %v\n%s", err, out)
	}
	cli("agent", "upload", "2.0.0", "--file", "linux/"+goarch()+"="+filepath.Join(bin, "edgebox-agent"), "--probation", "3s")
	start := time.Now()
	r := cli("-o", "json", "rollout", "create", "edgebox-agent", "dev", "2.0.0", "--boxes", box.ID(), "--gate", "1s", "--box-timeout", "2m")
	var ro api.Rollout
	if err := json.Unmarshal([]byte(r), &ro); err != nil {
		t.Fatalf("%v: %s", err, r)
	}
	id := ro.ID
	testenv.WaitFor(t, 2*time.Minute, "the agent rollout done", func() bool {
		ro, err := admin.Rollout(ctx(t), id)
		if err == nil && ro.State == "stopped" {
			t.Fatalf("the rollout of 2.0.0 stopped: %s %+v", ro.Reason, ro.Groups)
		}
		return err == nil && ro.State == "done"
	})
	t.Logf("2.0.0 fetched, on probation (3 s) and adopted in %s", time.Since(start).Round(time.Millisecond))
	if v := agentVersion(); v != "2.0.0" {
		t.Fatalf("the box says it runs %q", v)
	}
	agentStatus := func() api.ObjectStatus {
		st, _ := admin.BoxState(ctx(t), box.ID())
		for _, s := range st.Statuses {
			if s.Kind == "AgentRelease" {
				return s
			}
		}
		return api.ObjectStatus{}
	}
	if s := agentStatus(); s.Phase != "Running" {
		t.Errorf("agent status after adoption: %+v", s)
	}

	// Versions that fail: each is refused, and the box goes back to
	// 2.0.0, which says so.
	for _, bad := range []struct{ version, script, why string }{
		{"3.0.0", "#!/bin/sh\nexit 1\n", "exited 3 times"},
		{"4.0.0", "#!/bin/sh\nexec sleep 3600\n", "did not reach the console"},
	} {
		path := filepath.Join(bin, bad.version)
		if err := os.WriteFile(path, []byte(bad.script), 0o755); err != nil {
			t.Fatal(err)
		}
		cli("agent", "upload", bad.version, "--file", "linux/"+goarch()+"="+path, "--probation", "3s")
		cli("agent", "pin", bad.version, "--box", box.ID())
		testenv.WaitFor(t, 2*time.Minute, bad.version+" refused", func() bool {
			s := agentStatus()
			return s.Phase == "Failed" && strings.Contains(s.Message, bad.why) && agentVersion() == "2.0.0"
		})
		t.Logf("%s refused: %s", bad.version, agentStatus().Message)
	}

	// A release whose signature does not verify, put by hand: refused
	// before it is fetched.
	cli("agent", "unpin", "--box", box.ID())
	put := `{"version":"5.0.0","sha256":"` + strings.Repeat("ab", 32) + `","signature":"` + "bm90IGEgc2lnbmF0dXJl" + `"}`
	cli("boxes", "desired", "put", box.ID(), "AgentRelease/agent", "--spec", put)
	testenv.WaitFor(t, time.Minute, "5.0.0 refused", func() bool {
		s := agentStatus()
		return s.Phase == "Failed" && strings.Contains(s.Message, "signature does not verify")
	})
	if _, err := os.Stat(filepath.Join(box.DataDir(), "update", "bin", "5.0.0")); err == nil {
		t.Error("the box fetched a release whose signature does not verify")
	}
	b, _ := os.ReadFile(starts)
	if n := len(strings.Fields(string(b))); n != 1 {
		t.Errorf("the workload started %d times across the agent's updates, want once", n)
	}
}

func moduleRoot(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

func goarch() string {
	out, _ := exec.Command("go", "env", "GOARCH").Output()
	return strings.TrimSpace(string(out))
}
