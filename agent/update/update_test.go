//go:build linux

package update

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/errdefs"
)

// script writes an executable shell script that stands in for a version
// of the agent: it appends "<name> <trial>" to the runs file, then does
// what body says.
func script(t *testing.T, path, name, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	s := "#!/bin/sh\necho \"" + name + " $" + EnvTrial + "\" >> \"$RUNS\"\n" + body + "\n"
	if err := os.WriteFile(path, []byte(s), 0o755); err != nil {
		t.Fatal(err)
	}
}

// Bodies of the stand-ins.
const (
	runs    = "exec sleep 600"                                                       // runs until stopped
	healthy = "printf %s \"$" + EnvTrial + "\" > \"$DIR/reported-healthy\"\n" + runs // reports healthy, runs
	dies    = "exit 3"                                                               // exits at once
)

type rig struct {
	t         *testing.T
	dir       string
	installed string
	runsFile  string
	cancel    context.CancelFunc
	done      chan error
}

func newRig(t *testing.T, installedBody string) *rig {
	base := t.TempDir()
	r := &rig{t: t, dir: filepath.Join(base, "update"), installed: filepath.Join(base, "edgebox-agent"), runsFile: filepath.Join(base, "runs")}
	script(t, r.installed, "installed", installedBody)
	return r
}

func (r *rig) start() {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan error, 1)
	l := &Launcher{Dir: r.dir, Installed: r.installed, Args: []string{"run"}, Env: []string{"RUNS=" + r.runsFile, "DIR=" + r.dir},
		Log: slog.New(slog.DiscardHandler), Backoff: 10 * time.Millisecond, StopTimeout: 2 * time.Second}
	go func() { r.done <- l.Run(ctx) }()
	r.t.Cleanup(r.stop)
}

func (r *rig) stop() {
	if r.cancel != nil {
		r.cancel()
		if err := <-r.done; err != nil {
			r.t.Errorf("launcher: %v", err)
		}
		r.cancel = nil
	}
}

