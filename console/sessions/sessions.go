// Package sessions brokers remote maintenance sessions: an operator's
// shell or command on a box or in a workload, carried between the
// operator's WebSocket and the box's AgentService.Exec over its tunnel.
//
// The broker records every session: a record on the store, written with
// an audit entry when the session opens and again when it ends, and the
// terminal's output as an asciicast v2 recording, flushed every second and
// hash-chained (package recording). A console killed mid-session loses at
// most the last second of the recording; its next start ends the record
// as "the console stopped", with what the recording holds.
//
// Sessions end when the process ends, when they sit idle (no byte either
// way) for IdleTimeout, after MaxDuration, when a user ends them (End), or
// when the box goes.
//
// Records live on the store under
//
//	sessions/<tenant>/<id>
//
// where an ID sorts newest first.
package sessions

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/recording"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/errdefs/errgrpc"
	"github.com/edgebox/edgebox/sessionwire"
)

// Prefix is where session records live on the store.
const Prefix = "sessions/"

// Kinds of session.
const (
	KindShell = "shell" // an interactive terminal
	KindExec  = "exec"  // a command, its output and exit code
)

// Record is a session as the store keeps it. EndedBy says what ended
// it: "exit", "idle", "time limit", "user:<name>", "box", "operator
// left", "bad input", "refused", "not approved", "recording failed",
// "console stopped".
type Record struct {
	ID       string   `json:"id"`
	TenantID string   `json:"tenant_id"`
	Box      string   `json:"box"`
	BoxName  string   `json:"box_name,omitempty"`
	Workload string   `json:"workload,omitempty"`
	Kind     string   `json:"kind"`
	Command  []string `json:"command,omitempty"`
	TTY      bool     `json:"tty"`
	User     string   `json:"user"`
	Remote   string   `json:"remote,omitempty"`
	// Replica is the console replica the session runs on, when the
	// console runs as several.
	Replica  string     `json:"replica,omitempty"`
	Started  time.Time  `json:"started"`
	Ended    *time.Time `json:"ended,omitempty"`
	EndedBy  string     `json:"ended_by,omitempty"`
	ExitCode *int       `json:"exit_code,omitempty"`
	Signal   string     `json:"signal,omitempty"`
	Error    string     `json:"error,omitempty"`
	BytesIn  int64      `json:"bytes_in"`
	BytesOut int64      `json:"bytes_out"`
	// Recording is what the session's recording held when it ended.
	Recording *RecordingSummary `json:"recording,omitempty"`
	// Target is a forward's "host:port", as the box sees it; Conns how
	// many connections it carried.
	Target string `json:"target,omitempty"`
	Conns  int64  `json:"conns,omitempty"`
	// ViewOnly: a VM screen that passed no key, pointer or clipboard.
	ViewOnly bool `json:"view_only,omitempty"`
	// FourEyes: the session needed a second user's approval; ApprovedBy
	// gave it.
	FourEyes   bool       `json:"four_eyes,omitempty"`
	ApprovedBy string     `json:"approved_by,omitempty"`
	ApprovedAt *time.Time `json:"approved_at,omitempty"`
}

// Live reports whether the session has not ended.
func (r Record) Live() bool { return r.Ended == nil }

// RecordingSummary is a recording's state when its session ended: its
// chunks, bytes, and the last chunk's hash, which the chain must end on.
type RecordingSummary struct {
	Chunks    int    `json:"chunks"`
	Bytes     int64  `json:"bytes"`
	Head      string `json:"head"`
	Truncated bool   `json:"truncated,omitempty"`
}

// Agents reaches a box's AgentService.
type Agents interface {
	Conn(box string) (*grpc.ClientConn, error)
}

// Config is what a Broker needs.
type Config struct {
	Store  store.Store
	Agents Agents
	// Tunnel opens forward streams to boxes.
	Tunnel Tunnel
	// Dir holds the recordings, a directory per tenant.
	Dir string
	// IdleTimeout ends a session with no byte either way for that long;
	// 0 is 30 min.
	IdleTimeout time.Duration
	// MaxDuration ends every session after it; 0 is 8 h.
	MaxDuration time.Duration
	// MaxRecording bounds one recording's bytes; 0 is 256 MiB.
	MaxRecording int64
	// MaxLive bounds the sessions open at once, console-wide; 0 is 256.
	MaxLive int
	// ApprovalWait bounds how long a four-eyes session waits for its
	// approval; 0 is 10 min.
	ApprovalWait time.Duration
	Now          func() time.Time
	Log          *slog.Logger
	// Replica is this console's replica ID when it is one of several;
	// Replicas lists the replicas that run, this one included. A record
	// left open is ended only when its replica is this one (at start), or
	// one that stopped: missing from Replicas at two looks a minute apart,
	// so that a replica cut off from etcd for a moment keeps its sessions'
	// records.
	Replica  string
	Replicas func() []string
	// LookEvery is how often Replicas is looked at; 0 is a minute.
	LookEvery time.Duration
}

