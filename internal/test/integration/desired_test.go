package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/localstore"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/fake"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/testenv"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/tunnel"
)

func spec(app, release, rt string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"app":%q,"release":%q,"runtime":%q}`, app, release, rt))
}

func withDriver(d runtime.Driver) func(*agent.Config) {
	return func(c *agent.Config) { c.Drivers = []runtime.Driver{d}; c.Reconcile = 500 * time.Millisecond }
}

func enrollOne(t *testing.T, h testenv.Harness, name string) testenv.Box {
	t.Helper()
	box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "a"}), name)
	if err != nil {
		t.Fatal(err)
	}
	return box
}

func TestStatusComesUpAndTheAPIShowsIt(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	box := enrollOne(t, h, "shop")
	drv := fake.New("containerd")
	testenv.StartAgent(t, box, withDriver(drv))
	adm := h.Admin()
	if _, err := adm.PutDesired(ctx(t), "shop", "Workload", "robot", spec("robot", "1.0", "containerd")); err != nil {
		t.Fatal(err)
	}
	rev, err := adm.PutDesired(ctx(t), box.ID(), "Workload", "vm", spec("vm", "1.0", "qemu"))
	if err != nil {
		t.Fatal(err)
	}
	var s api.BoxState
	testenv.WaitFor(t, 10*time.Second, "status of both workloads", func() bool {
		s, err = adm.BoxState(ctx(t), box.ID())
		return err == nil && s.Acked == rev && len(s.Statuses) == 2
	})
	phase := map[string]string{}
	for _, st := range s.Statuses {
		phase[st.Name] = st.Phase
	}
	if phase["robot"] != "Running" || phase["vm"] != "Failed" {
		t.Fatalf("statuses %+v: want robot Running and vm Failed (no qemu driver)", s.Statuses)
	}
	if len(s.Objects) != 2 || s.Objects[0].Name != "robot" || len(s.Events) == 0 {
		t.Fatalf("state %+v", s)
	}

	// A delete removes the instance and its status.
	if _, err := adm.DeleteDesired(ctx(t), box.ID(), "Workload", "robot"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "removal", func() bool {
		s, err = adm.BoxState(ctx(t), box.ID())
		return err == nil && len(s.Statuses) == 1 && len(drv.Running()) == 0
	})

	// Bad input is refused with a clear error and changes nothing.
	for _, c := range []struct{ kind, name, spec, want string }{
		{"Workload", "Bad Name", `{}`, "object name"},
		{"Gadget", "x", `{}`, "unknown kind"},
		{"Workload", "x", `{"ap":"typo"}`, "Workload spec"},
	} {
		_, err := adm.PutDesired(ctx(t), box.ID(), c.kind, c.name, json.RawMessage(c.spec))
		wantErr(t, c.kind+"/"+c.name, err, c.want)
	}
	_, err = adm.PutDesired(ctx(t), "no-such-box", "Workload", "x", spec("x", "1", "containerd"))
	wantErr(t, "unknown box", err, "no box")
}

func TestEdgeAutonomyWithTheConsoleGone(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	box := enrollOne(t, h, "autonomous")
	testenv.StartAgent(t, box, withDriver(fake.New("containerd")))
	var rev uint64
	for i := range 10 {
		r, err := h.Admin().PutDesired(ctx(t), box.ID(), "Workload", fmt.Sprintf("w%d", i), spec("w", "1", "containerd"))
		if err != nil {
			t.Fatal(err)
		}
		rev = r
	}
	testenv.WaitFor(t, 10*time.Second, "ack", func() bool { return testenv.AgentOf(box).Status().Connected && acked(t, h, box) == rev })

	// The console goes away, then the box reboots: nothing runs any more.
	h.StopConsole()
	box.Stop(t)
	after := fake.New("containerd")
	start := time.Now()
	testenv.StartAgent(t, box, withDriver(after))
	took := testenv.WaitFor(t, 5*time.Second, "every workload running again", func() bool { return len(after.Running()) == 10 })
	t.Logf("10 workloads running %v after the agent started, console down (%v since start)", took, time.Since(start))
}

func acked(t *testing.T, h *testenv.InProcess, box testenv.Box) uint64 {
	n, err := h.Console().Desired().Acked(ctx(t), box.ID())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestAgentKilledBetweenStoreAndAck(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	box := enrollOne(t, h, "crashy")
	st := h.Console().Desired()
	for i := range 20 {
		if _, err := st.Put(ctx(t), box.ID(), workload(fmt.Sprintf("w%02d", i), "1")); err != nil {
			t.Fatal(err)
		}
	}
	// Workload instances outlive the agent process, as containers do.
	drv := fake.New("containerd")
	stored := make(chan uint64, 1)
	testenv.StartAgent(t, box, func(c *agent.Config) {
		withDriver(drv)(c)
		c.Hooks.AfterStore = func(rev uint64) error {
			select {
			case stored <- rev:
			default:
			}
			return errors.New("killed")
		}
	})
	rev := <-stored
	box.Stop(t)
	if rev != 20 || acked(t, h, box) != 0 {
		t.Fatalf("stored revision %d, console saw ack %d; want 20 stored and no ack", rev, acked(t, h, box))
	}

	testenv.StartAgent(t, box, withDriver(drv))
	testenv.WaitFor(t, 10*time.Second, "ack after restart", func() bool { return acked(t, h, box) == 20 })
	testenv.WaitFor(t, 10*time.Second, "workloads", func() bool { return len(drv.Running()) == 20 })
	if n := testenv.AgentOf(box).ReceivedObjects(); n != 0 {
		t.Fatalf("the restarted agent was sent %d objects it had stored already", n)
	}
	objs, _ := testenv.AgentOf(box).DesiredObjects(edgeboxv1.KindWorkload)
	for _, o := range objs {
		if n := drv.Creates(o.Name, runtime.NewSpec(o.Name, o.GetWorkload()).Hash); n != 1 {
			t.Fatalf("%s was created %d times", o.Name, n)
		}
	}
}

func TestOlderAgentIsNotSentKindsItDoesNotKnow(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	box := enrollOne(t, h, "old")
	st := h.Console().Desired()
	for i := range 5 {
		st.Put(ctx(t), box.ID(), workload(fmt.Sprintf("w%d", i), "1"))
	}
	// Capability 0 knows no kind yet: it stores the revision and nothing else.
	testenv.StartAgent(t, box, func(c *agent.Config) { var zero uint32; c.Hooks.CapabilityVersion = &zero })
	testenv.WaitFor(t, 10*time.Second, "ack", func() bool { return acked(t, h, box) == 5 })
	if n := testenv.AgentOf(box).ReceivedObjects(); n != 0 {
		t.Fatalf("an agent of capability 0 was sent %d objects", n)
	}
	box.Stop(t)
	// Upgraded, it gets them all.
	box.Start(t)
	testenv.WaitFor(t, 10*time.Second, "objects after the upgrade", func() bool {
		objs, _ := testenv.AgentOf(box).DesiredObjects("")
		return len(objs) == 5
	})
}

// TestConsoleKilledMidSync writes desired state as fast as the API takes
// it while the console is killed (SIGKILL for the binaries) and
// restarted: every write the API confirmed reaches the box, the box's
// acknowledged revision never goes back, and the box ends equal to the
// console's state.
func TestConsoleKilledMidSync(t *testing.T) {
	scenario(t, func(t *testing.T, h testenv.Harness) {
		box := enrollOne(t, h, "steady")
		box.Start(t)
		adm := h.Admin()

		type write struct {
			rev         uint64
			put         bool
			laterDelete bool // a delete was tried after it, maybe committed
		}
		var mu sync.Mutex
		confirmed := map[string]write{} // name -> the last write the API confirmed
		var stop atomic.Bool
		var writes atomic.Int64 // confirmed by the API
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				name := fmt.Sprintf("w%02d", i%40)
				var err error
				var rev uint64
				put := i%7 != 3
				if !put {
					mu.Lock()
					if w, ok := confirmed[name]; ok {
						w.laterDelete = true
						confirmed[name] = w
					}
					mu.Unlock()
					rev, err = adm.DeleteDesired(ctx(t), box.ID(), "Workload", name)
				} else {
					rev, err = adm.PutDesired(ctx(t), box.ID(), "Workload", name, spec(name, fmt.Sprint(i), "containerd"))
				}
				if err != nil {
					time.Sleep(20 * time.Millisecond) // the console is down
					continue
				}
				mu.Lock()
				if rev > confirmed[name].rev {
					confirmed[name] = write{rev: rev, put: put}
				}
				mu.Unlock()
				writes.Add(1)
			}
		}()
		var ackErr error
		var lastAck atomic.Uint64
		done := make(chan struct{})
		go func() {
			defer close(done)
			for !stop.Load() {
				if s, err := adm.BoxState(ctx(t), box.ID()); err == nil {
					if s.Acked < lastAck.Load() {
						ackErr = fmt.Errorf("acked revision went back from %d to %d", lastAck.Load(), s.Acked)
					}
					lastAck.Store(s.Acked)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
		// Each kill lands in the middle of a stream of writes: at least 40
		// confirmed since the last one, however slow the machine.
		waitWrites := func() {
			from := writes.Load()
			testenv.WaitFor(t, 60*time.Second, "writes", func() bool { return writes.Load() >= from+40 })
		}
		for range 3 {
			waitWrites()
			h.RestartConsole(t)
		}
		waitWrites()
		stop.Store(true)
		wg.Wait()
		<-done
		if ackErr != nil {
			t.Fatal(ackErr)
		}
		var s api.BoxState
		testenv.WaitFor(t, 30*time.Second, "box in sync", func() bool {
			var err error
			s, err = adm.BoxState(ctx(t), box.ID())
			return err == nil && s.Acked == s.Revision
		})
		box.Stop(t)
		if len(confirmed) < 20 || s.Revision < 100 {
			t.Fatalf("only %d names and %d revisions written; the test did not exercise sync", len(confirmed), s.Revision)
		}
		// Nothing confirmed is lost: each object the API confirmed is at
		// that revision or a later one (a put or a delete).
		console := map[string]uint64{}
		for _, o := range s.Objects {
			console[o.Name] = o.Revision
		}
		local, err := localstore.Open(box.DataDir())
		if err != nil {
			t.Fatal(err)
		}
		defer local.Close()
		objs, _ := local.Objects("")
		onBox := map[string]*edgeboxv1.DesiredObject{}
		for _, o := range objs {
			onBox[o.Name] = o
		}
		if len(onBox) != len(console) {
			t.Fatalf("the box holds %d objects, the console %d", len(onBox), len(console))
		}
		for name, rev := range console {
			if onBox[name].GetRevision() != rev {
				t.Fatalf("%s: box at revision %d, console at %d", name, onBox[name].GetRevision(), rev)
			}
		}
		for name, w := range confirmed {
			r, ok := console[name]
			switch {
			case w.put && !ok && !w.laterDelete:
				t.Fatalf("%s: put confirmed at revision %d is lost", name, w.rev)
			case w.put && ok && r < w.rev:
				t.Fatalf("%s: put confirmed at revision %d, console holds %d", name, w.rev, r)
			case !w.put && ok && r <= w.rev:
				t.Fatalf("%s: delete confirmed at revision %d, console holds revision %d", name, w.rev, r)
			}
		}
		t.Logf("%d revisions, %d live objects, box in sync after 3 console kills", s.Revision, len(console))
	})
}

func TestBoxesSeeOnlyTheirOwnState(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	a, b := enrollOne(t, h, "box-a"), enrollOne(t, h, "box-b")
	st := h.Console().Desired()
	for i := range 3 {
		st.Put(ctx(t), a.ID(), workload(fmt.Sprintf("a%d", i), "1"))
		st.Put(ctx(t), b.ID(), workload(fmt.Sprintf("b%d", i), "1"))
	}
	st.Put(ctx(t), b.ID(), workload("b3", "1"))
	da, db := fake.New("containerd"), fake.New("containerd")
	testenv.StartAgent(t, a, withDriver(da))
	testenv.StartAgent(t, b, withDriver(db))
	testenv.WaitFor(t, 10*time.Second, "both in sync", func() bool { return acked(t, h, a) == 3 && acked(t, h, b) == 4 })
	testenv.WaitFor(t, 10*time.Second, "both running", func() bool { return len(da.Running()) == 3 && len(db.Running()) == 4 })
	if fmt.Sprint(da.Running()) != "[a0 a1 a2]" || fmt.Sprint(db.Running()) != "[b0 b1 b2 b3]" {
		t.Fatalf("box a runs %v, box b runs %v", da.Running(), db.Running())
	}
	testenv.WaitFor(t, 10*time.Second, "statuses of both", func() bool {
		sa, _ := st.Statuses(ctx(t), a.ID())
		sb, _ := st.Statuses(ctx(t), b.ID())
		return len(sa) == 3 && len(sb) == 4
	})
	sa, _ := st.Statuses(ctx(t), a.ID())
	for _, x := range sa {
		if !strings.HasPrefix(x.Name, "a") {
			t.Fatalf("box a holds the status of %s", x.Name)
		}
	}
}

func TestWaitingBoxGetsNoStateUntilApproved(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "a", RequireApproval: true}), "newcomer")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Admin().PutDesired(ctx(t), box.ID(), "Workload", "robot", spec("robot", "1", "containerd")); err != nil {
		t.Fatal(err)
	}
	box.Start(t)
	testenv.WaitFor(t, 15*time.Second, "waiting box connected", func() bool { return testenv.BoxState(t, h, box.ID()).Online })
	time.Sleep(500 * time.Millisecond) // a few sync attempts
	if n := testenv.AgentOf(box).ReceivedObjects(); n != 0 {
		t.Fatalf("a box in the waiting room received %d objects", n)
	}
	if _, err := h.Admin().Approve(ctx(t), box.ID()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "state after approval", func() bool { return acked(t, h, box) == 1 })
}

func TestCLIReadsAndWritesDesiredState(t *testing.T) {
	t.Parallel()
	h := testenv.NewBinaries(t)
	box := enrollOne(t, h, "cli-box")
	box.Start(t)
	cli := func(want string, args ...string) string {
		t.Helper()
		out, err := h.CLI(t, args...)
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("edgebox %s: %v\n%s\n(want %q)", strings.Join(args, " "), err, out, want)
		}
		return out
	}
	cli("Workload/robot written at box revision 1", "boxes", "desired", "put", "cli-box", "Workload/robot",
		"--spec", `{"app":"robot","release":"1.2.0","runtime":"containerd"}`)
	testenv.WaitFor(t, 15*time.Second, "status in the CLI", func() bool {
		out, err := h.CLI(t, "boxes", "state", "cli-box")
		// The agent binary has no runtime drivers yet: the workload fails,
		// and says why.
		return err == nil && strings.Contains(out, "revision 1, stored 1 (in sync)") && strings.Contains(out, "Failed")
	})
	out := cli(`"phase": "Failed"`, "boxes", "state", "cli-box", "-o", "json")
	if !strings.Contains(out, `runtime \"containerd\" is not available`) {
		t.Fatalf("state JSON does not say why the workload failed:\n%s", out)
	}
	cli("deleted (box revision 2)", "boxes", "desired", "rm", "cli-box", "Workload/robot")

	for _, c := range []struct {
		want string
		args []string
	}{
		{"name the object as KIND/NAME", []string{"boxes", "desired", "put", "cli-box", "robot", "--spec", "{}"}},
		{"give the spec with -f FILE or --spec JSON", []string{"boxes", "desired", "put", "cli-box", "Workload/x"}},
		{"unknown field", []string{"boxes", "desired", "put", "cli-box", "Workload/x", "--spec", `{"ap":"x"}`}},
		{"no box with ID or name", []string{"boxes", "state", "nope"}},
	} {
		out, err := h.CLI(t, c.args...)
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("edgebox %s: err %v, output %q; want an error saying %q", strings.Join(c.args, " "), err, out, c.want)
		}
	}
}