func (r *rig) runLines() []string {
	b, _ := os.ReadFile(r.runsFile)
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func (r *rig) waitState(what string, ok func(State) bool) State {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := Load(r.dir)
		if err == nil && ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: not within 10 s; state %+v, runs %q", what, st, r.runLines())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stage records a trial of version, its binary a stand-in doing body.
func (r *rig) stage(version, body string, probation time.Duration) {
	r.t.Helper()
	script(r.t, BinaryPath(r.dir, version), version, body)
	st, _ := Load(r.dir)
	st.Installed = "1.0.0"
	st.Trial = &Trial{Version: version, Probation: probation}
	if err := st.Save(r.dir); err != nil {
		r.t.Fatal(err)
	}
}

func TestAHealthyVersionIsAdoptedAfterItsProbation(t *testing.T) {
	r := newRig(t, runs)
	r.stage("2.0.0", healthy, 500*time.Millisecond)
	r.start()
	st := r.waitState("2.0.0 adopted", func(s State) bool { return s.Current == "2.0.0" && s.Trial == nil })
	if st.Previous != "1.0.0" || len(st.Refused) != 0 {
		t.Errorf("state after adoption: %+v", st)
	}
	time.Sleep(200 * time.Millisecond)
	if lines := r.runLines(); len(lines) != 1 || lines[0] != "2.0.0 2.0.0" {
		t.Errorf("runs %q: want 2.0.0 started once, on trial, and left running when adopted", lines)
	}
	// Started again (a reboot): the adopted version runs, not on trial.
	r.stop()
	r.start()
	r.waitState("a second start", func(State) bool { return len(r.runLines()) == 2 })
	if lines := r.runLines(); lines[1] != "2.0.0" {
		t.Errorf("after a restart: %q", lines)
	}
}

func TestAVersionThatExitsIsRefusedWithinItsStartCounter(t *testing.T) {
	r := newRig(t, runs)
	r.stage("2.0.0", dies, time.Hour)
	r.start()
	st := r.waitState("2.0.0 refused", func(s State) bool { return s.Trial == nil && len(s.Refused) == 1 })
	if st.Refused[0].Version != "2.0.0" || !strings.Contains(st.Refused[0].Why, "exited 3 times") || st.Current != "" {
		t.Errorf("state: %+v", st)
	}
	r.waitState("back on the installed agent", func(State) bool {
		l := r.runLines()
		return len(l) == MaxStarts+1 && l[MaxStarts] == "installed"
	})
	// Not tried again: a stage of it is refused.
	err := Stage(context.Background(), r.dir, "1.0.0", Release{Version: "2.0.0"}, nil, nil)
	if !errors.Is(err, ErrRefused) {
		t.Errorf("staging a refused version: %v", err)
	}
}

func TestAVersionThatNeverReportsHealthyIsRefusedAfterItsProbation(t *testing.T) {
	r := newRig(t, runs)
	r.stage("2.0.0", runs, 400*time.Millisecond) // runs, never reaches the console
	r.start()
	st := r.waitState("2.0.0 refused", func(s State) bool { return s.Trial == nil && len(s.Refused) == 1 })
	if !strings.Contains(st.Refused[0].Why, "did not reach the console") {
		t.Errorf("refusal: %+v", st.Refused[0])
	}
	r.waitState("back on the installed agent", func(State) bool {
		l := r.runLines()
		return len(l) == 2 && l[0] == "2.0.0 2.0.0" && l[1] == "installed"
	})
}

// TestAStartCounterSurvivesALauncherKilledMidTrial: the start count is on
// disk before each start, so a launcher killed and started again over
// and over (a box that loses power) still refuses a version that never
// gets through.
func TestAStartCounterSurvivesALauncherKilledMidTrial(t *testing.T) {
	r := newRig(t, runs)
	r.stage("2.0.0", runs, time.Hour)
	for i := range MaxStarts {
		r.start()
		r.waitState("start counted", func(s State) bool { return s.Trial != nil && s.Trial.Starts == i+1 })
		r.stop()
	}
	r.start()
	r.waitState("refused at the next launch", func(s State) bool { return s.Trial == nil && len(s.Refused) == 1 })
}

// TestAnAgentThatStagedAVersionIsRestartedIntoIt: the running agent exits
// with ExitRestart once it staged a version; the launcher starts it.
func TestAnAgentThatStagedAVersionIsRestartedIntoIt(t *testing.T) {
	r := newRig(t, "")
	script(t, r.installed, "installed", `[ -e "$DIR/staged" ] && exec sleep 600
touch "$DIR/staged"
`+"cat > \"$DIR/state.json\" <<EOF\n{\"installed\":\"1.0.0\",\"current\":\"1.0.0\",\"trial\":{\"version\":\"2.0.0\",\"probation\":600000000000}}\nEOF\nexit 75")
	script(t, BinaryPath(r.dir, "2.0.0"), "2.0.0", healthy)
	os.MkdirAll(r.dir, 0o755)
	st := State{Installed: "1.0.0", Current: "1.0.0"}
	st.Save(r.dir)
	r.start()
	r.waitState("2.0.0 on trial", func(State) bool {
		l := r.runLines()
		return len(l) == 2 && l[1] == "2.0.0 2.0.0"
	})
}

func TestStageChecksDigestAndSignature(t *testing.T) {
	dir := t.TempDir()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	bin := []byte("#!/bin/sh\nexit 0\n")
	sum := sha256.Sum256(bin)
	rel := Release{Version: "2.0.0", SHA256: hex.EncodeToString(sum[:])}
	d := sha256.Sum256(SignedMessage(rel.Version, "linux", "amd64", rel.SHA256))
	rel.Signature, _ = ecdsa.SignASN1(rand.Reader, key, d[:])
	fetches := 0
	fetch := func(_ context.Context, w io.Writer) error { fetches++; _, err := w.Write(bin); return err }
	verify := func(r Release) error { return Verify(&key.PublicKey, r, "linux", "amd64") }

	forged := rel
	forged.Signature = append([]byte(nil), rel.Signature...)
	forged.Signature[len(forged.Signature)-1] ^= 1
	if err := Stage(context.Background(), dir, "1.0.0", forged, fetch, verify); errdefs.Kind(err) != errdefs.ErrPermission || fetches != 0 {
		t.Fatalf("a forged signature: %v, %d fetches", err, fetches)
	}
	other := rel
	other.Version = "2.0.1" // signed for 2.0.0
	if err := Stage(context.Background(), dir, "1.0.0", other, fetch, verify); err == nil {
		t.Fatal("a signature of another version was taken")
	}
	wrong := rel
	wrong.SHA256 = strings.Repeat("0", 64)
	d2 := sha256.Sum256(SignedMessage(wrong.Version, "linux", "amd64", wrong.SHA256))
	wrong.Signature, _ = ecdsa.SignASN1(rand.Reader, key, d2[:])
	if err := Stage(context.Background(), dir, "1.0.0", wrong, fetch, verify); err == nil || !strings.Contains(err.Error(), "digest") {
		t.Fatalf("a binary of another digest: %v", err)
	}
	if _, err := os.Stat(BinaryPath(dir, "2.0.0")); err == nil {
		t.Fatal("a binary that failed its check was kept")
	}
	if err := Stage(context.Background(), dir, "1.0.0", rel, fetch, verify); err != nil {
		t.Fatal(err)
	}
	st, _ := Load(dir)
	if st.Trial == nil || st.Trial.Version != "2.0.0" || st.Installed != "1.0.0" || st.Trial.Probation != DefaultProbation {
		t.Fatalf("state: %+v", st)
	}
	got, _ := os.ReadFile(BinaryPath(dir, "2.0.0"))
	if !bytes.Equal(got, bin) {
		t.Error("the staged binary differs")
	}
	// Held: staged again with no download.
	n := fetches
	if err := Stage(context.Background(), dir, "1.0.0", rel, fetch, verify); err != nil || fetches != n {
		t.Errorf("staging a held version: %v, %d more fetches", err, fetches-n)
	}
}