// Broker runs sessions.
type Broker struct {
	cfg Config

	mu   sync.Mutex
	live map[string]*live
	wg   sync.WaitGroup
}

// live is a running session.
type live struct {
	rec    Record
	cancel context.CancelCauseFunc
	// approve takes the approver's name, once, for a four-eyes session.
	approve chan string

	mu       sync.Mutex
	approved string // who approved it
	watchers map[*watcher]struct{}
	// asking: a screen's or forward's request for approval, not a session
	// yet; taken closes when it opens.
	asking   bool
	taken    chan struct{}
	askEnded <-chan struct{} // closed when the request was ended
	closed   bool            // the session ended: no more watchers
	// size is the terminal's, which watchers are shown at; zero without
	// a terminal.
	size sessionwire.Resize
}

// New returns a Broker.
func New(cfg Config) *Broker {
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 30 * time.Minute
	}
	if cfg.MaxDuration <= 0 {
		cfg.MaxDuration = 8 * time.Hour
	}
	if cfg.MaxRecording <= 0 {
		cfg.MaxRecording = 256 << 20
	}
	if cfg.MaxLive <= 0 {
		cfg.MaxLive = 256
	}
	if cfg.ApprovalWait <= 0 {
		cfg.ApprovalWait = 10 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Broker{cfg: cfg, live: make(map[string]*live)}
}

// Request is an operator's ask for a session.
type Request struct {
	TenantID string
	Box      string
	BoxName  string
	Workload string
	Command  []string
	TTY      bool
	Cols     int
	Rows     int
	Term     string
	User     string // the actor, as the audit log names it
	Remote   string
	// The box's labels, region and site, which the tenant's four-eyes
	// rules match.
	BoxLabels    map[string]string
	Region, Site string
}

// Operator is the operator's side of a session: one frame per message.
type Operator interface {
	ReadMessage() ([]byte, error)
	WriteMessage([]byte) error
	// Close ends the connection; a ReadMessage waiting returns.
	Close() error
}

// Ending causes.
var (
	errIdle     = errors.New("idle")
	errTooLong  = errors.New("time limit")
	errOpGone   = errors.New("operator left")
	errShutdown = errors.New("console stopped")
	errOver     = errors.New("session over")
	errRecorder = errors.New("recording failed")
	errBoxGone  = errors.New("box")
)

// endedBy is a user who ended a session.
type endedBy struct{ user string }

func (e endedBy) Error() string { return "user:" + e.user }

// newID returns a session ID that sorts newest first.
func newID(now time.Time) string {
	var r [2]byte
	rand.Read(r[:])
	return fmt.Sprintf("s%011x%s", uint64(1<<44-1)-uint64(now.UnixMilli()), hex.EncodeToString(r[:]))
}

func key(tenant, id string) string { return Prefix + tenant + "/" + id }

// ValidID reports whether id can be a session's ID.
func ValidID(id string) bool {
	if len(id) != 16 || id[0] != 's' {
		return false
	}
	_, err := hex.DecodeString(id[1:] + "0")
	return err == nil && strings.ToLower(id) == id
}

