package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/edgebox/edgebox/agent/localstore"
	"github.com/edgebox/edgebox/agent/runtime"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// A wipe is the console's last word to a box it revokes (AgentService.Wipe):
// the box removes every workload, which gives back the USB keys they held,
// erases its desired state and its identity, and stops for good.
//
// It is crash-safe through wipe.json in the data directory, written before
// anything is erased:
//
//	{"box_id": "…", "state": "wiping" | "wiped", "started_at": …, …}
//
// Every step is idempotent. An agent that starts and finds "wiping" for its
// own identity (or no identity left) finishes the wipe before anything
// else; one that finds "wiped" refuses to run with ErrWiped. A record for
// another box ID is history: the box was enrolled again since, and it is
// removed.
const wipeFile = "wipe.json"

// States of wipe.json.
const (
	wipeRunning = "wiping"
	wipeDone    = "wiped"
)

// Steps of a wipe, in order; Hooks.WipeStep runs after each.
const (
	WipeStepMarked    = "marked"            // wipe.json says "wiping"
	WipeStepDesired   = "desired-erased"    // the local store is gone
	WipeStepWorkloads = "workloads-removed" // every instance and image
	WipeStepIdentity  = "identity-erased"   // key, certificate, CA, identity
)

// Bounds of a wipe.
const (
	// wipeStopTimeout is how long each workload may take to stop before
	// it is killed; workloads stop side by side.
	wipeStopTimeout = 10 * time.Second
	// wipeGrace is how long a wiped agent waits for the console to take
	// its answer and drop the session before it stops on its own.
	wipeGrace   = 10 * time.Second
	maxProblems = 64
	maxReason   = 256
)

// ExitWiped is the exit status of 'edgebox-agent run' on a wiped box, so
// that the service manager does not start it again and again (the systemd
// unit's RestartPreventExitStatus): 78, EX_CONFIG of sysexits.h.
const ExitWiped = 78

// ErrWiped is returned by New and Run for a box its console wiped; the
// error is a *WipedError.
var ErrWiped = errors.New("agent: this box was wiped by its console")

// WipedError says which box was wiped, and when.
type WipedError struct {
	BoxID  string
	At     time.Time
	Reason string
}

func (e *WipedError) Error() string {
	why := ""
	if e.Reason != "" {
		why = " (" + e.Reason + ")"
	}
	return fmt.Sprintf("agent: box %s was wiped by its console at %s%s: its workloads, desired state and identity are gone, "+
		"and it will not run again as that box; to use this machine again, enroll it with a new token: "+
		"'edgebox-agent enroll TOKEN' (or 'edgebox-agent install TOKEN')", e.BoxID, e.At.UTC().Format(time.RFC3339), why)
}

// Is makes errors.Is(err, ErrWiped) hold.
func (e *WipedError) Is(target error) bool { return target == ErrWiped }

