package fake

import (
	"testing"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/runtimetest"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

func TestConformance(t *testing.T) {
	runtimetest.Run(t, runtimetest.Harness{
		New: func(*testing.T) runtime.Driver { return New("containerd") },
		Workload: func(greeting string) *edgeboxv1.Workload {
			return &edgeboxv1.Workload{App: "robot", Release: greeting, Runtime: "containerd", Env: []string{"GREETING=" + greeting}}
		},
		// The fake runs nothing; its log says what it did.
		Output: func(greeting string) string { return "started robot " + greeting },
	})
}