func TestBadSyncStreamsAreRefusedClearly(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	box := enrollOne(t, h, "rogue")
	testenv.StartAgent(t, box, withDriver(fake.New("containerd")))
	a := testenv.AgentOf(box)
	for _, c := range []struct {
		name string
		send []byte
		want string
	}{
		{"oversized frame", []byte{0x80, 0x80, 0x80, 0x01}, "too large"},
		{"empty message", frame(t, &edgeboxv1.SyncUp{}), "starts with a hello, or carries acks and status"},
		{"ack past the box's revision", frame(t, &edgeboxv1.SyncUp{Msg: &edgeboxv1.SyncUp_Ack{Ack: &edgeboxv1.SyncAck{Revision: 1 << 40}}}), "acknowledged revision"},
		{"hello among acks", append(frame(t, &edgeboxv1.SyncUp{Msg: &edgeboxv1.SyncUp_Ack{Ack: &edgeboxv1.SyncAck{Revision: 0}}}),
			frame(t, &edgeboxv1.SyncUp{Msg: &edgeboxv1.SyncUp_Hello{Hello: &edgeboxv1.SyncHello{CapabilityVersion: 1}}})...), "carries nothing else"},
	} {
		conn, err := a.Tunnel().Open(ctx(t), tunnel.KindSync, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(c.send); err != nil {
			t.Fatal(err)
		}
		var got string
		for got == "" {
			var down edgeboxv1.SyncDown
			if err := edgeboxv1.ReadFrame(conn, &down, 1<<20); err != nil {
				t.Fatalf("%s: stream ended without a reason: %v", c.name, err)
			}
			got = down.GetError()
		}
		conn.Close()
		if !strings.Contains(got, c.want) {
			t.Errorf("%s: refused with %q, want %q", c.name, got, c.want)
		}
	}
	// The box's own stream carries on.
	rev, err := h.Admin().PutDesired(ctx(t), box.ID(), "Workload", "robot", spec("robot", "1", "containerd"))
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "ack", func() bool { return acked(t, h, box) == rev })
}

