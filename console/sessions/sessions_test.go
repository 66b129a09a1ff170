package sessions

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/edgebox/edgebox/agent/session"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/audit/audittest"
	"github.com/edgebox/edgebox/console/recording"
	"github.com/edgebox/edgebox/console/store"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/sessionwire"
)

// agentService serves the box's real session server.
type agentService struct {
	edgeboxv1.UnimplementedAgentServiceServer
	s *session.Server
}

func (a agentService) Exec(st edgeboxv1.AgentService_ExecServer) error { return a.s.Exec(st) }

// box is one box's AgentService on a bufconn: the real session server,
// real processes, only the tunnel left out.
type box struct{ ln *bufconn.Listener }

func (b box) Conn(string) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///box", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return b.ln.DialContext(ctx) }))
}

func newBox(t *testing.T) box {
	ln := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	edgeboxv1.RegisterAgentServiceServer(srv, agentService{s: session.New(session.Config{})})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return box{ln}
}

func newStore(t *testing.T) store.Store {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "store.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := store.OpenBolt(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); db.Close() })
	return s
}

// operator is a test's operator: frames in, frames out.
type operator struct {
	in     chan []byte
	mu     sync.Mutex
	out    []sessionwire.Frame
	got    chan struct{}
	closed chan struct{}
	once   sync.Once
}

func newOperator() *operator {
	return &operator{in: make(chan []byte, 16), got: make(chan struct{}, 1), closed: make(chan struct{})}
}

func (o *operator) ReadMessage() ([]byte, error) {
	select {
	case m := <-o.in:
		return m, nil
	case <-o.closed:
		return nil, errors.New("closed")
	}
}

func (o *operator) WriteMessage(m []byte) error {
	o.mu.Lock()
	o.out = append(o.out, sessionwire.Frame{Type: m[0], Payload: append([]byte(nil), m[1:]...)})
	o.mu.Unlock()
	select {
	case o.got <- struct{}{}:
	default:
	}
	return nil
}

func (o *operator) Close() error { o.once.Do(func() { close(o.closed) }); return nil }

// output is everything printed so far, and the exit if there is one.
func (o *operator) output() (string, *sessionwire.SessionExit) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var b strings.Builder
	var exit *sessionwire.SessionExit
	for _, f := range o.out {
		switch f.Type {
		case sessionwire.FrameOutput, sessionwire.FrameStderr:
			b.Write(f.Payload)
		case sessionwire.FrameExit:
			exit = &sessionwire.SessionExit{}
			json.Unmarshal(f.Payload, exit)
		}
	}
	return b.String(), exit
}

func newBroker(t *testing.T, st store.Store, cfg Config) *Broker {
	cfg.Store, cfg.Dir = st, t.TempDir()
	if cfg.Agents == nil {
		cfg.Agents = newBox(t)
	}
	return New(cfg)
}

func req(cmd ...string) Request {
	return Request{TenantID: "default", Box: "bx-1", BoxName: "box-1", Command: cmd, User: "alice", Remote: "10.0.0.9"}
}

func TestAnExecIsCarriedRecordedAndAudited(t *testing.T) {
	st := newStore(t)
	b := newBroker(t, st, Config{})
	op := newOperator()
	b.Serve(t.Context(), req("sh", "-c", "echo hello; echo oops >&2; exit 4"), op)
	out, exit := op.output()
	if exit == nil || exit.Code != 4 || !strings.Contains(out, "hello\n") || !strings.Contains(out, "oops\n") {
		t.Fatalf("output %q, exit %+v", out, exit)
	}
	recs, err := b.List(t.Context(), "default", Query{})
	if err != nil || len(recs) != 1 {
		t.Fatalf("records %v %v", recs, err)
	}
	r := recs[0]
	if r.Live() || r.EndedBy != "exit" || r.ExitCode == nil || *r.ExitCode != 4 || r.BytesOut != int64(len(out)) || r.User != "alice" || r.Kind != KindExec {
		t.Fatalf("record %+v", r)
	}
	rep, err := recording.Verify(filepath.Join(b.cfg.Dir, "default"), r.ID, r.Recording.Head)
	if err != nil || !rep.OK {
		t.Fatalf("recording: %+v %v", rep, err)
	}
	cast, _ := recording.Paths(filepath.Join(b.cfg.Dir, "default"), r.ID)
	if raw, _ := os.ReadFile(cast); !bytes.Contains(raw, []byte(`hello\n`)) {
		t.Fatalf("the recording lacks the output: %s", raw)
	}
	var actions []string
	for _, e := range audittest.Entries(t, st) {
		actions = append(actions, e.Action+":"+e.Result)
		if e.Target != "box/bx-1" || e.Actor != "alice" {
			t.Fatalf("entry %+v", e)
		}
	}
	if strings.Join(actions, ",") != "session.open:ok,session.end:ok" {
		t.Fatalf("audit %v", actions)
	}
}

