package reconcile

import (
	"context"
	"fmt"
	"sync"

	"github.com/edgebox/edgebox/agent/runtime"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// pull is one image fetch in progress or just ended.
type pull struct {
	progress runtime.Progress
	finished bool
	err      error
}

// pulls runs image fetches beside the passes, one per image, so a long
// download holds up no other workload.
type pulls struct {
	mu sync.Mutex
	m  map[string]*pull
	wg sync.WaitGroup
}

// ensureImage reports whether ref is on the box; when it is not, it starts
// fetching it (once) and returns how far the fetch has come. A fetch that
// failed is reported once; the next call starts a new one.
func (r *Reconciler) ensureImage(ctx context.Context, p runtime.Puller, rt, workload, ref string) (ready bool, msg string, err error) {
	ps := &r.pulls
	ps.mu.Lock()
	cur := ps.m[ref]
	if cur != nil && !cur.finished {
		msg = "pulling " + ref + ": " + progressText(cur.progress)
		ps.mu.Unlock()
		return false, msg, nil
	}
	delete(ps.m, ref)
	ps.mu.Unlock()
	if cur != nil && cur.err != nil {
		return false, "", cur.err
	}
	ok, err := p.HasImage(ctx, ref)
	if err != nil || ok {
		return ok, "", err
	}
	cur = &pull{}
	ps.mu.Lock()
	ps.m[ref] = cur
	ps.mu.Unlock()
	r.event(workload, edgeboxv1.ReasonPulling, ref, false)
	ps.wg.Add(1)
	go func() {
		defer ps.wg.Done()
		err := p.Pull(r.pullContext(ctx), ref, r.cfg.Registry, func(pr runtime.Progress) {
			ps.mu.Lock()
			cur.progress = pr
			ps.mu.Unlock()
		})
		ps.mu.Lock()
		cur.finished, cur.err = true, err
		ps.mu.Unlock()
		if err == nil {
			r.event(workload, edgeboxv1.ReasonPulled, ref+": "+progressText(cur.progress), false)
			if err := r.images.pulled(ref, rt); err != nil {
				r.cfg.Log.Warn("image record", "err", err)
			}
		}
		r.Kick()
	}()
	return false, "pulling " + ref, nil
}

// pullContext is the context fetches run under: the reconciler's own
// while it runs, so a fetch outlives the pass that started it.
func (r *Reconciler) pullContext(pass context.Context) context.Context {
	if r.runCtx != nil {
		return r.runCtx
	}
	return context.WithoutCancel(pass)
}

func progressText(p runtime.Progress) string {
	if p.Total == 0 {
		return "starting"
	}
	return fmt.Sprintf("%s of %s", bytesText(p.Done), bytesText(p.Total))
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