func frame(t *testing.T, m *edgeboxv1.SyncUp) []byte {
	var b bytes.Buffer
	if err := edgeboxv1.WriteFrame(&b, m); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestRenewedSessionKeepsTheBoxInSync(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	box := enrollOne(t, h, "busy")
	testenv.StartAgent(t, box, func(c *agent.Config) {
		withDriver(fake.New("containerd"))(c)
		c.Tunnel.PingInterval = 100 * time.Millisecond // renewal is checked at each ping
		c.Renew = tunnel.Renewal{After: 64 << 10, Idle: 500 * time.Millisecond, Cuts: tunnel.DefaultRenewal().Cuts}
	})
	a := testenv.AgentOf(box)
	testenv.WaitFor(t, 10*time.Second, "session", func() bool { return a.Tunnel().Session() != nil })
	first := a.Tunnel().Session()

	// 150 KiB of desired state goes down the Sync stream.
	var env []string
	for i := range 150 {
		env = append(env, fmt.Sprintf("V%d=%s", i, strings.Repeat("x", 1<<10)))
	}
	big, err := json.Marshal(map[string]any{"app": "big", "release": "1", "runtime": "containerd", "env": env})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := h.Admin().PutDesired(ctx(t), box.ID(), "Workload", "big", big)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "ack of the big object", func() bool { return acked(t, h, box) == rev })

	// Quiet again, the session is renewed, and the box follows changes on
	// the new one at once.
	testenv.WaitFor(t, 10*time.Second, "renewal", func() bool {
		s := a.Tunnel().Session()
		return s != nil && s != first
	})
	rev, err = h.Admin().PutDesired(ctx(t), box.ID(), "Workload", "small", spec("small", "1", "containerd"))
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "ack on the new session", func() bool { return acked(t, h, box) == rev })
	b, err := h.Admin().Box(ctx(t), box.ID())
	if err != nil || !b.Online {
		t.Fatalf("box after renewal: %+v, %v", b, err)
	}
}

