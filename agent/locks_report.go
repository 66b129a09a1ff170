package agent

import (
	"context"
	"path/filepath"
	"time"

	"github.com/edgebox/edgebox/agent/locks"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// reportLocks reports the update locks workloads hold as statuses of kind
// UpdateLock (the console's rollouts hold the box back while one is
// there), as they are taken, released and expire, and has the reconciler
// look again when they change: what waited on a lock goes on.
func (a *Agent) reportLocks(ctx context.Context) {
	reported := map[string]bool{}
	for {
		held := a.locks.Held()
		now := map[string]bool{}
		next := time.Hour
		for _, l := range held {
			now[l.Holder] = true
			msg := "until " + l.Until.Format(time.RFC3339)
			if l.Reason != "" {
				msg = l.Reason + " (" + msg + ")"
			}
			a.reports.Report(&edgeboxv1.ObjectStatus{Kind: edgeboxv1.KindUpdateLock, Name: l.Holder, Phase: edgeboxv1.PhaseRunning,
				Message: msg, UpdatedUnixNano: l.Since.UnixNano()})
			next = min(next, time.Until(l.Until))
		}
		for h := range reported {
			if !now[h] {
				a.reports.Report(&edgeboxv1.ObjectStatus{Kind: edgeboxv1.KindUpdateLock, Name: h, Phase: edgeboxv1.PhaseRemoved})
			}
		}
		a.reconciler.Kick() // what waited on a lock may go on
		reported = now
		t := time.NewTimer(max(next, 0) + 50*time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-a.locks.Changed():
		case <-t.C:
		}
		t.Stop()
	}
}

// APIDir is the directory of the agent's local API socket under the data
// directory dataDir (Linux; containers get it mounted at /run/edgebox).
func APIDir(dataDir string) string { return filepath.Join(dataDir, apiDir) }

// APIAddress is the address of the agent's local API on a box whose data
// directory is dataDir, as workloads are told it (EDGEBOX_AGENT_API).
func APIAddress(dataDir string) string { return locks.Address(APIDir(dataDir)) }
