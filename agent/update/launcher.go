package update

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"time"
)

// Launcher runs the agent version the box should run as a child process,
// and takes a trial through its probation.
type Launcher struct {
	// Dir is the update directory (<data>/update).
	Dir string
	// Installed is the path of the installed binary.
	Installed string
	// Args are the child's arguments ("run", "--data", ...); Env is added
	// to the launcher's environment for it.
	Args []string
	Env  []string
	// Stdout and Stderr take the child's output; nil discards it.
	Stdout, Stderr io.Writer
	Log            *slog.Logger
	// Now tells the time; nil is time.Now.
	Now func() time.Time
	// Backoff is the wait between two starts of a trial that exited
	// (1 s when zero).
	Backoff time.Duration
	// StopTimeout is how long a child may take to stop before it is
	// killed (10 s when zero).
	StopTimeout time.Duration
}

func (l *Launcher) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

// Run launches the agent until ctx ends, and returns nil then. It returns
// an error when the version the box adopted exits by itself: the service
// manager then starts the launcher again.
func (l *Launcher) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		st, err := Load(l.Dir)
		if err != nil {
			// A damaged state runs the installed binary, the safe side.
			l.Log.Error("agent update state; running the installed agent", "err", err)
			st = State{}
		}
		version, trial := st.current(), st.Trial
		if trial != nil {
			now := l.now()
			switch {
			case trial.Starts >= MaxStarts:
				st.refuse(fmt.Sprintf("it exited %d times within its probation", trial.Starts), now)
				l.Log.Error("agent version refused: it kept exiting; back to the version it replaced", "version", trial.Version, "back_to", st.current())
				if err := st.Save(l.Dir); err != nil {
					return err
				}
				continue
			case !trial.Since.IsZero() && !now.Before(trial.Since.Add(trial.Probation)):
				if err := l.endProbation(&st); err != nil {
					return err
				}
				continue
			}
			trial.Starts++
			if trial.Since.IsZero() {
				trial.Since = now
			}
			// Counted before the start: a crash loop cannot outrun it.
			if err := st.Save(l.Dir); err != nil {
				return err
			}
			version = trial.Version
		}
		bin := st.path(l.Dir, l.Installed, version)
		l.Log.Info("starting the agent", "version", version, "binary", bin, "trial", trial != nil)
		restart, err := l.runChild(ctx, bin, trial)
		switch {
		case ctx.Err() != nil:
			return nil
		case restart:
		case trial != nil:
			l.Log.Warn("agent on probation exited", "version", version, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(max(l.Backoff, time.Second)):
			}
		case err != nil:
			return fmt.Errorf("agent %s: %w", version, err)
		default:
			return fmt.Errorf("agent %s exited", version)
		}
	}
	return nil
}

// endProbation adopts a trial that reported healthy, or refuses it, and
// saves the outcome. The marker and the old binaries go only once the
// outcome is on disk: a box killed in between adopts again at its next
// start, never refuses a version that was healthy.
func (l *Launcher) endProbation(st *State) error {
	v := st.Trial.Version
	if !reportedHealthy(l.Dir, v) {
		st.refuse(fmt.Sprintf("it did not reach the console and report healthy within its probation of %s", st.Trial.Probation), l.now())
		l.Log.Error("agent version refused: not healthy within its probation; back to the version it replaced", "version", v, "back_to", st.current())
		return st.Save(l.Dir)
	}
	st.adopt()
	if err := st.Save(l.Dir); err != nil {
		return err
	}
	l.Log.Info("agent version adopted after its probation", "version", v, "previous", st.Previous)
	os.Remove(healthyPath(l.Dir))
	if err := st.Prune(l.Dir); err != nil {
		l.Log.Warn("removing old agent binaries", "err", err)
	}
	return nil
}

// runChild runs bin until it exits or ctx ends. For a trial, it ends the
// probation on time: a healthy trial is adopted and runs on; another is
// stopped and refused. restart says the child asked to be started again
// (it staged a new version), or was stopped at the end of its probation.
func (l *Launcher) runChild(ctx context.Context, bin string, trial *Trial) (restart bool, err error) {
	cmd := exec.Command(bin, l.Args...)
	cmd.Env = append(append(os.Environ(), l.Env...), EnvChild+"=1")
	if trial != nil {
		cmd.Env = append(cmd.Env, EnvTrial+"="+trial.Version)
	}
	cmd.Stdout, cmd.Stderr = l.Stdout, l.Stderr
	exited, err := start(cmd)
	if err != nil {
		return false, fmt.Errorf("starting %s: %w", bin, err)
	}
	var probation <-chan time.Time
	if trial != nil {
		t := time.NewTimer(max(trial.Since.Add(trial.Probation).Sub(l.now()), 0))
		defer t.Stop()
		probation = t.C
	}
	for {
		select {
		case err := <-exited:
			var ee *exec.ExitError
			if errors.As(err, &ee) && ee.ExitCode() == ExitRestart {
				return true, nil
			}
			if err == nil {
				err = errors.New("exited with code 0")
			}
			return false, err
		case <-ctx.Done():
			l.stop(cmd, exited)
			return false, nil
		case <-probation:
			probation = nil
			st, err := Load(l.Dir)
			if err != nil || st.Trial == nil || st.Trial.Version != trial.Version {
				l.stop(cmd, exited)
				return true, err
			}
			healthy := reportedHealthy(l.Dir, trial.Version)
			if err := l.endProbation(&st); err != nil {
				l.stop(cmd, exited)
				return false, err
			}
			if !healthy {
				l.stop(cmd, exited)
				return true, nil
			}
			// Adopted: it runs on, no longer on probation.
		}
	}
}

// stop asks the child to stop, and kills it after StopTimeout.
func (l *Launcher) stop(cmd *exec.Cmd, exited <-chan error) {
	terminate(cmd.Process)
	timeout := l.StopTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	select {
	case <-exited:
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-exited
	}
}
