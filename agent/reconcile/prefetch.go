package reconcile

import (
	"context"
	"fmt"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// prefetch brings the images the box's ImagePrefetch objects name to
// disk, while the workloads run what they run, and reports each: Pulling,
// Running once the image is on disk, or Failed. It returns the images to
// keep in the cache, keyed apart from the workloads' ("prefetch/<name>").
func (r *Reconciler) prefetch(ctx context.Context) (map[string]string, error) {
	objs, err := r.cfg.Source.Objects(edgeboxv1.KindImagePrefetch)
	if err != nil {
		return nil, fmt.Errorf("reading the desired state: %w", err)
	}
	keep := map[string]string{}
	want := map[string]bool{}
	for _, o := range objs {
		name, rev, p := o.GetName(), o.GetRevision(), o.GetImagePrefetch()
		if p == nil {
			continue
		}
		want[name] = true
		report := func(phase, reason, msg string) {
			r.prefetched[name] = true
			r.cfg.Reporter.Report(&edgeboxv1.ObjectStatus{Kind: edgeboxv1.KindImagePrefetch, Name: name, ObservedRevision: rev,
				Phase: phase, Reason: reason, Message: msg, UpdatedUnixNano: time.Now().UnixNano()})
		}
		d := r.drivers[p.GetRuntime()]
		pl, pulls := d.(runtime.Puller)
		switch {
		case d == nil:
			report(edgeboxv1.PhaseFailed, edgeboxv1.ReasonPullFailed, fmt.Sprintf("runtime %q is not available on this box", p.GetRuntime()))
		case !pulls || p.GetImage() == "":
			report(edgeboxv1.PhaseRunning, "", "nothing to fetch")
		default:
			keep["prefetch/"+name] = p.GetImage()
			ready, msg, err := r.ensureImage(ctx, pl, p.GetRuntime(), name, p.GetImage())
			switch {
			case err != nil:
				report(edgeboxv1.PhaseFailed, edgeboxv1.ReasonPullFailed, err.Error())
			case !ready:
				report(edgeboxv1.PhasePulling, "", msg)
			default:
				report(edgeboxv1.PhaseRunning, "", p.GetImage()+" is on disk")
			}
		}
	}
	for name := range r.prefetched {
		if !want[name] {
			r.cfg.Reporter.Report(&edgeboxv1.ObjectStatus{Kind: edgeboxv1.KindImagePrefetch, Name: name, Phase: edgeboxv1.PhaseRemoved})
			delete(r.prefetched, name)
		}
	}
	return keep, nil
}
