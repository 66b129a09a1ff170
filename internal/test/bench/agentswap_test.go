//go:build linux

package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/require"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// BenchmarkAgentSwap times a box's agent changing version: the built
// agent is told to run itself built again as 2.0.0, fetches it through
// its tunnel, and starts it under its launcher. It reports how long the
// console saw the box without a session while the agents changed, the
// time from the pin to the new version adopted after its probation (2 s),
// and checks that the box's workload (a native process) never stopped.
//
//	go test -run '^$' -bench AgentSwap -benchtime 1x ./internal/test/bench/
func BenchmarkAgentSwap(b *testing.B) {
	require.Root(b, "the process driver runs workloads under users of their own")
	for range b.N {
		h := testenv.NewBinaries(b)
		admin := h.Admin()
		ctx := context.Background()
		box, err := h.Enroll(b, h.Token(b, api.TokenRequest{Region: "north", Site: "n1"}), "swap-box")
		if err != nil {
			b.Fatal(err)
		}
		for d := box.DataDir(); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
			os.Chmod(d, 0o711)
		}
		testenv.StartAgentArgs(b, box, "--workload-uids", "770000")
		testenv.WaitFor(b, 30*time.Second, "the box online", func() bool { x, err := admin.Box(ctx, box.ID()); return err == nil && x.Online })
		if _, err := admin.CreateApp(ctx, "robot", ""); err != nil {
			b.Fatal(err)
		}
		if _, err := admin.CreateRelease(ctx, "robot", api.ReleaseSpec{Version: "1", Runtime: "process", Image: "/bin/sh",
			Args: []string{"-c", "echo $$ >> starts; exec sleep 3600"}}); err != nil {
			b.Fatal(err)
		}
		if _, err := admin.Deploy(ctx, "robot", "1", "box", box.ID()); err != nil {
			b.Fatal(err)
		}
		starts := filepath.Join(box.DataDir(), "process", "robot", "home", "starts")
		testenv.WaitFor(b, 30*time.Second, "the workload started", func() bool { x, _ := os.ReadFile(starts); return len(x) > 0 })
		bin := filepath.Join(b.TempDir(), "edgebox-agent")
		build := exec.Command("go", "build", "-ldflags", "-X main.version=2.0.0", "-o", bin, "./cmd/edgebox-agent")
		root, _ := exec.Command("go", "env", "GOMOD").Output()
		build.Dir = filepath.Dir(strings.TrimSpace(string(root)))
		if out, err := build.CombinedOutput(); err != nil {
			b.Fatalf("building 2.0.0: %v\n%s", err, out)
		}
		f, err := os.Open(bin)
		if err != nil {
			b.Fatal(err)
		}
		_, err = admin.UploadAgentRelease(ctx, "2.0.0", "linux/"+runtime.GOARCH, "2s", f)
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
		// The console's view, every 5 ms: when the box's session went and
		// came back.
		var down, up, adopted time.Time
		pinned := time.Now()
		if err := admin.PinAgent(ctx, "2.0.0", "box", box.ID()); err != nil {
			b.Fatal(err)
		}
		deadline := time.Now().Add(2 * time.Minute)
		for time.Now().Before(deadline) {
			x, err := admin.Box(ctx, box.ID())
			now := time.Now()
			switch {
			case err != nil:
			case !x.Online && down.IsZero():
				down = now
			case x.Online && !down.IsZero() && up.IsZero():
				up = now
			}
			if st, err := admin.BoxState(ctx, box.ID()); err == nil && !up.IsZero() {
				for _, s := range st.Statuses {
					if s.Kind == "AgentRelease" && s.Phase == "Running" && s.Release == "2.0.0" {
						adopted = now
					}
				}
			}
			if !adopted.IsZero() {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if adopted.IsZero() || down.IsZero() {
			st, _ := admin.BoxState(ctx, box.ID())
			b.Fatalf("not adopted within 2 min (down %v, up %v); statuses %+v", down, up, st.Statuses)
		}
		x, _ := os.ReadFile(starts)
		if n := len(strings.Fields(string(x))); n != 1 {
			b.Fatalf("the workload started %d times", n)
		}
		gap := up.Sub(down)
		b.ReportMetric(gap.Seconds()*1000, "ms-without-agent")
		b.ReportMetric(adopted.Sub(pinned).Seconds(), "s-to-adopted")
		b.Logf("the box was without a session for %s while its agent changed version; pinned to adopted (2 s probation) in %s; the workload ran on untouched",
			gap.Round(time.Millisecond), adopted.Sub(pinned).Round(time.Millisecond))
	}
}