// Serve runs one session for req with op until it ends, and closes op.
// The box, tenant and the caller's right to open it are checked before;
// the tenant's rules may still hold it for a second user's approval.
func (b *Broker) Serve(ctx context.Context, req Request, op Operator) {
	defer op.Close()
	now := b.cfg.Now()
	kind := KindExec
	if len(req.Command) == 0 {
		kind = KindShell
	}
	rec := Record{ID: newID(now), TenantID: req.TenantID, Box: req.Box, BoxName: req.BoxName, Workload: req.Workload,
		Kind: kind, Command: req.Command, TTY: req.TTY, User: req.User, Remote: req.Remote, Started: now}
	refuse := func(msg string) {
		op.WriteMessage(sessionwire.EncodeJSONFrame(sessionwire.FrameExit, sessionwire.SessionExit{Code: -1, Error: msg}))
	}
	fourEyes, err := b.NeedsApproval(ctx, req)
	if err != nil {
		b.cfg.Log.Error("the tenant's session rules could not be read; the session does not run", "err", err)
		refuse("the console could not read the tenant's session rules; the session does not run")
		return
	}
	rec.FourEyes = fourEyes
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	l := &live{rec: rec, cancel: cancel, watchers: map[*watcher]struct{}{}}
	if req.TTY {
		l.size = sessionwire.Resize{Cols: max(req.Cols, 1), Rows: max(req.Rows, 1)}
	}
	if fourEyes {
		l.approve = make(chan string, 1)
	}
	b.mu.Lock()
	if len(b.live) >= b.cfg.MaxLive {
		b.mu.Unlock()
		refuse(fmt.Sprintf("the console runs %d sessions, its most; try again later", b.cfg.MaxLive))
		return
	}
	b.live[rec.ID] = l
	b.wg.Add(1)
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.live, rec.ID)
		b.mu.Unlock()
		l.closeWatchers()
		b.wg.Done()
	}()

	if err := b.put(ctx, rec, audit.Entry{TenantID: rec.TenantID, Actor: rec.User, Remote: rec.Remote,
		Action: "session.open", Target: target(rec), Result: "ok", Detail: openDetail(rec)}); err != nil {
		b.cfg.Log.Error("a session could not be recorded; it does not run", "box", rec.Box, "err", err)
		refuse("the console could not record the session; it does not run")
		return
	}
	s := &relay{b: b, live: l, rec: rec, op: op, cancel: cancel, frames: make(chan sessionwire.Frame, 32)}
	exit := s.run(sctx, req)
	ended := b.cfg.Now()
	s.rec.Ended = &ended
	exitMsg := sessionwire.EncodeJSONFrame(sessionwire.FrameExit, exit)
	op.WriteMessage(exitMsg)
	l.broadcast(exitMsg)
	cancel(errOver) // a reader waiting to hand on a frame lets go
	op.Close()      // ends the operator's input
	s.inputs.Wait()
	s.rec.BytesIn, s.rec.BytesOut = s.in.Load(), s.out.Load()
	result := "ok"
	if exit.Error != "" {
		result = exit.Error
	}
	// The end is written even when the caller has gone.
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer wcancel()
	if err := b.put(wctx, s.rec, audit.Entry{TenantID: rec.TenantID, Actor: rec.User, Remote: rec.Remote,
		Action: "session.end", Target: target(rec), Result: result, Detail: endDetail(s.rec)}); err != nil {
		b.cfg.Log.Error("a session's end could not be recorded", "session", rec.ID, "err", err)
	}
}

// begin makes rec a live session (a forward's, a screen's) and writes
// its record with the audit entry action; done takes it off the live ones.
// It reports false, having done nothing, when the console is full or the
// record could not be written.
func (b *Broker) begin(ctx context.Context, rec Record, cancel context.CancelCauseFunc, action, detail string) (done func(), ok bool) {
	l := &live{rec: rec, cancel: cancel, watchers: map[*watcher]struct{}{}}
	b.mu.Lock()
	if len(b.live) >= b.cfg.MaxLive {
		b.mu.Unlock()
		return nil, false
	}
	b.live[rec.ID] = l
	b.wg.Add(1)
	b.mu.Unlock()
	done = func() {
		b.mu.Lock()
		delete(b.live, rec.ID)
		b.mu.Unlock()
		l.closeWatchers()
		b.wg.Done()
	}
	if err := b.put(ctx, rec, audit.Entry{TenantID: rec.TenantID, Actor: rec.User, Remote: rec.Remote,
		Action: action, Target: target(rec), Result: "ok", Detail: detail}); err != nil {
		b.cfg.Log.Error("a session could not be recorded; it does not run", "box", rec.Box, "kind", rec.Kind, "err", err)
		done()
		return nil, false
	}
	return done, true
}

// put writes rec with its audit entry, in one transaction.
func (b *Broker) put(ctx context.Context, rec Record, e audit.Entry) error {
	if rec.Replica == "" && rec.Live() {
		rec.Replica = b.cfg.Replica
	}
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	_, err = b.cfg.Store.Txn(ctx, store.Txn{Then: []store.Op{{Key: key(rec.TenantID, rec.ID), Value: raw}, audit.Op(b.cfg.Now(), e)}})
	return err
}

func target(r Record) string {
	if r.Workload != "" {
		return "box/" + r.Box + "/workload/" + r.Workload
	}
	return "box/" + r.Box
}

func openDetail(r Record) string {
	if r.Kind == KindShell {
		return fmt.Sprintf("%s session %s (tty %v)", r.Kind, r.ID, r.TTY)
	}
	return fmt.Sprintf("%s session %s: %q (tty %v)", r.Kind, r.ID, r.Command, r.TTY)
}

