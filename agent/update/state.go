// Package update is how a box runs a new version of its agent, and goes
// back to the old one by itself when the new one fails.
//
// The installed binary is the box's boot loader. Once the box has taken an
// update, 'edgebox-agent run' launches (Launcher) the version to run as a
// child process: the adopted one (Current), or a new one on probation
// (Trial). A trial has a start counter, written before each start, so it
// survives crash loops and power cuts; a trial that exits MaxStarts times,
// or does not report healthy (it reached the console, said hello and took
// its desired state) by the end of its probation, is stopped and refused:
// the box goes back to the version it ran and never tries that one again
// by itself. The old binaries stay on disk, so going back needs no
// download. Workloads keep running all along: they are not the agent's
// children.
//
// Layout under <data>/update:
//
//	state.json               State, written synced
//	bin/<version>/<binary>   the versions the box holds
//	reported-healthy         the version of a trial that reported healthy
package update

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/edgebox/edgebox/internal/atomicfile"
)

// State is what the box holds of its agent's versions.
type State struct {
	// Installed is the version of the installed binary.
	Installed string `json:"installed,omitempty"`
	// Current is the adopted version; "" or Installed runs the installed
	// binary. Previous is the one adopted before it.
	Current  string `json:"current,omitempty"`
	Previous string `json:"previous,omitempty"`
	// Trial is a version on probation, if any.
	Trial   *Trial    `json:"trial,omitempty"`
	Refused []Refusal `json:"refused,omitempty"`
}

// Trial is a version on probation.
type Trial struct {
	Version string `json:"version"`
	// Starts counts its starts, written before each.
	Starts int `json:"starts"`
	// Since is its first start; Probation runs from then.
	Since     time.Time     `json:"since,omitzero"`
	Probation time.Duration `json:"probation"`
}

// Refusal is a version that failed on this box, and is not tried again.
type Refusal struct {
	Version string    `json:"version"`
	Why     string    `json:"why"`
	At      time.Time `json:"at"`
}

// Bounds.
const (
	// MaxStarts is how often a trial may start before it is refused.
	MaxStarts = 3
	// DefaultProbation is a trial's probation unless the release says.
	DefaultProbation = 10 * time.Minute
	maxRefused       = 32
)

// ExitRestart is the exit code of an agent that staged a new version and
// asks its launcher to start the version to run now.
const ExitRestart = 75

// Environment of a launched agent.
const (
	// EnvChild marks an agent its launcher started.
	EnvChild = "EDGEBOX_AGENT_CHILD"
	// EnvTrial names the version on probation, in the agent of that
	// version.
	EnvTrial = "EDGEBOX_AGENT_TRIAL"
)

var versionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}$`)

// ValidVersion reports whether v may name an agent version (and a
// directory).
func ValidVersion(v string) bool { return versionRE.MatchString(v) }

func statePath(dir string) string { return filepath.Join(dir, "state.json") }

// BinaryName is the agent binary's file name on this OS.
func BinaryName() string {
	if runtime.GOOS == "windows" {
		return "edgebox-agent.exe"
	}
	return "edgebox-agent"
}

// BinaryPath is where the box keeps version's binary.
func BinaryPath(dir, version string) string {
	return filepath.Join(dir, "bin", version, BinaryName())
}

// Load reads the state in dir; none there is the zero State.
func Load(dir string) (State, error) {
	var s State
	raw, err := os.ReadFile(statePath(dir))
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	} else if err != nil {
		return s, err
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return State{}, fmt.Errorf("update: %s: %w", statePath(dir), err)
	}
	return s, nil
}

// Save writes s, synced: a start counter must count a start the power
// cut short.
func (s State) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(statePath(dir), raw)
}

// Launched reports whether the box runs its agent under the launcher:
// it adopted or tries a version other than the installed one.
func (s State) Launched() bool {
	return s.Trial != nil || (s.Current != "" && s.Current != s.Installed)
}

// RefusedVersion returns why version was refused on this box, if it was.
func (s State) RefusedVersion(version string) (Refusal, bool) {
	for _, r := range s.Refused {
		if r.Version == version {
			return r, true
		}
	}
	return Refusal{}, false
}

// refuse records that the trial failed, and drops it.
func (s *State) refuse(why string, at time.Time) {
	if s.Trial == nil {
		return
	}
	s.Refused = append(s.Refused, Refusal{Version: s.Trial.Version, Why: why, At: at.UTC()})
	if n := len(s.Refused); n > maxRefused {
		s.Refused = slices.Clone(s.Refused[n-maxRefused:])
	}
	s.Trial = nil
}

// adopt makes the trial the current version.
func (s *State) adopt() {
	if s.Trial == nil {
		return
	}
	if s.Current != s.Trial.Version {
		s.Previous, s.Current = s.current(), s.Trial.Version
	}
	s.Trial = nil
}

// current is the version run now when no trial runs.
func (s State) current() string {
	if s.Current != "" {
		return s.Current
	}
	return s.Installed
}

// Running is the version the box runs when no trial runs.
func (s State) Running() string { return s.current() }

// path is the binary of version: the installed one for Installed.
func (s State) path(dir, installed, version string) string {
	if version == "" || version == s.Installed {
		return installed
	}
	return BinaryPath(dir, version)
}

// Prune removes the binaries of versions the box no longer needs: all
// but Current, Previous and the trial.
func (s State) Prune(dir string) error {
	keep := map[string]bool{s.Current: true, s.Previous: true}
	if s.Trial != nil {
		keep[s.Trial.Version] = true
	}
	ents, err := os.ReadDir(filepath.Join(dir, "bin"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if !keep[e.Name()] && !strings.HasPrefix(e.Name(), ".") {
			errs = append(errs, os.RemoveAll(filepath.Join(dir, "bin", e.Name())))
		}
	}
	return errors.Join(errs...)
}

// healthyPath is the file a trial writes once it reported healthy.
func healthyPath(dir string) string { return filepath.Join(dir, "reported-healthy") }

// MarkHealthy records that the trial of version reached its console,
// said hello and took its desired state.
func MarkHealthy(dir, version string) error {
	return atomicfile.Write(healthyPath(dir), []byte(version))
}

// reportedHealthy reports whether the trial of version marked itself
// healthy.
func reportedHealthy(dir, version string) bool {
	b, err := os.ReadFile(healthyPath(dir))
	return err == nil && string(b) == version
}
