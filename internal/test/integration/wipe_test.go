//go:build linux

package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/process"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/require"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/tunnel"
	"github.com/edgebox/edgebox/usbhub"
)

// wipeBox is a box running a native workload that holds a leased
// simulated key, for the wipe tests.
type wipeBox struct {
	box     testenv.Box
	key     api.Key
	node    string // the key's device node
	mark    string // in the command line of every process of the workload
	uid     int    // the workload's user
	drivers func() []runtime.Driver
	devRoot string
	// ran has what the agent's Run returned, once it did.
	ran <-chan error
}

// startWipeBox enrolls a box whose agent runs with the process driver
// (real processes, under users of their own from firstUID) and a
// simulated key with a device node, leases the key to workload "robot",
// runs it, and waits until the workload holds the key.
func startWipeBox(t *testing.T, h *testenv.InProcess, name string, firstUID int, hooks agent.Hooks) wipeBox {
	t.Helper()
	require.Root(t, "the process driver, which runs workloads under users of their own,")
	w := wipeBox{box: enrollOne(t, h, name), devRoot: t.TempDir()}
	// The box's /dev/bus/usb: a node for the device number the hub gives.
	os.MkdirAll(filepath.Join(w.devRoot, "001"), 0o755)
	w.node = filepath.Join(w.devRoot, "001", "002")
	if err := unix.Mknod(w.node, unix.S_IFCHR|0o660, int(unix.Mkdev(189, 1))); err != nil {
		t.Fatal(err)
	}
	sim, err := usbhub.NewSim(usbhub.SimConfig{Keys: []usbhub.Device{{Port: "1-1", VendorID: "096e", ProductID: "0702",
		Serial: "WIPE1", Class: usbhub.ClassSmartCard}}})
	if err != nil {
		t.Fatal(err)
	}
	// Workloads' users pass through the data directory to their homes.
	for d := w.box.DataDir(); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o711)
	}
	stateDir := filepath.Join(w.box.DataDir(), "process")
	w.drivers = func() []runtime.Driver {
		d, err := process.New(process.Config{StateDir: stateDir, FirstUID: firstUID})
		if err != nil {
			t.Fatal(err)
		}
		return []runtime.Driver{d}
	}
	// The agent runs here, not in testenv, to see what its Run returns.
	cfg := agent.DefaultConfig(w.box.DataDir())
	cfg.Version = "test"
	cfg.Tunnel.PingInterval, cfg.Tunnel.PingTimeout = time.Second, 2*time.Second
	cfg.Backoff = tunnel.Backoff{Min: 50 * time.Millisecond, Max: 500 * time.Millisecond}
	cfg.PendingRecheck, cfg.SyncRetry, cfg.Reconcile = 200*time.Millisecond, 100*time.Millisecond, time.Second
	cfg.Drivers = w.drivers()
	cfg.USB, cfg.USBPoll, cfg.USBDevRoot = sim, 100*time.Millisecond, w.devRoot
	cfg.Hooks = hooks
	a, err := agent.New(cfg, testenv.Logger(t).With("side", "agent"))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	ran, exited := make(chan error, 1), make(chan struct{})
	go func() { defer close(exited); ran <- a.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-exited })
	w.ran = ran
	admin := h.Admin()
	testenv.WaitFor(t, 30*time.Second, "the key reported", func() bool {
		ks, err := admin.Keys(ctx(t), w.box.ID(), nil)
		if err != nil || len(ks) != 1 {
			return false
		}
		w.key = ks[0]
		return true
	})
	if _, err := admin.Lease(ctx(t), w.key.ID, "robot"); err != nil {
		t.Fatal(err)
	}
	// A program with a child of its own; both carry the mark.
	b := make([]byte, 6)
	rand.Read(b)
	w.mark = "wipe-mark-" + hex.EncodeToString(b)
	spec, _ := json.Marshal(map[string]any{"app": "robot", "runtime": "process", "image": "/bin/sh",
		"args": []string{"-c", "/bin/sh -c 'while :; do sleep 1; done # " + w.mark + "' & while :; do sleep 1; done # " + w.mark}})
	if _, err := admin.PutDesired(ctx(t), w.box.ID(), "Workload", "robot", spec); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, "robot running with its key", func() bool {
		ps := processes(t, func(p proc) bool { return strings.Contains(p.cmdline, w.mark) })
		if len(ps) < 2 {
			return false
		}
		var st syscall.Stat_t
		if err := syscall.Stat(w.node, &st); err != nil {
			t.Fatal(err)
		}
		w.uid = ps[0].uid
		return int(st.Uid) == w.uid && w.uid >= firstUID
	})
	return w
}