// TestRefusedStatusIsSentAgain: a status the console refuses is sent again
// whole, after a short wait, on the same session and without dropping the
// Sync stream the box is caught up on.
func TestRefusedStatusIsSentAgain(t *testing.T) {
	t.Parallel()
	h := testenv.NewInProcess(t, testenv.Options{})
	box := enrollOne(t, h, "garbled")
	var garbled atomic.Bool
	testenv.StartAgent(t, box, func(c *agent.Config) {
		withDriver(fake.New("containerd"))(c)
		c.SyncRetry = 100 * time.Millisecond
		// The first status that carries an object goes up garbled.
		c.Hooks.BeforeSendUp = func(msgs []*edgeboxv1.SyncUp) {
			for _, m := range msgs {
				if st := m.GetStatus(); st != nil && len(st.GetObjects()) > 0 && garbled.CompareAndSwap(false, true) {
					o := st.Objects[0]
					st.Objects[0] = &edgeboxv1.ObjectStatus{Kind: o.GetKind(), Name: o.GetName(), Phase: "No Such Phase"}
				}
			}
		}
	})
	rev, err := h.Admin().PutDesired(ctx(t), box.ID(), "Workload", "robot", spec("robot", "1", "containerd"))
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "a garbled status", garbled.Load)
	// The console refused it; the box sends its acks and whole status
	// again.
	testenv.WaitFor(t, 10*time.Second, "ack after the refusal", func() bool { return acked(t, h, box) == rev })
	rev, err = h.Admin().PutDesired(ctx(t), box.ID(), "Workload", "second", spec("second", "1", "containerd"))
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "ack of the next change", func() bool { return acked(t, h, box) == rev })
	testenv.WaitFor(t, 10*time.Second, "status of both", func() bool {
		s, err := h.Admin().BoxState(ctx(t), box.ID())
		return err == nil && len(s.Statuses) == 2
	})
}
