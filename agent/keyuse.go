package agent

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// keysInUse lists the leased UKEYs a process on the box has open, of the
// workloads whose release says their keys hold updates
// (keys_hold_updates): workload -> the keys' IDs.
func (a *Agent) keysInUse() map[string][]string {
	objs, err := a.local.Objects(edgeboxv1.KindWorkload)
	if err != nil {
		return nil
	}
	var devs []runtime.Device
	owner := map[string]string{}
	for _, o := range objs {
		if !o.GetWorkload().GetKeysHoldUpdates() {
			continue
		}
		for _, d := range a.devicesFor(o.GetName()) {
			devs = append(devs, d)
			owner[d.KeyID] = o.GetName()
		}
	}
	if len(devs) == 0 {
		return nil
	}
	out := map[string][]string{}
	for _, d := range openDevices(devs) {
		out[owner[d.KeyID]] = append(out[owner[d.KeyID]], d.KeyID)
	}
	return out
}

// holding says whether update locks, or leased UKEYs in use, hold the
// box now, and why.
func (a *Agent) holding() (bool, string) {
	if held, why := a.locks.Holding(); held {
		return true, why
	}
	if why, _ := a.keyHold.Load().(string); why != "" {
		return true, why
	}
	return false, ""
}

// watchKeyUse looks every period for leased UKEYs in use whose workload
// asks that they not be cut mid-use, reports each as an UpdateLock
// status ("ukey-<workload>") the console's rollouts wait on, and holds the
// agent's own replacements while one is.
func (a *Agent) watchKeyUse(ctx context.Context, period time.Duration) {
	reported := map[string]bool{}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		inUse := a.keysInUse()
		now := map[string]bool{}
		var whys []string
		for w, keys := range inUse {
			sort.Strings(keys)
			name := "ukey-" + w
			if len(name) > 63 {
				name = name[:63]
			}
			msg := fmt.Sprintf("UKEY %s in use by %s", strings.Join(keys, ", "), w)
			whys = append(whys, msg)
			now[name] = true
			a.reports.Report(&edgeboxv1.ObjectStatus{Kind: edgeboxv1.KindUpdateLock, Name: name, Phase: edgeboxv1.PhaseRunning, Message: msg})
		}
		for n := range reported {
			if !now[n] {
				a.reports.Report(&edgeboxv1.ObjectStatus{Kind: edgeboxv1.KindUpdateLock, Name: n, Phase: edgeboxv1.PhaseRemoved})
			}
		}
		sort.Strings(whys)
		was, _ := a.keyHold.Load().(string)
		why := strings.Join(whys, "; ")
		a.keyHold.Store(why)
		if was != "" && why == "" {
			a.reconciler.Kick() // what waited on a key goes on
		}
		reported = now
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