func endDetail(r Record) string {
	d := fmt.Sprintf("session %s ended by %s after %s; %d bytes in, %d out", r.ID, r.EndedBy,
		r.Ended.Sub(r.Started).Round(time.Second), r.BytesIn, r.BytesOut)
	if r.ExitCode != nil {
		d += fmt.Sprintf("; exit code %d", *r.ExitCode)
	}
	if r.Recording != nil {
		d += fmt.Sprintf("; recording of %d chunks, last %s", r.Recording.Chunks, r.Recording.Head)
	}
	return d
}

// recordingDir is where a tenant's recordings are.
func (b *Broker) recordingDir(tenant string) string { return filepath.Join(b.cfg.Dir, tenant) }

// boxError says in a line what a box's gRPC error was.
func boxError(box string, err error) string {
	err = errgrpc.ToNative(err)
	if errdefs.Kind(err) == nil {
		return fmt.Sprintf("box %s went away: %v", box, err)
	}
	return fmt.Sprintf("box %s: %v", box, err)
}

func title(r Record) string {
	t := cmpOr(r.BoxName, r.Box)
	if r.Workload != "" {
		t += "/" + r.Workload
	}
	if len(r.Command) > 0 {
		t += ": " + strings.Join(r.Command, " ")
	}
	return t + " (" + r.User + ")"
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Live is how many sessions run now.
func (b *Broker) Live() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.live)
}

// Full reports whether the console runs as many sessions as it may.
func (b *Broker) Full() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.live) >= b.cfg.MaxLive
}

// End ends a live session on behalf of user. The caller has checked that
// user may.
func (b *Broker) End(tenant, id, user string) error {
	b.mu.Lock()
	l, ok := b.live[id]
	b.mu.Unlock()
	if !ok || l.rec.TenantID != tenant {
		return errdefs.NotFound("no live session %q", id)
	}
	l.cancel(endedBy{user: user})
	return nil
}