// wipeRecord is wipe.json.
type wipeRecord struct {
	BoxID      string    `json:"box_id"`
	State      string    `json:"state"`
	Reason     string    `json:"reason,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	Problems   []string  `json:"problems,omitempty"`
}

func (r wipeRecord) wipedError() *WipedError {
	return &WipedError{BoxID: r.BoxID, At: r.FinishedAt, Reason: r.Reason}
}

// readWipe reads wipe.json; found is false when there is none.
func readWipe(dir string) (rec wipeRecord, found bool, err error) {
	raw, err := os.ReadFile(filepath.Join(dir, wipeFile))
	if errors.Is(err, os.ErrNotExist) {
		return rec, false, nil
	} else if err != nil {
		return rec, false, fmt.Errorf("agent: %s: %w", wipeFile, err)
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		// Torn it cannot be (it is written atomically); a box that finds
		// it unreadable wipes again rather than run as a revoked box.
		return wipeRecord{State: wipeRunning}, true, nil
	}
	return rec, true, nil
}

// writeWipe writes wipe.json and makes it durable.
func writeWipe(dir string, rec wipeRecord) error {
	if err := writeJSON(filepath.Join(dir, wipeFile), rec); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && goruntime.GOOS != "windows" { // Windows cannot sync a directory
		return err
	}
	return nil
}

// pendingWipe decides, for New, what a wipe record in dir means: nil to
// start as usual, a record to finish, or a *WipedError.
func pendingWipe(dir string, log *slog.Logger) (*wipeRecord, error) {
	rec, found, err := readWipe(dir)
	if err != nil || !found {
		return nil, err
	}
	id, idErr := LoadIdentity(dir)
	if idErr == nil && rec.BoxID != "" && id.BoxID != rec.BoxID {
		// Enrolled again since: the workloads and state of the wiped box
		// that a broken wipe left are not desired by the new one, and its
		// reconciler and Sync clean them up.
		log.Warn("a wipe of an earlier identity of this box is history; starting as the box enrolled since",
			"wiped_box", rec.BoxID, "state", rec.State)
		if err := os.Remove(filepath.Join(dir, wipeFile)); err != nil {
			return nil, err
		}
		return nil, nil
	}
	if rec.State == wipeDone {
		return nil, rec.wipedError()
	}
	return &rec, nil
}

// wipeState is an agent's wipe: asked at most once, run by wipeLoop.
type wipeState struct {
	// pending is a wipe New found unfinished; Run finishes it and does
	// nothing else.
	pending *wipeRecord
	once    sync.Once
	asked   chan struct{} // closed when the console asks; reason is set before
	reason  string
	done    chan struct{} // closed when the wipe ended; result is set before
	result  *edgeboxv1.WipeResponse
	// active: the wipe began; status.json is no longer written.
	active atomic.Bool
	// down has a value when the tunnel session went down.
	down chan struct{}
}

func newWipeState() wipeState {
	return wipeState{asked: make(chan struct{}), done: make(chan struct{}), down: make(chan struct{}, 1)}
}

// sessionDown tells a wiped agent that the console dropped its session.
func (w *wipeState) sessionDown() {
	select {
	case w.down <- struct{}{}:
	default:
	}
}

// askWipe serves AgentService.Wipe: it starts the wipe (once) and waits
// for its end, or for the caller to give up; the wipe goes on regardless.
func (a *Agent) askWipe(ctx context.Context, reason string) (*edgeboxv1.WipeResponse, error) {
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	a.wipe.once.Do(func() {
		a.wipe.reason = reason
		close(a.wipe.asked)
	})
	select {
	case <-a.wipe.done:
		return a.wipe.result, nil
	case <-ctx.Done():
		return nil, status.Error(codes.DeadlineExceeded, "the box is still wiping; it finishes on its own, and again at its next start if it is stopped")
	}
}

// wipeLoop waits for the console to ask for a wipe, then stops the parts
// that change the box (stopWork returns once they are stopped) and wipes.
// It closes wipe.done when the wipe ended.
func (a *Agent) wipeLoop(ctx context.Context, stopWork func()) {
	select {
	case <-ctx.Done():
		return
	case <-a.wipe.asked:
	}
	a.wipe.active.Store(true)
	a.log.Warn("the console asked this box to wipe itself: removing every workload, the desired state and the identity",
		"reason", a.wipe.reason)
	rec := wipeRecord{BoxID: a.creds.BoxID, State: wipeRunning, Reason: a.wipe.reason, StartedAt: time.Now().UTC()}
	var res *edgeboxv1.WipeResponse
	if err := writeWipe(a.cfg.DataDir, rec); err != nil {
		res = &edgeboxv1.WipeResponse{Problems: []string{"recording the wipe: " + err.Error()}}
	} else {
		stopWork()
		res = wipe(ctx, a.cfg, a.log, &rec, a.local)
	}
	a.wipe.result = res
	close(a.wipe.done)
}

// afterWipe lets the console take the answer and drop the session, then
// returns so Run stops.
func (a *Agent) afterWipe(ctx context.Context) {
	if !a.Status().Connected {
		return
	}
	t := time.NewTimer(wipeGrace)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-a.wipe.down:
	case <-t.C:
	}
}

// wipeErr is what Run returns after a wipe ended.
func (a *Agent) wipeErr() error {
	res := a.wipe.result
	if res.GetWiped() {
		rec, _, _ := readWipe(a.cfg.DataDir)
		return rec.wipedError()
	}
	return fmt.Errorf("agent: the console asked this box to wipe itself, and the wipe is not finished: %v; "+
		"it is tried again at the next start", res.GetProblems())
}

// finishWipe is Run for an agent that New found part way through a wipe.
func (a *Agent) finishWipe(ctx context.Context) error {
	rec := a.wipe.pending
	a.log.Warn("finishing the wipe the console asked for before this agent stopped",
		"wiped_box", rec.BoxID, "started_at", rec.StartedAt)
	res := wipe(ctx, a.cfg, a.log, rec, nil)
	if res.GetWiped() {
		return rec.wipedError()
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("agent: the wipe the console asked for is not finished: %v; it is tried again at the next start", res.GetProblems())
}

// wipe does every step of a wipe that rec records as begun: it erases the
// desired state (closing local first when it is open), removes every
// instance and image of every driver, erases the identity, and records
// the result. Each step is idempotent; a hook may stop the wipe after
// any of them, as a kill would.
func wipe(ctx context.Context, cfg Config, log *slog.Logger, rec *wipeRecord,
	local *localstore.Store) *edgeboxv1.WipeResponse {
	res := &edgeboxv1.WipeResponse{}
	problem := func(format string, args ...any) {
		if len(res.Problems) < maxProblems {
			p := fmt.Sprintf(format, args...)
			if len(p) > 1024 {
				p = p[:1024]
			}
			res.Problems = append(res.Problems, p)
		}
	}
	step := func(name string) bool {
		if h := cfg.Hooks.WipeStep; h != nil {
			if err := h(name); err != nil {
				problem("stopped after %s: %v", name, err)
				return false
			}
		}
		return true
	}
	if !step(WipeStepMarked) {
		return res
	}

	// The leases, to say which keys are free once their workloads are gone.
	leases := map[string]string{} // key ID -> workload
	if local != nil {
		if objs, err := local.Objects(edgeboxv1.KindUsbAssignment); err == nil {
			for _, o := range objs {
				if u := o.GetUsbAssignment(); u != nil {
					leases[u.GetKeyId()] = u.GetWorkload()
				}
			}
		}
		local.Close()
	}
	for _, f := range []string{"agent.db", "images.json"} {
		if err := os.Remove(filepath.Join(cfg.DataDir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			problem("erasing the desired state: %v", err)
		}
	}
	if !step(WipeStepDesired) {
		return res
	}

	removed, left := removeEverything(ctx, cfg.Drivers, problem)
	res.WorkloadsRemoved = removed
	for key, w := range leases {
		if !left[w] {
			res.KeysReleased = append(res.KeysReleased, key)
		}
	}
	sort.Strings(res.KeysReleased)
	if ctx.Err() != nil {
		problem("stopped: %v", ctx.Err())
		return res
	}
	if !step(WipeStepWorkloads) {
		return res
	}

	// The identity, secret first. A wiped box never runs as itself again,
	// whatever else is left.
	for _, f := range []string{keyFile, keyFile + ".new", certFile, certFile + ".new", caFile, statusFile, identityFile} {
		if err := os.Remove(filepath.Join(cfg.DataDir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			problem("erasing the identity: %v", err)
		}
	}
	if err := syncDir(cfg.DataDir); err != nil {
		problem("erasing the identity: %v", err)
	}
	if !step(WipeStepIdentity) {
		return res
	}

	rec.Problems = res.Problems
	if len(res.Problems) == 0 {
		rec.State, rec.FinishedAt = wipeDone, time.Now().UTC()
	}
	if err := writeWipe(cfg.DataDir, *rec); err != nil {
		problem("recording the wipe: %v", err)
		return res
	}
	res.Wiped = len(res.Problems) == 0
	if !res.Wiped {
		log.Warn("the wipe is not finished; it is tried again at the next start", "problems", res.Problems)
	}
	return res
}

// removeEverything stops and removes every instance of every driver,
// side by side, then sweeps what no instance holds (runtime.Sweeper) and
// removes every image; it returns the workloads removed and those still
// there.
func removeEverything(ctx context.Context, drivers []runtime.Driver, problem func(string, ...any)) (removed []string, left map[string]bool) {
	var (
		mu sync.Mutex // guards removed, problem
		wg sync.WaitGroup
	)
	for _, d := range drivers {
		insts, err := d.List(ctx)
		if err != nil {
			mu.Lock()
			problem("listing %s workloads: %v", d.Runtime(), err)
			mu.Unlock()
			continue
		}
		for _, in := range insts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := removeInstance(ctx, d, in.Name)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					problem("removing workload %s (%s): %v", in.Name, d.Runtime(), err)
					return
				}
				removed = append(removed, in.Name)
			}()
		}
	}
	wg.Wait()
	left = map[string]bool{}
	for _, d := range drivers {
		// What a killed agent left half made, or running in no instance.
		if sw, ok := d.(runtime.Sweeper); ok {
			orphans, err := sw.Sweep(ctx)
			if err != nil {
				problem("sweeping %s orphans: %v", d.Runtime(), err)
			}
			for _, o := range orphans {
				if o.Name != "" && !slices.Contains(removed, o.Name) {
					removed = append(removed, o.Name)
				}
			}
		}
		insts, err := d.List(ctx)
		if err != nil {
			problem("listing %s workloads: %v", d.Runtime(), err)
			continue
		}
		for _, in := range insts {
			left[in.Name] = true
		}
		if is, ok := d.(runtime.ImageStore); ok {
			refs, err := is.Images(ctx)
			if err != nil {
				problem("listing %s images: %v", d.Runtime(), err)
			}
			for _, ref := range refs {
				if err := is.RemoveImage(ctx, ref); err != nil {
					problem("removing image %s: %v", ref, err)
				}
			}
		}
	}
	for name := range left {
		problem("workload %s is still there", name)
	}
	sort.Strings(removed)
	return removed, left
}

// removeInstance stops and removes one instance. A program that was just
// killed may still be leaving (its exit being written down, its files let
// go): a failed removal is tried again a few times before it counts.
func removeInstance(ctx context.Context, d runtime.Driver, name string) error {
	var err error
	for try := range 3 {
		if try > 0 {
			select {
			case <-ctx.Done():
				return err
			case <-time.After(time.Duration(try) * 250 * time.Millisecond):
			}
		}
		if err = d.Stop(ctx, name, wipeStopTimeout); err != nil {
			continue
		}
		if err = d.Remove(ctx, name); err == nil {
			return nil
		}
	}
	return err
}

// wipedStatus is ReadStatus's answer for a data directory without an
// identity: ErrNotEnrolled, or the *WipedError of a wiped box.
func wipedStatus(dir string) error {
	if rec, found, _ := readWipe(dir); found && rec.State == wipeDone {
		return rec.wipedError()
	}
	return ErrNotEnrolled
}

// Wipe serves AgentService.Wipe.
func (s *agentService) Wipe(ctx context.Context, r *edgeboxv1.WipeRequest) (*edgeboxv1.WipeResponse, error) {
	if s.wipe == nil {
		return nil, status.Error(codes.Unimplemented, "this agent cannot wipe its box")
	}
	return s.wipe(ctx, r.GetReason())
}
