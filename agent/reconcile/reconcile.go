// Package reconcile brings what runs on the box to what the box's local
// store says should run. It reads only the local store, never the network,
// so a box with the console out of reach still restarts every workload as
// last desired. Every pass is idempotent: it acts only on differences.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"time"

	"github.com/edgebox/edgebox/agent/health"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Source is where desired objects come from: the agent's local store.
type Source interface {
	Objects(kind string) ([]*edgeboxv1.DesiredObject, error)
}

// Reporter takes what the reconciler makes of each object.
type Reporter interface {
	Report(*edgeboxv1.ObjectStatus)
	Event(*edgeboxv1.Event)
}

// Config is a reconciler's configuration.
type Config struct {
	Source   Source
	Drivers  []runtime.Driver
	Reporter Reporter
	Log      *slog.Logger
	// Interval is the time between passes when nothing asks for one; a
	// pass also notices instances that died. Default 10 s.
	Interval time.Duration
	// StopTimeout is how long a workload may take to stop. Default 30 s.
	StopTimeout time.Duration
	// Now tells the time, for restart back-off; nil is time.Now.
	Now func() time.Time
	// Registry is the HTTP client drivers pull images with; nil is a
	// plain client.
	Registry *http.Client
	// Devices returns the USB keys leased to a workload, where they are
	// now; nil: none.
	Devices func(workload string) []runtime.Device
	// SuspectKeys is told the keys of a workload that became unhealthy:
	// a stuck key is a common cause, and a power cycle may cure it.
	SuspectKeys func(keys []runtime.Device)
	// Holding says whether update locks hold the box now, and why: a
	// running workload is then neither replaced nor removed (new ones
	// still start). nil: nothing holds.
	Holding func() (bool, string)
	// ImageRecord is the file that remembers pulled images, so the image
	// cache keeps each workload's current and previous release and drops
	// the rest; empty keeps it in memory.
	ImageRecord string
}

// Restart back-off: the first restart is at once, then 10 s, doubling up to
// 5 min; a workload that ran for stableAfter is forgiven its past exits.
const (
	firstBackoff = 10 * time.Second
	maxBackoff   = 5 * time.Minute
	stableAfter  = 10 * time.Minute
)

// crashes is the restart record of one workload.
type crashes struct {
	why     string // the reason of the last restart: Unhealthy, or BackOff for an exit
	count   int
	next    time.Time // no restart before
	upSince time.Time // first seen running since the last restart
}

// Reconciler converges the box on its desired workloads.
type Reconciler struct {
	cfg     Config
	drivers map[string]runtime.Driver
	kick    chan struct{}
	// reported holds the workloads with a status, so a workload that
	// leaves the desired state has its status removed.
	reported map[string]bool
	crashes  map[string]*crashes
	pulls    pulls
	images   *imageCache
	prober   *health.Prober // set by Run: probes run only while it runs
	// running is the release each workload's instance runs, for status.
	running map[string]string
	// attached are the USB keys each workload's instance was given.
	attached map[string][]runtime.Device
	// nets are each workload's instance's address, published ports and
	// egress refusals, as the driver last showed them, for status.
	nets map[string]netStatus
	// prefetched are the ImagePrefetch objects with a status.
	prefetched map[string]bool
	runCtx     context.Context // set by Run, for pulls that outlive a pass
}