// Shutdown ends every live session, saying the console stops, and waits
// until each has written its end, or ctx ends.
func (b *Broker) Shutdown(ctx context.Context) {
	b.mu.Lock()
	for _, l := range b.live {
		l.cancel(errShutdown)
	}
	b.mu.Unlock()
	done := make(chan struct{})
	go func() { b.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// Get returns one session's record.
func (b *Broker) Get(ctx context.Context, tenant, id string) (Record, error) {
	if !ValidID(id) {
		return Record{}, errdefs.NotFound("no session %q", id)
	}
	kv, err := b.cfg.Store.Get(ctx, key(tenant, id))
	if errors.Is(err, store.ErrNotFound) {
		return Record{}, errdefs.NotFound("no session %q", id)
	} else if err != nil {
		return Record{}, err
	}
	var r Record
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		return Record{}, fmt.Errorf("session %s: %w", id, err)
	}
	return r, nil
}

// Query selects sessions of one tenant.
type Query struct {
	LiveOnly bool
	Box      string
	Limit    int // at most this many, newest first; 0 is 100, at most 1000
}

// maxListScan bounds the records one List reads.
const maxListScan = 20_000

// List returns a tenant's sessions, newest first.
func (b *Broker) List(ctx context.Context, tenant string, q Query) ([]Record, error) {
	if q.Limit <= 0 || q.Limit > 1000 {
		q.Limit = 100
	}
	var out []Record
	after := ""
	for scanned := 0; scanned < maxListScan && len(out) < q.Limit; {
		kvs, _, err := b.cfg.Store.Scan(ctx, Prefix+tenant+"/", after, 500)
		if err != nil {
			return nil, err
		}
		for _, kv := range kvs {
			var r Record
			if json.Unmarshal(kv.Value, &r) != nil {
				continue
			}
			if (q.LiveOnly && !r.Live()) || (q.Box != "" && r.Box != q.Box) {
				continue
			}
			out = append(out, r)
			if len(out) == q.Limit {
				break
			}
		}
		scanned += len(kvs)
		if len(kvs) < 500 {
			break
		}
		after = kvs[len(kvs)-1].Key
	}
	return out, nil
}

// Recover ends the records of sessions a console that stopped left open:
// they end when their recording last flushed, as "console stopped", with
// what the recording verifies to. Run it before serving sessions.
func (b *Broker) Recover(ctx context.Context) error {
	var running map[string]bool
	if b.cfg.Replicas != nil {
		running = setOf(b.cfg.Replicas())
	}
	return b.recover(ctx, true, func(id string) bool { return running[id] })
}

// recover ends the records left open by replicas not alive, and at start
// this console's own.
func (b *Broker) recover(ctx context.Context, start bool, alive func(replica string) bool) error {
	after := ""
	for {
		kvs, _, err := b.cfg.Store.Scan(ctx, Prefix, after, 500)
		if err != nil {
			return err
		}
		for _, kv := range kvs {
			var r Record
			if json.Unmarshal(kv.Value, &r) != nil || !r.Live() {
				continue
			}
			b.mu.Lock()
			_, running := b.live[r.ID]
			b.mu.Unlock()
			mine := r.Replica == "" || r.Replica == b.cfg.Replica
			others := !mine && alive(r.Replica)
			if running || others || (mine && !start) {
				continue
			}
			ended := r.Started
			rep, verr := recording.Verify(b.recordingDir(r.TenantID), r.ID, "")
			if verr == nil {
				r.Recording = &RecordingSummary{Chunks: rep.Chunks, Head: rep.Head}
				if cast, _ := recording.Paths(b.recordingDir(r.TenantID), r.ID); cast != "" {
					if t, ok := modTime(cast); ok && t.After(ended) {
						ended = t
					}
				}
			}
			r.Ended, r.EndedBy = &ended, errShutdown.Error()
			r.Error = "the console stopped during the session"
			if err := b.put(ctx, r, audit.Entry{TenantID: r.TenantID, Actor: r.User, Remote: r.Remote,
				Action: "session.end", Target: target(r), Result: r.Error, Detail: endDetail(r)}); err != nil {
				return err
			}
			b.cfg.Log.Info("ended the record of a session the console's last run left open", "session", r.ID, "box", r.Box)
		}
		if len(kvs) < 500 {
			return nil
		}
		after = kvs[len(kvs)-1].Key
	}
}

func modTime(path string) (time.Time, bool) {
	fi, err := os.Stat(path)
	if err != nil {
		return time.Time{}, false
	}
	return fi.ModTime(), true
}

// Run ends the records a stopped console left open, then waits for ctx
// and ends the live sessions, letting each write its end.
func (b *Broker) Run(ctx context.Context) error {
	if err := b.Recover(ctx); err != nil && ctx.Err() == nil {
		return fmt.Errorf("sessions: %w", err)
	}
	// Among replicas, the records a replica that died left open are
	// ended by the others.
	if b.cfg.Replicas != nil {
		b.sweepStopped(ctx)
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b.Shutdown(sctx)
	return nil
}

// sweepStopped looks at the replicas each minute until ctx ends, and ends
// the records of sessions a replica left open once it has been missing at
// two looks in a row. It reads the sessions only then.
func (b *Broker) sweepStopped(ctx context.Context) {
	t := time.NewTicker(cmp.Or(b.cfg.LookEvery, time.Minute))
	defer t.Stop()
	seen := setOf(b.cfg.Replicas())
	missing := map[string]bool{} // seen, then missing at a look
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := setOf(b.cfg.Replicas())
		dead := map[string]bool{} // missing at this look and the last
		for id := range missing {
			if now[id] {
				delete(missing, id) // back: it was cut off for a moment
			} else {
				dead[id] = true
			}
		}
		for id := range seen {
			if !now[id] {
				missing[id] = true
			}
		}
		seen = now
		if len(dead) == 0 {
			continue
		}
		alive := func(id string) bool { return !dead[id] && (now[id] || missing[id]) }
		if err := b.recover(ctx, false, alive); err != nil {
			if ctx.Err() == nil {
				b.cfg.Log.Warn("the records of sessions a stopped console replica left open were not ended; trying again in a minute", "err", err)
			}
			continue
		}
		for id := range dead {
			delete(missing, id)
		}
	}
}

func setOf(ids []string) map[string]bool {
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}

// OpenRecording opens a session's recording (.cast) for reading.
func (b *Broker) OpenRecording(r Record) (*os.File, error) {
	cast, _ := recording.Paths(b.recordingDir(r.TenantID), r.ID)
	f, err := os.Open(cast)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errdefs.NotFound("session %s has no recording", r.ID)
	}
	return f, err
}

// VerifyRecording checks a session's recording chunk by chunk, and, for
// a session that ended, that it ends on the chunk the console recorded.
func (b *Broker) VerifyRecording(r Record) (recording.Report, error) {
	head := ""
	if r.Recording != nil && !r.Live() {
		head = r.Recording.Head
	}
	rep, err := recording.Verify(b.recordingDir(r.TenantID), r.ID, head)
	if errors.Is(err, os.ErrNotExist) {
		return rep, errdefs.NotFound("session %s has no recording", r.ID)
	}
	return rep, err
}
