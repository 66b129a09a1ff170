package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/edgebox/edgebox/agent/update"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// ErrRestart is what Run returns when the agent staged a new version of
// itself: the process is to end with update.ExitRestart (under the
// launcher), or start again as the launcher (the installed binary's first
// update).
var ErrRestart = errors.New("agent: a new agent version is staged; start again to run it")

// UpdateDir is where a box whose data directory is dataDir keeps its
// agent versions (package update).
func UpdateDir(dataDir string) string { return filepath.Join(dataDir, "update") }

// AgentBinaryPath is the path under which the console serves agent
// binaries to boxes, on their tunnel's registry streams.
func AgentBinaryPath(version, goos, goarch string) string {
	return "/edgebox/agent/" + url.PathEscape(version) + "/" + goos + "-" + goarch
}

// selfUpdate acts on the box's AgentRelease object: it stages the version
// it names and asks for a restart, reports the version's state, and marks
// a version on probation healthy once it reached the console, said hello
// and took its desired state.
type selfUpdate struct {
	a        *Agent
	dir      string
	trial    string // the version on probation, in its own process
	reported string // the object whose status was reported
	pending  bool   // what was reported last is pending: on probation, or staging
	healthy  bool
	// failed are the objects (version, digest, revision) whose staging
	// failed, and when to try again: a cut download after a minute; a
	// signature that does not verify, or a version refused, not until the
	// console sends another object.
	failed  map[string]time.Time
	restart func()
}

// kickUpdate has the update loop look now: the desired state or the
// session changed.
func (a *Agent) kickUpdate() {
	select {
	case a.updateKick <- struct{}{}:
	default:
	}
}

func (a *Agent) updateLoop(ctx context.Context, restart func()) {
	u := &selfUpdate{a: a, dir: UpdateDir(a.cfg.DataDir), trial: os.Getenv(update.EnvTrial), failed: map[string]time.Time{}, restart: restart}
	for {
		u.check(ctx)
		// A change of the desired state or of the session kicks the loop;
		// between kicks it looks every 2 s only while a new version is on
		// probation or its status is pending (the launcher adopts it at
		// the end of its probation), else every minute (a failed fetch is
		// tried again after one). Looking every 2 s read the local store
		// of every box in the fleet for nothing.
		every := time.Minute
		if u.pending || u.trial != "" && u.trial == a.cfg.Version && !u.healthy {
			every = 2 * time.Second
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-a.updateKick:
		case <-t.C:
		}
		t.Stop()
	}
}

func (u *selfUpdate) check(ctx context.Context) {
	a := u.a
	onTrial := u.trial != "" && u.trial == a.cfg.Version
	if onTrial && !u.healthy && a.healthyNow() {
		if err := update.MarkHealthy(u.dir, a.cfg.Version); err != nil {
			a.log.Warn("marking the new agent healthy", "err", err)
		} else {
			u.healthy = true
			a.log.Info("new agent version healthy: it reached the console and took its desired state", "version", a.cfg.Version)
		}
	}
	u.pending = false
	objs, err := a.local.Objects(edgeboxv1.KindAgentRelease)
	if err != nil || len(objs) == 0 {
		if u.reported != "" {
			a.reports.Report(&edgeboxv1.ObjectStatus{Kind: edgeboxv1.KindAgentRelease, Name: u.reported, Phase: edgeboxv1.PhaseRemoved})
			u.reported = ""
		}
		return
	}
	o := objs[0]
	rel := o.GetAgentRelease()
	report := func(phase, reason, msg string) {
		u.reported, u.pending = o.GetName(), phase == edgeboxv1.PhasePending
		a.reports.Report(&edgeboxv1.ObjectStatus{Kind: edgeboxv1.KindAgentRelease, Name: o.GetName(), ObservedRevision: o.GetRevision(),
			Phase: phase, Reason: reason, Message: msg, Release: a.cfg.Version, UpdatedUnixNano: time.Now().UnixNano()})
	}
	st, err := update.Load(u.dir)
	if err != nil {
		report(edgeboxv1.PhaseFailed, "", err.Error())
		return
	}
	want := rel.GetVersion()
	if want == a.cfg.Version {
		if st.Trial != nil && st.Trial.Version == want {
			report(edgeboxv1.PhasePending, "", fmt.Sprintf("on probation until %s", st.Trial.Since.Add(st.Trial.Probation).UTC().Format(time.RFC3339)))
			return
		}
		report(edgeboxv1.PhaseRunning, "", "")
		return
	}
	if r, ok := st.RefusedVersion(want); ok {
		report(edgeboxv1.PhaseFailed, "Refused", fmt.Sprintf("agent %s failed on this box at %s and is not tried again: %s", want, r.At.Format(time.RFC3339), r.Why))
		return
	}
	key := fmt.Sprintf("%s@%s@%d", want, rel.GetSha256(), o.GetRevision())
	if retry, ok := u.failed[key]; ok && time.Now().Before(retry) {
		return // its status says why
	}
	report(edgeboxv1.PhasePending, "", "fetching agent "+want)
	err = update.Stage(ctx, u.dir, a.cfg.Version, update.Release{Version: want, SHA256: rel.GetSha256(), Signature: rel.GetSignature(),
		Probation: time.Duration(rel.GetProbationSeconds()) * time.Second}, u.fetch(want), u.verify)
	if err != nil {
		reason, retry := edgeboxv1.ReasonPullFailed, time.Now().Add(time.Minute)
		switch {
		case errdefs.Kind(err) == errdefs.ErrPermission:
			reason, retry = "SignatureInvalid", time.Now().Add(100*365*24*time.Hour)
		case errors.Is(err, update.ErrRefused):
			reason, retry = "Refused", time.Now().Add(100*365*24*time.Hour)
		}
		u.failed[key] = retry
		a.log.Warn("new agent version not staged", "version", want, "err", err)
		report(edgeboxv1.PhaseFailed, reason, err.Error())
		return
	}
	report(edgeboxv1.PhasePending, "", "restarting into agent "+want)
	a.log.Info("new agent version staged; restarting into it", "version", want, "running", a.cfg.Version)
	u.restart()
}

// verify checks a release's signature with the pinned CA.
func (u *selfUpdate) verify(rel update.Release) error {
	return update.Verify(u.a.creds.caKey, rel, runtime.GOOS, runtime.GOARCH)
}

// fetch downloads version's binary for this platform from the console,
// through the tunnel.
func (u *selfUpdate) fetch(version string) func(ctx context.Context, w io.Writer) error {
	return func(ctx context.Context, w io.Writer) error {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+u.a.consoleHost+AgentBinaryPath(version, runtime.GOOS, runtime.GOARCH), nil)
		if err != nil {
			return err
		}
		resp, err := u.a.registry.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			return fmt.Errorf("the console answered %s: %s", resp.Status, b)
		}
		_, err = io.Copy(w, resp.Body)
		return err
	}
}

// healthyNow reports whether the agent reached the console, which
// answered its hello as an approved box, and took its desired state on
// this connection.
func (a *Agent) healthyNow() bool {
	s := a.Status()
	synced := a.syncedAt.Load()
	return s.Greeted() && s.Approved && synced != 0 && !time.Unix(0, synced).Before(s.Since)
}