func TestIdleAndOverlongSessionsEnd(t *testing.T) {
	st := newStore(t)
	for name, tc := range map[string]struct {
		cfg  Config
		want string
	}{
		"idle":       {Config{IdleTimeout: 1500 * time.Millisecond}, "idle"},
		"time limit": {Config{MaxDuration: 1500 * time.Millisecond}, "time limit"},
	} {
		t.Run(name, func(t *testing.T) {
			b := newBroker(t, st, tc.cfg)
			op := newOperator()
			t0 := time.Now()
			b.Serve(t.Context(), req("sleep", "30"), op)
			_, exit := op.output()
			if exit == nil || exit.Code != -1 || time.Since(t0) > 10*time.Second {
				t.Fatalf("exit %+v after %v", exit, time.Since(t0))
			}
			recs, _ := b.List(t.Context(), "default", Query{Limit: 1})
			if recs[0].EndedBy != tc.want {
				t.Fatalf("ended by %q, want %q", recs[0].EndedBy, tc.want)
			}
		})
	}
}

func TestAUserEndsASession(t *testing.T) {
	st := newStore(t)
	b := newBroker(t, st, Config{})
	op := newOperator()
	done := make(chan struct{})
	go func() { defer close(done); b.Serve(t.Context(), req("sleep", "30"), op) }()
	var id string
	for id == "" {
		live, _ := b.List(t.Context(), "default", Query{LiveOnly: true})
		if len(live) == 1 {
			id = live[0].ID
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := b.End("other-tenant", id, "mallory"); err == nil {
		t.Fatal("ended from another tenant")
	}
	if err := b.End("default", id, "root"); err != nil {
		t.Fatal(err)
	}
	<-done
	r, err := b.Get(t.Context(), "default", id)
	if err != nil || r.EndedBy != "user:root" {
		t.Fatalf("record %+v %v", r, err)
	}
	if _, exit := op.output(); exit == nil || exit.Error != "ended by root" {
		t.Fatalf("exit %+v", exit)
	}
}

func TestTheOperatorsInputAndABadFrame(t *testing.T) {
	st := newStore(t)
	b := newBroker(t, st, Config{})
	op := newOperator()
	op.in <- sessionwire.EncodeFrame(sessionwire.FrameInput, []byte("one two three\n"))
	op.in <- sessionwire.EncodeFrame(sessionwire.FrameEOF, nil)
	b.Serve(t.Context(), req("wc", "-w"), op)
	if out, exit := op.output(); strings.TrimSpace(out) != "3" || exit.Code != 0 {
		t.Fatalf("wc -w said %q, exit %+v", out, exit)
	}

	op = newOperator()
	op.in <- sessionwire.EncodeFrame(sessionwire.FrameResize, []byte(`{"cols":0,"rows":99999}`))
	b.Serve(t.Context(), req("sleep", "30"), op)
	recs, _ := b.List(t.Context(), "default", Query{Limit: 1})
	if _, exit := op.output(); exit == nil || recs[0].EndedBy != "bad input" || !strings.Contains(exit.Error, "bad session frame") {
		t.Fatalf("exit %+v, record %+v", exit, recs[0])
	}
}

func TestAnUnreachableBoxIsRefused(t *testing.T) {
	st := newStore(t)
	b := newBroker(t, st, Config{Agents: unreachable{}})
	op := newOperator()
	b.Serve(t.Context(), req("true"), op)
	recs, _ := b.List(t.Context(), "default", Query{})
	if _, exit := op.output(); exit == nil || exit.Code != -1 || recs[0].EndedBy != "refused" {
		t.Fatalf("exit %+v, record %+v", exit, recs[0])
	}
}

type unreachable struct{}

func (unreachable) Conn(string) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///box", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return nil, errors.New("box offline") }))
}

// TestRecoverEndsWhatAStoppedConsoleLeftOpen: a record with no end, as a
// console killed mid-session leaves it, is ended at the next start, with
// its recording's state.
func TestRecoverEndsWhatAStoppedConsoleLeftOpen(t *testing.T) {
	st := newStore(t)
	b := newBroker(t, st, Config{})
	now := time.Now()
	rec := Record{ID: newID(now), TenantID: "default", Box: "bx-1", Kind: KindShell, User: "alice", Started: now}
	w, err := recording.Create(filepath.Join(b.cfg.Dir, "default"), rec.ID, recording.Header{Width: 80, Height: 24}, now, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Output(now, []byte("$ "))
	w.Flush() // and then the console died
	raw, _ := json.Marshal(rec)
	store.Put(t.Context(), st, key("default", rec.ID), raw)
	if err := b.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	r, _ := b.Get(t.Context(), "default", rec.ID)
	if r.Live() || r.EndedBy != "console stopped" || r.Recording == nil || r.Recording.Chunks != 2 {
		t.Fatalf("record %+v", r)
	}
	if es := audittest.Entries(t, st); len(es) != 1 || es[0].Action != "session.end" {
		t.Fatalf("audit %+v", es)
	}
}

func TestIDs(t *testing.T) {
	a, b := newID(time.Now()), newID(time.Now().Add(time.Millisecond))
	if !ValidID(a) || !ValidID(b) || b > a {
		t.Fatalf("%s then %s: IDs sort newest first", a, b)
	}
	for _, bad := range []string{"", "s", "x00000000000abcd", "s000000000zzabcd", "S00000000000ABCD", "s0000000000abcd/", "s00000000000abcde"} {
		if ValidID(bad) {
			t.Fatalf("%q valid", bad)
		}
	}
}

// TestAFourEyesSessionWaitsForASecondUser: on a box the tenant's rules
// match, a session runs only once another user approves it; that user
// watches it live and may end it. Unmatched boxes need nobody.
func TestAFourEyesSessionWaitsForASecondUser(t *testing.T) {
	st := newStore(t)
	b := newBroker(t, st, Config{})
	admin := audit.Actor{TenantID: "default", Name: "root"}
	if _, err := b.SetRules(t.Context(), admin, Rules{FourEyes: []BoxMatch{{}}}); err == nil {
		t.Fatal("a rule that matches every box was taken")
	}
	if _, err := b.SetRules(t.Context(), admin, Rules{FourEyes: []BoxMatch{{Labels: map[string]string{"money": "yes"}}}}); err != nil {
		t.Fatal(err)
	}
	// A box without the label: no wait.
	op := newOperator()
	b.Serve(t.Context(), req("echo", "plain"), op)
	if out, exit := op.output(); out != "plain\n" || exit.Code != 0 {
		t.Fatalf("unmatched box: %q %+v", out, exit)
	}

	r := req("sh", "-c", "echo approved; sleep 30")
	r.BoxLabels = map[string]string{"money": "yes"}
	op = newOperator()
	done := make(chan struct{})
	go func() { defer close(done); b.Serve(t.Context(), r, op) }()
	var id string
	for id == "" {
		<-op.got
		op.mu.Lock()
		for _, f := range op.out {
			var st sessionwire.SessionStatus
			if f.Type == sessionwire.FrameStatus && json.Unmarshal(f.Payload, &st) == nil && st.State == "waiting_approval" {
				id = st.Session
			}
		}
		op.mu.Unlock()
	}
	time.Sleep(200 * time.Millisecond)
	if out, _ := op.output(); out != "" {
		t.Fatalf("output before the approval: %q", out)
	}
	alice := audit.Actor{TenantID: "default", Name: "alice"}
	if err := b.Approve(t.Context(), alice, id); err == nil {
		t.Fatal("the session's own user approved it")
	}
	bob := audit.Actor{TenantID: "default", Name: "bob"}
	if err := b.Approve(t.Context(), audit.Actor{TenantID: "bank2", Name: "bob"}, id); err == nil {
		t.Fatal("approved from another tenant")
	}
	rec, _ := b.Get(t.Context(), "default", id)
	if b.CanEnd(rec, "bob") {
		t.Fatal("bob may end it before approving")
	}
	if err := b.Approve(t.Context(), bob, id); err != nil {
		t.Fatal(err)
	}
	if err := b.Approve(t.Context(), bob, id); err == nil {
		t.Fatal("approved twice")
	}
	for !strings.Contains(func() string { o, _ := op.output(); return o }(), "approved") {
		<-op.got
	}
	// Bob watches, then ends it.
	if !b.CanEnd(rec, "bob") || b.CanEnd(rec, "carol") {
		t.Fatal("who may end it")
	}
	watch := newOperator()
	watched := make(chan struct{})
	go func() { defer close(watched); b.Watch(t.Context(), "default", id, "bob", watch) }()
	for {
		<-watch.got
		watch.mu.Lock()
		n := len(watch.out)
		watch.mu.Unlock()
		if n > 0 {
			break
		}
	}
	if err := b.End("default", id, "bob"); err != nil {
		t.Fatal(err)
	}
	<-done
	<-watched
	if _, exit := watch.output(); exit == nil || exit.Error != "ended by bob" {
		t.Fatalf("the watcher saw the end as %+v", exit)
	}
	rec, _ = b.Get(t.Context(), "default", id)
	if !rec.FourEyes || rec.ApprovedBy != "bob" || rec.EndedBy != "user:bob" {
		t.Fatalf("record %+v", rec)
	}
	var actions []string
	for _, e := range audittest.Entries(t, st) {
		actions = append(actions, e.Actor+":"+e.Action)
	}
	if got := strings.Join(actions, ","); !strings.Contains(got, "bob:session.approve") || !strings.Contains(got, "bob:session.watch") {
		t.Fatalf("audit %s", got)
	}
}

func TestAFourEyesSessionNobodyApprovesEnds(t *testing.T) {
	st := newStore(t)
	b := newBroker(t, st, Config{ApprovalWait: 500 * time.Millisecond})
	b.SetRules(t.Context(), audit.Actor{TenantID: "default", Name: "root"}, Rules{FourEyes: []BoxMatch{{Site: "vault"}}})
	r := req("echo", "never")
	r.Site = "vault"
	op := newOperator()
	b.Serve(t.Context(), r, op)
	recs, _ := b.List(t.Context(), "default", Query{Limit: 1})
	if out, exit := op.output(); out != "" || exit == nil || !strings.Contains(exit.Error, "no second maintainer approved") || recs[0].EndedBy != "not approved" {
		t.Fatalf("output %q exit %+v record %+v", out, exit, recs[0])
	}
}

// TestAScreenOrForwardAsksFirst: on a four-eyes box a screen or forward
// asks for approval ahead; only its own user opens it, once, and only
// once another user approved it; one nobody approves ends.
func TestAScreenOrForwardAsksFirst(t *testing.T) {
	st := newStore(t)
	b := newBroker(t, st, Config{ApprovalWait: 2 * time.Second})
	ask := Asking{TenantID: "default", Box: "bx-1", User: "alice", Kind: KindScreen, Workload: "robot", ViewOnly: true}
	rec, err := b.Ask(t.Context(), ask)
	if err != nil {
		t.Fatal(err)
	}
	want := Record{TenantID: "default", Box: "bx-1", User: "alice", Kind: KindScreen, Workload: "robot", ViewOnly: true}
	if _, err := b.Take(rec.ID, want); err == nil {
		t.Fatal("taken before any approval")
	}
	if err := b.Approve(t.Context(), audit.Actor{TenantID: "default", Name: "alice"}, rec.ID); err == nil {
		t.Fatal("approved by its own user")
	}
	if err := b.Approve(t.Context(), audit.Actor{TenantID: "default", Name: "bob"}, rec.ID); err != nil {
		t.Fatal(err)
	}
	if r, _ := b.Get(t.Context(), "default", rec.ID); r.ApprovedBy != "bob" || !r.Live() {
		t.Fatalf("the record while it waits to open: %+v", r)
	}
	other := want
	other.ViewOnly = false // an interactive screen was not what was approved
	if _, err := b.Take(rec.ID, other); err == nil {
		t.Fatal("taken for another session than asked")
	}
	mallory := want
	mallory.User = "mallory"
	if _, err := b.Take(rec.ID, mallory); err == nil {
		t.Fatal("taken by another user")
	}
	got, err := b.Take(rec.ID, want)
	if err != nil || got.ApprovedBy != "bob" || got.ID != rec.ID {
		t.Fatalf("take: %+v %v", got, err)
	}
	if _, err := b.Take(rec.ID, want); err == nil {
		t.Fatal("taken twice")
	}

	// One nobody approves ends as such.
	rec, _ = b.Ask(t.Context(), Asking{TenantID: "default", Box: "bx-1", User: "alice", Kind: KindForward, Target: "10.0.0.5:80"})
	testWait(t, 10*time.Second, func() bool {
		r, _ := b.Get(t.Context(), "default", rec.ID)
		return !r.Live() && r.EndedBy == "not approved"
	})

	// One its user ends before opening it ends at once, approved or not,
	// and is not opened after.
	for _, approve := range []bool{false, true} {
		b = newBroker(t, st, Config{ApprovalWait: time.Hour})
		rec, _ = b.Ask(t.Context(), Asking{TenantID: "default", Box: "bx-1", User: "alice", Kind: KindForward, Target: "10.0.0.5:80"})
		if approve {
			if err := b.Approve(t.Context(), audit.Actor{TenantID: "default", Name: "bob"}, rec.ID); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.End("default", rec.ID, "alice"); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Take(rec.ID, Record{TenantID: "default", Box: "bx-1", User: "alice", Kind: KindForward, Target: "10.0.0.5:80"}); err == nil {
			t.Fatalf("an ended request (approved %v) was taken", approve)
		}
		testWait(t, 10*time.Second, func() bool {
			r, _ := b.Get(t.Context(), "default", rec.ID)
			return !r.Live() && r.EndedBy == "user:alice"
		})
	}
}

func testWait(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestAWatcherIsToldTheTerminalsSize(t *testing.T) {
	b := newBroker(t, newStore(t), Config{})
	r := req("sh", "-c", "echo ready; sleep 30")
	r.TTY, r.Cols, r.Rows = true, 100, 30
	op := newOperator()
	done := make(chan struct{})
	go func() { defer close(done); b.Serve(t.Context(), r, op) }()
	for !strings.Contains(func() string { o, _ := op.output(); return o }(), "ready") {
		<-op.got
	}
	recs, _ := b.List(t.Context(), "default", Query{Limit: 1})
	watch := newOperator()
	watched := make(chan struct{})
	go func() { defer close(watched); b.Watch(t.Context(), "default", recs[0].ID, "root", watch) }()
	// The sizes the watcher is told, in order, until the one wanted.
	sizes := func(want string) string {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			var got []string
			watch.mu.Lock()
			for _, f := range watch.out {
				var st sessionwire.SessionStatus
				if f.Type == sessionwire.FrameStatus && json.Unmarshal(f.Payload, &st) == nil {
					got = append(got, fmt.Sprintf("%s %dx%d", st.State, st.Cols, st.Rows))
				}
			}
			watch.mu.Unlock()
			if s := strings.Join(got, ", "); strings.HasSuffix(s, want) {
				return s
			}
			select {
			case <-watch.got:
			case <-deadline:
				t.Fatalf("the watcher was told %q, not %q", got, want)
			}
		}
	}
	sizes("watching 100x30")
	op.in <- sessionwire.EncodeJSONFrame(sessionwire.FrameResize, sessionwire.Resize{Cols: 132, Rows: 43})
	if got := sizes("resized 132x43"); got != "watching 100x30, resized 132x43" {
		t.Fatalf("told %s", got)
	}
	if err := b.End("default", recs[0].ID, "root"); err != nil {
		t.Fatal(err)
	}
	<-done
	<-watched
}

// TestAReplicaEndsOnlyWhatNobodyRuns: among console replicas, a replica's
// start ends the records its own last run left open and those of
// replicas that stopped, never those another replica runs; and its sweep
// while it runs ends only the stopped replicas'.
func TestAReplicaEndsOnlyWhatNobodyRuns(t *testing.T) {
	st := newStore(t)
	b := newBroker(t, st, Config{Replica: "r-self", Replicas: func() []string { return []string{"r-self", "r-other"} }})
	now := time.Now()
	put := func(replica string) string {
		rec := Record{ID: newID(now), TenantID: "default", Box: "bx-1", Kind: KindShell, User: "alice", Started: now, Replica: replica}
		now = now.Add(time.Millisecond)
		raw, _ := json.Marshal(rec)
		store.Put(t.Context(), st, key("default", rec.ID), raw)
		return rec.ID
	}
	live := func(id string) bool {
		r, err := b.Get(t.Context(), "default", id)
		if err != nil {
			t.Fatal(err)
		}
		return r.Live()
	}
	mine, others, dead := put("r-self"), put("r-other"), put("r-dead")
	if err := b.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	if live(mine) || !live(others) || live(dead) {
		t.Fatalf("after the start: own live %v, another replica's live %v, a stopped replica's live %v", live(mine), live(others), live(dead))
	}
	// While it runs: the other replica stops, and this one has a record
	// open that it is about to run.
	mine = put("r-self")
	if err := b.recover(t.Context(), false, func(id string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if !live(mine) || live(others) {
		t.Fatalf("after a sweep: own live %v, the stopped replica's live %v", live(mine), live(others))
	}
}

// TestARecordIsEndedOnceItsReplicaIsGoneTwice: a replica missing at one
// look (cut off from etcd for a moment) keeps its sessions' records; one
// missing at two looks in a row has them ended by the others.
func TestARecordIsEndedOnceItsReplicaIsGoneTwice(t *testing.T) {
	st := newStore(t)
	var mu sync.Mutex
	looks := [][]string{{"r-self", "r-b"}, {"r-self"}, {"r-self", "r-b"}, {"r-self"}, {"r-self"}}
	n := 0
	replicas := func() []string {
		mu.Lock()
		defer mu.Unlock()
		l := looks[min(n, len(looks)-1)]
		n++
		return l
	}
	lookN := func() int { mu.Lock(); defer mu.Unlock(); return n }
	b := newBroker(t, st, Config{Replica: "r-self", Replicas: replicas, LookEvery: 300 * time.Millisecond})
	now := time.Now()
	rec := Record{ID: newID(now), TenantID: "default", Box: "bx-1", Kind: KindShell, User: "alice", Started: now, Replica: "r-b"}
	raw, _ := json.Marshal(rec)
	store.Put(t.Context(), st, key("default", rec.ID), raw)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); b.sweepStopped(ctx) }()
	defer func() { cancel(); <-done }()
	for lookN() < 4 { // the start's look, missing, back, missing once
		time.Sleep(5 * time.Millisecond)
	}
	if r, _ := b.Get(t.Context(), "default", rec.ID); !r.Live() {
		t.Fatal("a record was ended while its replica had been missing at one look only")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if r, _ := b.Get(t.Context(), "default", rec.ID); !r.Live() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the record of a replica missing at two looks in a row was not ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
