package fake

import (
	"testing"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/runtimetest"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

func TestConformance(t *testing.T) {
	copies := map[string]*Driver{} // by test: the suite runs them one at a time
	runtimetest.Run(t, runtimetest.Harness{
		New: func(*testing.T) runtime.Driver { return New("containerd") },
		Workload: func(greeting string) *edgeboxv1.Workload {
			return &edgeboxv1.Workload{App: "robot", Release: greeting, Runtime: "containerd", Env: []string{"GREETING=" + greeting}}
		},
		// The fake runs nothing; its log says what it did.
		Output: func(greeting string) string { return "started robot " + greeting },
		// The fake's state outlives a driver, as a runtime's outlives the
		// agent.
		Restart: func(t *testing.T) func(runtime.CrashHook) runtime.Driver {
			d := New("containerd")
			copies[t.Name()] = d
			return func(crash runtime.CrashHook) runtime.Driver { return d.Reopen(crash) }
		},
		Copies: func(t *testing.T, greeting string) int { return copies[t.Name()].Copies(greeting) },
	})
}
