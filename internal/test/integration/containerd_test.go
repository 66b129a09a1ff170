//go:build linux

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/internal/test/ctrdtest"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// TestDesiredWorkloadRunsInContainerd: an operator writes a Workload for a
// box through the API; the box's agent runs it in a real containerd,
// reports it running, replaces it when its spec changes and removes it
// when it is deleted.
func TestDesiredWorkloadRunsInContainerd(t *testing.T) {
	d := testenv.Containerd(t, true)
	h := testenv.NewInProcess(t, testenv.Options{})
	box := enrollOne(t, h, "container-box")
	testenv.StartAgent(t, box, func(c *agent.Config) { c.Drivers = []runtime.Driver{d}; c.Reconcile = time.Second })

	put := func(greeting string) uint64 {
		spec, _ := json.Marshal(map[string]any{"app": "robot", "release": greeting, "runtime": "containerd",
			"image": ctrdtest.Image, "env": []string{"GREETING=" + greeting}, "memory_bytes": 64 << 20})
		rev, err := h.Admin().PutDesired(ctx(t), box.ID(), "Workload", "robot", spec)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	running := func(rev uint64, greeting string) {
		t.Helper()
		testenv.WaitFor(t, 60*time.Second, "robot running "+greeting, func() bool {
			s, err := h.Admin().BoxState(ctx(t), box.ID())
			if err != nil || len(s.Statuses) != 1 || s.Statuses[0].Phase != "Running" || s.Statuses[0].ObservedRevision != rev {
				return false
			}
			var out bytes.Buffer
			return d.Logs(context.Background(), "robot", 0, &out) == nil && strings.Contains(out.String(), "hello "+greeting)
		})
	}
	running(put("one"), "one")
	running(put("two"), "two") // a new release replaces the container

	if _, err := h.Admin().DeleteDesired(ctx(t), box.ID(), "Workload", "robot"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, "robot removed", func() bool {
		list, err := d.List(context.Background())
		s, serr := h.Admin().BoxState(ctx(t), box.ID())
		return err == nil && len(list) == 0 && serr == nil && len(s.Statuses) == 0
	})
}