// New returns a reconciler; Run starts it.
func New(cfg Config) (*Reconciler, error) {
	if cfg.Source == nil || cfg.Reporter == nil || cfg.Log == nil {
		return nil, errors.New("reconcile: Source, Reporter and Log are required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	images, err := openImageCache(cfg.ImageRecord)
	if err != nil {
		return nil, fmt.Errorf("reconcile: image record: %w", err)
	}
	r := &Reconciler{cfg: cfg, images: images, drivers: map[string]runtime.Driver{}, kick: make(chan struct{}, 1), reported: map[string]bool{},
		crashes: map[string]*crashes{}, pulls: pulls{m: map[string]*pull{}},
		running: map[string]string{}, attached: map[string][]runtime.Device{}, nets: map[string]netStatus{}, prefetched: map[string]bool{}}
	for _, d := range cfg.Drivers {
		if _, dup := r.drivers[d.Runtime()]; dup {
			return nil, fmt.Errorf("reconcile: two drivers for runtime %q", d.Runtime())
		}
		r.drivers[d.Runtime()] = d
	}
	return r, nil
}

// Kick asks for a pass soon; the desired state changed.
func (r *Reconciler) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run makes a pass at once, then on every Kick and every Interval, until
// ctx ends.
func (r *Reconciler) Run(ctx context.Context) {
	r.runCtx = ctx
	r.prober = health.New(ctx, r.Kick)
	r.sweep(ctx)
	defer r.prober.Wait()
	defer r.pulls.wg.Wait()
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		if err := r.Once(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Log.Warn("reconcile pass failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-t.C:
		}
	}
}

type held struct {
	drv  runtime.Driver
	inst runtime.Instance
}

// Once makes one pass. Trouble with one workload is reported in its status
// and does not stop the others; the error is for the pass as a whole.
func (r *Reconciler) Once(ctx context.Context) error {
	objs, err := r.cfg.Source.Objects(edgeboxv1.KindWorkload)
	if err != nil {
		return fmt.Errorf("reading the desired state: %w", err)
	}
	have := map[string]held{}
	listFailed := map[string]error{}
	for rt, d := range r.drivers {
		insts, err := d.List(ctx)
		if err != nil {
			listFailed[rt] = err
			continue
		}
		for _, in := range insts {
			have[in.Name] = held{d, in}
		}
	}
	want := map[string]bool{}
	images := map[string]string{}
	for _, o := range objs {
		want[o.GetName()] = true
		images[o.GetName()] = o.GetWorkload().GetImage()
		r.converge(ctx, o, have, listFailed)
	}
	var gone []string
	for name := range have {
		if !want[name] {
			gone = append(gone, name)
		}
	}
	sort.Strings(gone)
	stuck := map[string]bool{}
	if held, why := r.holding(); held && len(gone) > 0 {
		for _, name := range gone {
			stuck[name] = true
			r.status(name, 0, edgeboxv1.PhasePending, "no longer desired; removed once nothing holds the box: "+why)
		}
		gone = nil
	}
	for _, name := range gone {
		if err := r.remove(ctx, have[name].drv, name); err != nil {
			stuck[name] = true
			r.event(name, edgeboxv1.ReasonRemoveFailed, err.Error(), true)
			r.status(name, 0, edgeboxv1.PhaseFailed, "no longer desired, but "+err.Error())
			continue
		}
		r.event(name, edgeboxv1.ReasonRemoved, "no longer desired", false)
	}
	for name := range r.crashes {
		if !want[name] {
			delete(r.crashes, name)
		}
	}
	for name := range r.reported {
		if !want[name] && !stuck[name] {
			r.cfg.Reporter.Report(&edgeboxv1.ObjectStatus{Kind: edgeboxv1.KindWorkload, Name: name, Phase: edgeboxv1.PhaseRemoved})
			delete(r.reported, name)
		}
	}
	if len(listFailed) > 0 {
		return fmt.Errorf("listing instances: %v", listFailed)
	}
	pre, err := r.prefetch(ctx)
	if err != nil {
		return err
	}
	for k, img := range pre {
		images[k] = img
	}
	removed, err := r.images.collect(ctx, images, r.drivers)
	for _, ref := range removed {
		r.cfg.Log.Info("image removed from the cache: no current or previous release uses it", "image", ref)
	}
	if err != nil {
		return fmt.Errorf("image cache: %w", err)
	}
	return nil
}

// converge brings one workload to its desired spec, running.
func (r *Reconciler) converge(ctx context.Context, o *edgeboxv1.DesiredObject, have map[string]held, listFailed map[string]error) {
	name, rev := o.GetName(), o.GetRevision()
	w := o.GetWorkload()
	if w == nil {
		r.status(name, rev, edgeboxv1.PhaseFailed, "this agent does not understand the object's spec; upgrade the agent")
		return
	}
	d := r.drivers[w.GetRuntime()]
	if d == nil {
		r.status(name, rev, edgeboxv1.PhaseFailed, fmt.Sprintf("runtime %q is not available on this box", w.GetRuntime()))
		return
	}
	if err := listFailed[w.GetRuntime()]; err != nil {
		r.status(name, rev, edgeboxv1.PhaseFailed, fmt.Sprintf("runtime %q: %v", w.GetRuntime(), err))
		return
	}
	var devs []runtime.Device
	if r.cfg.Devices != nil {
		devs = r.cfg.Devices(name)
	}
	spec := runtime.NewSpecWith(name, w, devs)
	h, exists := have[name]
	replace := exists && (h.drv != d || h.inst.Hash != spec.Hash)
	if p, ok := d.(runtime.Puller); ok && (!exists || replace) && w.GetImage() != "" {
		// The image comes first; a running older release keeps running
		// until it is here.
		ready, msg, err := r.ensureImage(ctx, p, w.GetRuntime(), name, w.GetImage())
		if err != nil {
			r.fail(name, rev, edgeboxv1.ReasonPullFailed, err)
			return
		}
		if !ready {
			r.status(name, rev, edgeboxv1.PhasePulling, msg)
			return
		}
	}
	if replace {
		if held, why := r.holding(); held {
			r.status(name, rev, edgeboxv1.PhasePending, fmt.Sprintf("release %s waits: %s", w.GetRelease(), why))
			return
		}
		if err := r.remove(ctx, h.drv, name); err != nil {
			r.fail(name, rev, edgeboxv1.ReasonReplaceFailed, err)
			return
		}
		r.event(name, edgeboxv1.ReasonReplacing, fmt.Sprintf("release %s at revision %d", w.GetRelease(), rev), false)
		delete(r.crashes, name) // a new release's restarts are its own
		exists = false
	}
	if !exists {
		if err := r.images.use(name, w.GetImage()); err != nil {
			r.cfg.Log.Warn("image record", "err", err)
		}
		in, made, err := r.create(ctx, d, spec)
		if err != nil {
			r.fail(name, rev, edgeboxv1.ReasonCreateFailed, err)
			return
		}
		if made {
			r.event(name, edgeboxv1.ReasonCreated, fmt.Sprintf("release %s", w.GetRelease()), false)
		}
		h.inst = in
	}
	r.network(ctx, d, name, h.inst)
	why := edgeboxv1.ReasonBackOff // of a restart, unless the probes asked for it
	if h.inst.State == runtime.StateRunning {
		if c := r.crashes[name]; c != nil {
			if now := r.cfg.Now(); c.upSince.IsZero() {
				c.upSince = now
			} else if now.Sub(c.upSince) > stableAfter {
				delete(r.crashes, name)
			}
		}
		r.running[name] = w.GetRelease()
		v := r.probe(name, spec, h.inst, d)
		if v.Health != health.Unhealthy || w.GetRestart() == edgeboxv1.RestartNever {
			r.status(name, rev, edgeboxv1.PhaseRunning, v.Reason)
			return
		}
		// Unhealthy: restarted like a workload that failed.
		r.event(name, edgeboxv1.ReasonUnhealthy, v.Reason, true)
		if len(spec.Devices) > 0 && r.cfg.SuspectKeys != nil {
			r.cfg.SuspectKeys(spec.Devices)
		}
		if err := d.Stop(ctx, name, r.cfg.StopTimeout); err != nil {
			r.fail(name, rev, edgeboxv1.ReasonStopFailed, err)
			return
		}
		r.prober.Forget(name)
		h.inst.State, h.inst.ExitCode = runtime.StateExited, 1
		why = edgeboxv1.ReasonUnhealthy
	} else if r.prober != nil {
		r.prober.Forget(name)
	}
	if h.inst.State == runtime.StateExited && !r.mayRestart(name, rev, w.GetRestart(), h.inst.ExitCode, why) {
		return
	}
	if err := d.Start(ctx, name); err != nil {
		r.fail(name, rev, edgeboxv1.ReasonStartFailed, err)
		return
	}
	if h.inst.State == runtime.StateExited {
		r.event(name, edgeboxv1.ReasonRestarted, fmt.Sprintf("it had exited with code %d", h.inst.ExitCode), true)
	} else {
		r.event(name, edgeboxv1.ReasonStarted, "", false)
	}
	r.running[name] = w.GetRelease()
	if in, err := d.Inspect(ctx, name); err == nil {
		r.network(ctx, d, name, in)
		r.probe(name, spec, in, d) // from now, not from the next pass
	}
	r.attach(name, spec.Devices)
	r.status(name, rev, edgeboxv1.PhaseRunning, "")
}

// holding says whether update locks hold the box now, and why.
func (r *Reconciler) holding() (bool, string) {
	if r.cfg.Holding == nil {
		return false, ""
	}
	return r.cfg.Holding()
}

// create makes the instance of spec. An instance of that name the list
// did not show (made meanwhile, or something half made that the driver
// cannot show) answers Create with a conflict: it is taken when it is
// this spec, and replaced when it is not or cannot be inspected. made
// says whether a new instance was made.
func (r *Reconciler) create(ctx context.Context, d runtime.Driver, spec runtime.Spec) (in runtime.Instance, made bool, err error) {
	created := runtime.Instance{Name: spec.Name, Hash: spec.Hash, State: runtime.StateCreated}
	err = d.Create(ctx, spec)
	if err == nil {
		return created, true, nil
	}
	if !errors.Is(err, errdefs.ErrConflict) {
		return in, false, err
	}
	if in, ierr := d.Inspect(ctx, spec.Name); ierr == nil && in.Hash == spec.Hash {
		return in, false, nil
	}
	r.cfg.Log.Warn("replacing an instance the driver holds but did not list, or of another spec", "workload", spec.Name, "err", err)
	if rerr := r.remove(ctx, d, spec.Name); rerr != nil {
		return in, false, fmt.Errorf("%w; clearing what is there: %v", err, rerr)
	}
	if err := d.Create(ctx, spec); err != nil {
		return in, false, err
	}
	return created, true, nil
}

// sweep has every driver that can stop what runs in edgebox's name but
// belongs to no instance (left by a killed agent) do so, and reports each
// as an event. It runs once, before the first pass makes anything.
func (r *Reconciler) sweep(ctx context.Context) {
	rts := make([]string, 0, len(r.drivers))
	for rt := range r.drivers {
		rts = append(rts, rt)
	}
	sort.Strings(rts)
	for _, rt := range rts {
		sw, ok := r.drivers[rt].(runtime.Sweeper)
		if !ok {
			continue
		}
		orphans, err := sw.Sweep(ctx)
		if err != nil {
			r.cfg.Log.Warn("sweeping orphans failed", "runtime", rt, "err", err)
			r.event("", edgeboxv1.ReasonSweepFailed, fmt.Sprintf("runtime %s: %v", rt, err), true)
		}
		for _, o := range orphans {
			r.cfg.Log.Warn("orphan stopped", "runtime", rt, "instance", o.Name, "pids", o.PIDs, "what", o.What)
			msg := fmt.Sprintf("runtime %s: %s", rt, o.What)
			if len(o.PIDs) > 0 {
				msg += fmt.Sprintf(" (processes %v)", o.PIDs)
			}
			r.event(o.Name, edgeboxv1.ReasonOrphanStopped, msg, true)
		}
	}
}

// attach records the keys a started instance was given, telling the
// console of each one new to it (and of those it no longer has).
func (r *Reconciler) attach(name string, devs []runtime.Device) {
	had := map[string]bool{}
	for _, d := range r.attached[name] {
		had[d.KeyID+"@"+d.HostPath] = true
	}
	now := map[string]bool{}
	for _, d := range devs {
		now[d.KeyID+"@"+d.HostPath] = true
		if !had[d.KeyID+"@"+d.HostPath] {
			r.keyEvent(d.KeyID, edgeboxv1.ReasonAttached, fmt.Sprintf("to %s at %s (%s)", name, d.Port, d.Path))
		}
	}
	for _, d := range r.attached[name] {
		if !now[d.KeyID+"@"+d.HostPath] {
			r.keyEvent(d.KeyID, edgeboxv1.ReasonDetached, "from "+name)
		}
	}
	if len(devs) == 0 {
		delete(r.attached, name)
	} else {
		r.attached[name] = devs
	}
}

func (r *Reconciler) keyEvent(keyID, reason, msg string) {
	r.cfg.Reporter.Event(&edgeboxv1.Event{TimeUnixNano: time.Now().UnixNano(), Kind: edgeboxv1.KindKey, Name: keyID, Reason: reason, Message: msg})
}

// mayRestart applies the restart policy and the back-off to a workload
// that exited, reporting why when it stays down.
func (r *Reconciler) mayRestart(name string, rev uint64, policy string, code int, why string) bool {
	switch {
	case policy == edgeboxv1.RestartNever, policy == edgeboxv1.RestartOnFailure && code == 0:
		delete(r.crashes, name)
		r.status(name, rev, edgeboxv1.PhaseStopped, fmt.Sprintf("exited with code %d; restart policy %q", code, policy))
		return false
	}
	now := r.cfg.Now()
	c := r.crashes[name]
	if c == nil {
		c = &crashes{}
		r.crashes[name] = c
	}
	c.upSince, c.why = time.Time{}, why
	if c.count > 0 && c.next.IsZero() {
		// It died again after a restart: wait before the next one.
		wait := min(firstBackoff<<min(c.count-1, 5), maxBackoff)
		c.next = now.Add(wait)
		r.event(name, edgeboxv1.ReasonBackOff, fmt.Sprintf("exited with code %d after %d restarts; next restart in %s", code, c.count, wait), true)
	}
	if now.Before(c.next) {
		r.status(name, rev, edgeboxv1.PhasePending, fmt.Sprintf("exited with code %d; restarting in %s (%d restarts so far)",
			code, c.next.Sub(now).Round(time.Second), c.count))
		return false
	}
	c.next = time.Time{}
	c.count++
	return true
}

func (r *Reconciler) remove(ctx context.Context, d runtime.Driver, name string) error {
	if err := d.Stop(ctx, name, r.cfg.StopTimeout); err != nil {
		return fmt.Errorf("stopping: %w", err)
	}
	if err := d.Remove(ctx, name); err != nil {
		return fmt.Errorf("removing: %w", err)
	}
	delete(r.running, name)
	delete(r.nets, name)
	r.attach(name, nil)
	if r.prober != nil {
		r.prober.Forget(name)
	}
	return nil
}

// probe keeps the workload's probes running (from Run only) and returns
// their verdict.
func (r *Reconciler) probe(name string, spec runtime.Spec, in runtime.Instance, d runtime.Driver) health.Verdict {
	probes := spec.Workload.GetProbes()
	if r.prober == nil || len(probes) == 0 {
		return health.Verdict{}
	}
	ex, _ := d.(runtime.Execer)
	r.prober.Watch(name, spec.Hash+"@"+in.StartedAt.String(), probes, ex)
	return r.prober.Verdict(name)
}

func (r *Reconciler) healthOf(name string) string {
	if r.prober == nil {
		return ""
	}
	return r.prober.Verdict(name).Health
}

func (r *Reconciler) fail(name string, rev uint64, reason string, err error) {
	r.cfg.Log.Warn("workload failed", "workload", name, "reason", reason, "err", err)
	r.event(name, reason, err.Error(), true)
	r.statusWhy(name, rev, edgeboxv1.PhaseFailed, reason, err.Error())
}

// netStatus is what a workload's status says of its network.
type netStatus struct {
	address string
	ports   []string
	refused uint64
}

// network records the address, published ports and egress refusals of
// a workload's instance, for its status. The count is the driver's
// (runtime.EgressCounter); one it cannot read keeps the last.
func (r *Reconciler) network(ctx context.Context, d runtime.Driver, name string, in runtime.Instance) {
	last := r.nets[name]
	ns := netStatus{address: in.Address, ports: in.Ports, refused: last.refused}
	if ec, ok := d.(runtime.EgressCounter); ok {
		if n, err := ec.EgressRefused(ctx, name); err == nil {
			ns.refused = n
		} else {
			r.cfg.Log.Debug("reading egress refusals", "workload", name, "err", err)
		}
	}
	if ns.address == "" && len(ns.ports) == 0 && ns.refused == 0 {
		delete(r.nets, name)
		return
	}
	r.nets[name] = ns
}

func (r *Reconciler) status(name string, rev uint64, phase, msg string) {
	r.statusWhy(name, rev, phase, "", msg)
}

// statusWhy reports a status whose phase has a reason: the event reason
// of what failed, for a rollout to tell a failed pull from a failed start.
func (r *Reconciler) statusWhy(name string, rev uint64, phase, reason, msg string) {
	r.reported[name] = true
	if c := r.crashes[name]; reason == "" && c != nil && c.count > 0 {
		reason = c.why // why it was restarted
	}
	nw := r.nets[name]
	r.cfg.Reporter.Report(&edgeboxv1.ObjectStatus{Kind: edgeboxv1.KindWorkload, Name: name, ObservedRevision: rev,
		Phase: phase, Message: msg, UpdatedUnixNano: time.Now().UnixNano(), Release: r.running[name], Health: r.healthOf(name),
		Address: nw.address, Ports: nw.ports, EgressRefused: nw.refused, Restarts: r.restarts(name), Reason: reason})
}

// restarts is how often name was started again since the agent started or
// it last ran steadily.
func (r *Reconciler) restarts(name string) uint32 {
	if c := r.crashes[name]; c != nil {
		return uint32(c.count)
	}
	return 0
}

func (r *Reconciler) event(name, reason, msg string, warning bool) {
	r.cfg.Reporter.Event(&edgeboxv1.Event{TimeUnixNano: time.Now().UnixNano(), Kind: edgeboxv1.KindWorkload, Name: name,
		Reason: reason, Message: msg, Warning: warning})
}