// proc is a live process.
type proc struct {
	pid     int
	uid     int
	cmdline string
}

// processes returns the live processes (zombies are dead) that match.
func processes(t *testing.T, match func(proc) bool) []proc {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue // gone meanwhile
		}
		p := proc{pid: pid, uid: -1}
		zombie := false
		for _, line := range strings.Split(string(status), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) >= 2 && f[0] == "State:":
				zombie = f[1] == "Z" || f[1] == "X"
			case len(f) >= 2 && f[0] == "Uid:":
				p.uid, _ = strconv.Atoi(f[1])
			}
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		p.cmdline = strings.ReplaceAll(string(cmd), "\x00", " ")
		if !zombie && match(p) {
			out = append(out, p)
		}
	}
	return out
}

// checkWiped checks the box after a wipe: no process of the workload, the
// key's node given back to root, and no identity, desired state or
// workload state in the agent's data directory.
func checkWiped(t *testing.T, w wipeBox) {
	t.Helper()
	if ps := processes(t, func(p proc) bool { return strings.Contains(p.cmdline, w.mark) || p.uid == w.uid }); len(ps) > 0 {
		t.Errorf("processes of the wiped workload still run: %+v", ps)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(w.node, &st); err != nil || st.Uid != 0 {
		t.Errorf("the key's device node is still the workload's (uid %d, %v)", st.Uid, err)
	}
	dir := w.box.DataDir()
	for _, f := range []string{"identity.json", "key.pem", "cert.pem", "ca.pem", "agent.db", "status.json", "images.json", "process/robot"} {
		if _, err := os.Stat(filepath.Join(dir, f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still in the wiped box's data directory (%v)", f, err)
		}
	}
	if _, err := agent.LoadIdentity(dir); !errors.Is(err, agent.ErrNotEnrolled) {
		t.Errorf("the wiped box still has an identity: %v", err)
	}
}

// auditOf returns the box's audit entries by action.
func auditOf(t *testing.T, h testenv.Harness, box string) map[string]api.AuditEntry {
	t.Helper()
	es, err := h.Admin().Audit(ctx(t), 100, box)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]api.AuditEntry{}
	for _, e := range es {
		out[e.Action] = e
	}
	return out
}

// TestRevokeWithWipe: a box running a native workload that holds a leased
// key is revoked with a wipe. The answer comes once the box is wiped: the
// workload's processes are gone, the key's node is root's again and its
// lease is ended in the console's registry, the agent's data directory
// holds no identity and no desired state, the box record and the audit
// log say the box confirmed, and the agent stops and will not start again
// as that box.
func TestRevokeWithWipe(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	w := startWipeBox(t, h, "wipe-me", 720000, agent.Hooks{})
	admin := h.Admin()

	b, err := admin.RevokeWith(ctx(t), w.box.ID(), api.RevokeRequest{Wipe: true})
	if err != nil {
		t.Fatal(err)
	}
	if b.State != "revoked" || b.Wipe == nil || !b.Wipe.Confirmed || b.Wipe.Result != "wiped" {
		t.Fatalf("revoke with wipe answered %+v (wipe %+v)", b, b.Wipe)
	}
	if !slices.Equal(b.Wipe.WorkloadsRemoved, []string{"robot"}) || !slices.Equal(b.Wipe.KeysReleased, []string{w.key.ID}) {
		t.Fatalf("the box says it removed %v and gave back %v; want [robot] and [%s]", b.Wipe.WorkloadsRemoved, b.Wipe.KeysReleased, w.key.ID)
	}
	// The box answers only once done: nothing is left to wait for.
	checkWiped(t, w)

	k, err := admin.Keys(ctx(t), w.box.ID(), nil)
	if err != nil || len(k) != 1 || k[0].Holder != "" {
		t.Fatalf("the key's lease is not ended in the registry: %+v %v", k, err)
	}
	hist, err := admin.KeyHistory(ctx(t), w.key.ID)
	if err != nil || len(hist.Events) == 0 || hist.Events[len(hist.Events)-1].Event != "release" {
		t.Fatalf("the key's history does not end with its release: %+v %v", hist, err)
	}
	st, err := admin.BoxState(ctx(t), w.box.ID())
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range st.Objects {
		if o.Kind == "UsbAssignment" {
			t.Errorf("the lease is still in the box's desired state: %+v", o)
		}
	}

	// The record keeps it.
	if got := testenv.BoxState(t, h, w.box.ID()); got.Wipe == nil || !got.Wipe.Confirmed || got.Wipe.AnsweredAt == nil {
		t.Fatalf("the box record does not keep the wipe: %+v", got.Wipe)
	}
	audits := auditOf(t, h, w.box.ID())
	if e := audits["box.revoke"]; e.Detail != "wipe asked" {
		t.Errorf("audit box.revoke: %+v", e)
	}
	if e := audits["box.wipe"]; e.Result != "wiped" || !strings.Contains(e.Detail, "workloads removed: 1 (robot)") ||
		!strings.Contains(e.Detail, "keys released: 1 ("+w.key.ID+")") {
		t.Errorf("audit box.wipe: %+v", e)
	}

	// The agent stops on its own, saying why.
	select {
	case err := <-w.ran:
		if !errors.Is(err, agent.ErrWiped) {
			t.Fatalf("the wiped agent's Run returned %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the wiped agent did not stop")
	}
	if testenv.BoxState(t, h, w.box.ID()).Online {
		t.Error("the wiped box is still online")
	}
	// Started again, it refuses to run, and says why.
	_, err = agent.New(agent.DefaultConfig(w.box.DataDir()), testenv.Logger(t))
	if !errors.Is(err, agent.ErrWiped) || !strings.Contains(err.Error(), "enroll") || !strings.Contains(err.Error(), w.box.ID()) {
		t.Fatalf("a wiped box started again: %v", err)
	}
	if _, err := agent.ReadStatus(w.box.DataDir()); !errors.Is(err, agent.ErrWiped) {
		t.Errorf("status of a wiped box: %v", err)
	}

	// Enrolled again, the machine is a new box.
	tok := h.Token(t, api.TokenRequest{Region: "east", Site: "a"})
	id, _, err := agent.Enroll(ctx(t), w.box.DataDir(), tok, agent.EnrollOptions{Name: "wipe-me-again"})
	if err != nil {
		t.Fatalf("enrolling the wiped machine again: %v", err)
	}
	a, err := agent.New(agent.DefaultConfig(w.box.DataDir()), testenv.Logger(t))
	if err != nil || a.Identity().BoxID != id.BoxID || id.BoxID == w.box.ID() {
		t.Fatalf("the machine enrolled again does not start as its new box: %v %+v", err, a.Identity())
	}
}

// TestRevokeWithWipeOfAnOfflineBox: a box that is offline is revoked all
// the same, at once, and its record says the wipe was not confirmed; the
// CLI says so.
func TestRevokeWithWipeOfAnOfflineBox(t *testing.T) {
	scenario(t, func(t *testing.T, h testenv.Harness) {
		box := enrollOne(t, h, "offline-box")
		box.Start(t)
		testenv.WaitFor(t, 30*time.Second, "online", func() bool { return testenv.BoxState(t, h, box.ID()).Online })
		box.Stop(t)
		testenv.WaitFor(t, 30*time.Second, "offline", func() bool { return !testenv.BoxState(t, h, box.ID()).Online })

		start := time.Now()
		var b api.Box
		if bin, ok := h.(*testenv.Binaries); ok {
			out, err := bin.CLI(t, "boxes", "revoke", box.ID(), "--wipe")
			if err != nil {
				t.Fatalf("edgebox boxes revoke --wipe: %v\n%s", err, out)
			}
			for _, want := range []string{"revoked", "wipe: not confirmed: box offline", "may still run"} {
				if !strings.Contains(out, want) {
					t.Errorf("the CLI does not say %q:\n%s", want, out)
				}
			}
			b = testenv.BoxState(t, h, box.ID())
		} else {
			var err error
			if b, err = h.Admin().RevokeWith(ctx(t), box.ID(), api.RevokeRequest{Wipe: true}); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("revoke with wipe of an offline box took %s", time.Since(start))
		if b.State != "revoked" || b.Wipe == nil || b.Wipe.Confirmed || b.Wipe.Result != "not confirmed: box offline" {
			t.Fatalf("revoke with wipe of an offline box: state %s, wipe %+v", b.State, b.Wipe)
		}
		if e := auditOf(t, h, box.ID())["box.wipe"]; e.Result != "not confirmed: box offline" {
			t.Errorf("audit box.wipe: %+v", e)
		}
		// A second wipe cannot reach the box: it is revoked, its session gone.
		_, err := h.Admin().RevokeWith(ctx(t), box.ID(), api.RevokeRequest{Wipe: true})
		var se *api.StatusError
		if !errors.As(err, &se) || se.Status != 409 {
			t.Errorf("a wipe of a revoked box: %v", err)
		}
		// The box is refused when it comes back: its identity is still
		// there, but it never gets online again.
		box.Start(t)
		time.Sleep(2 * time.Second)
		if testenv.BoxState(t, h, box.ID()).Online {
			t.Error("the revoked box came back online")
		}
	})
}

// TestRevokeWithWipeOfASlowBox: a box that does not answer within the
// wipe's timeout does not hold the revocation up: the call answers when
// the timeout ends, the box is revoked and its session dropped, and the
// record says the wipe was not confirmed. The box, told already, still
// finishes its wipe on its own.
func TestRevokeWithWipeOfASlowBox(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	release := make(chan struct{})
	w := startWipeBox(t, h, "slow-box", 780000, agent.Hooks{WipeStep: func(s string) error {
		if s == agent.WipeStepDesired {
			<-release // the workloads take their time to stop
		}
		return nil
	}})
	start := time.Now()
	b, err := h.Admin().RevokeWith(ctx(t), w.box.ID(), api.RevokeRequest{Wipe: true, WipeTimeout: "1s"})
	took := time.Since(start)
	close(release)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("revoke with a 1 s wipe timeout of a box that does not answer took %s", took)
	if took > 20*time.Second {
		t.Errorf("the revocation waited %s for a box given 1 s", took)
	}
	if b.State != "revoked" || b.Wipe == nil || b.Wipe.Confirmed || b.Wipe.Result != "not confirmed: timed out after 1s" {
		t.Fatalf("revoke with wipe of a slow box: state %s, wipe %+v", b.State, b.Wipe)
	}
	if e := auditOf(t, h, w.box.ID())["box.wipe"]; e.Result != "not confirmed: timed out after 1s" {
		t.Errorf("audit box.wipe: %+v", e)
	}
	select {
	case err := <-w.ran:
		if !errors.Is(err, agent.ErrWiped) {
			t.Fatalf("the slow box's Run returned %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the slow box did not finish its wipe")
	}
	checkWiped(t, w)
}

// TestWipeFinishesAfterAKill: a box stopped at any step of its wipe (a
// hook ends the wipe there, as a kill would; the workload's processes
// outlive the agent as they would) finishes the wipe when it starts
// again, before anything else, and then refuses to run as that box.
func TestWipeFinishesAfterAKill(t *testing.T) {
	t.Parallel()
	steps := []string{agent.WipeStepMarked, agent.WipeStepDesired, agent.WipeStepWorkloads, agent.WipeStepIdentity}
	for i, step := range steps {
		t.Run(step, func(t *testing.T) {
			t.Parallel()
			h := testenv.NewInProcess(t, testenv.Options{})
			w := startWipeBox(t, h, "killed-"+step, 730000+10000*i, agent.Hooks{WipeStep: func(s string) error {
				if s == step {
					return fmt.Errorf("killed after %s", s)
				}
				return nil
			}})
			b, err := h.Admin().RevokeWith(ctx(t), w.box.ID(), api.RevokeRequest{Wipe: true})
			if err != nil {
				t.Fatal(err)
			}
			if b.State != "revoked" || b.Wipe == nil || b.Wipe.Confirmed || !strings.Contains(b.Wipe.Result, "killed after "+step) {
				t.Fatalf("a wipe stopped after %s: state %s, wipe %+v", step, b.State, b.Wipe)
			}
			// The console ends a lease when the box says the key is free:
			// once its workload is removed, confirmed or not.
			freed := step == agent.WipeStepWorkloads || step == agent.WipeStepIdentity
			if k, _ := h.Admin().Keys(ctx(t), w.box.ID(), nil); len(k) != 1 || (k[0].Holder == "") != freed {
				t.Errorf("after a wipe stopped at %s, the key's lease: %+v; want ended %v", step, k, freed)
			}
			// The agent ended with its wipe; the workload outlived it.
			select {
			case err := <-w.ran:
				if err == nil || errors.Is(err, agent.ErrWiped) || !strings.Contains(err.Error(), "tried again at the next start") {
					t.Fatalf("the agent stopped after %s: %v", step, err)
				}
			case <-time.After(60 * time.Second):
				t.Fatal("the agent did not stop")
			}
			if step != agent.WipeStepWorkloads && step != agent.WipeStepIdentity {
				if ps := processes(t, func(p proc) bool { return strings.Contains(p.cmdline, w.mark) }); len(ps) == 0 {
					t.Fatalf("the workload did not outlive an agent stopped after %s", step)
				}
			}

			// Started again, the agent finishes the wipe before anything
			// else, and says the box is wiped.
			cfg := agent.DefaultConfig(w.box.DataDir())
			cfg.Drivers = w.drivers()
			a, err := agent.New(cfg, testenv.Logger(t))
			if err != nil {
				t.Fatalf("starting again after a wipe stopped at %s: %v", step, err)
			}
			if err := a.Run(ctx(t)); !errors.Is(err, agent.ErrWiped) {
				t.Fatalf("the agent started again after a wipe stopped at %s: %v", step, err)
			}
			checkWiped(t, w)
			// And again: it does not start, and does nothing.
			if _, err := agent.New(cfg, testenv.Logger(t)); !errors.Is(err, agent.ErrWiped) {
				t.Fatalf("the third start: %v", err)
			}
		})
	}
}

// TestRevokeWithWipeOfTheAgentBinary: the built agent, running a native
// workload, is revoked with a wipe through the CLI. The CLI says the box
// confirmed; the agent exits by itself with agent.ExitWiped (which the
// systemd unit does not restart) and says the box needs a new
// enrollment; started again, it exits the same way at once.
func TestRevokeWithWipeOfTheAgentBinary(t *testing.T) {
	t.Parallel()
	require.Root(t, "the process driver, which runs workloads under users of their own,")
	h := testenv.NewBinaries(t)
	box := enrollOne(t, h, "wipe-bin")
	for d := box.DataDir(); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o711)
	}
	// The agent's output goes to a file: a pipe would be held open by
	// whatever the agent leaves running.
	run := func() (logs func() string, done <-chan error) {
		out, err := os.CreateTemp(t.TempDir(), "agent-*.log")
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(filepath.Join(h.Bin(), "edgebox-agent"), "run", "--data", box.DataDir())
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		out.Close()
		ch, exited := make(chan error, 1), make(chan struct{})
		go func() { defer close(exited); ch <- cmd.Wait() }()
		t.Cleanup(func() {
			cmd.Process.Kill()
			<-exited
		})
		return func() string { b, _ := os.ReadFile(out.Name()); return string(b) }, ch
	}
	out, done := run()
	testenv.WaitFor(t, 30*time.Second, "online", func() bool { return testenv.BoxState(t, h, box.ID()).Online })
	b := make([]byte, 6)
	rand.Read(b)
	mark := "wipe-mark-" + hex.EncodeToString(b)
	spec, _ := json.Marshal(map[string]any{"app": "robot", "runtime": "process", "image": "/bin/sh",
		"args": []string{"-c", "while :; do sleep 1; done # " + mark}})
	if _, err := h.Admin().PutDesired(ctx(t), box.ID(), "Workload", "robot", spec); err != nil {
		t.Fatal(err)
	}
	marked := func(p proc) bool { return strings.Contains(p.cmdline, mark) }
	testenv.WaitFor(t, 60*time.Second, "robot running", func() bool { return len(processes(t, marked)) > 0 })

	cli, err := h.CLI(t, "boxes", "revoke", box.ID(), "--wipe")
	if err != nil {
		t.Fatalf("edgebox boxes revoke --wipe: %v\n%s", err, cli)
	}
	if !strings.Contains(cli, "wipe: confirmed by the box: 1 workload removed (robot)") {
		t.Errorf("the CLI does not say the box confirmed:\n%s", cli)
	}
	exitedWiped := func(err error, out string) {
		t.Helper()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != agent.ExitWiped {
			t.Errorf("the wiped agent exited with %v; want status %d", err, agent.ExitWiped)
		}
		if !strings.Contains(out, "was wiped by its console") || !strings.Contains(out, "edgebox-agent enroll") {
			t.Errorf("the wiped agent does not say what happened and what to do:\n%s", out)
		}
	}
	select {
	case err := <-done:
		exitedWiped(err, out())
	case <-time.After(60 * time.Second):
		t.Fatalf("the wiped agent did not exit:\n%s", out())
	}
	if ps := processes(t, marked); len(ps) > 0 {
		t.Errorf("the workload still runs: %+v", ps)
	}
	if _, err := agent.LoadIdentity(box.DataDir()); !errors.Is(err, agent.ErrNotEnrolled) {
		t.Errorf("the wiped box still has an identity: %v", err)
	}
	out, done = run()
	select {
	case err := <-done:
		exitedWiped(err, out())
	case <-time.After(30 * time.Second):
		t.Fatal("a wiped agent started again does not exit")
	}
}
