package fleet

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/audit/audittest"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/console/store/storetest"
	"github.com/edgebox/edgebox/enroll"
	"github.com/edgebox/edgebox/errdefs"
)

// openFleet returns a Fleet on a real bbolt store of the test's own, which
// can be made to fail audit writes.
func openFleet(t *testing.T) (*Fleet, *audittest.Store) {
	t.Helper()
	s := audittest.Wrap(storetest.Bolt(t))
	f, err := New(context.Background(), s, nil)
	if err != nil {
		t.Fatal(err)
	}
	return f, s
}

var admin = audit.Actor{TenantID: DefaultTenant, Name: "admin", Remote: "127.0.0.1"}

func issue(string) ([]byte, time.Time, error) { return []byte("cert"), time.Now().Add(time.Hour), nil }

func newToken(t *testing.T, f *Fleet, uses int) enroll.Token {
	t.Helper()
	tok, _, err := f.CreateToken(context.Background(), admin, TokenSpec{Region: "east", Site: "a", TTL: time.Hour, Uses: uses},
		"https://c:8443", sha256.Sum256([]byte("ca")), [32]byte{})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func enrollBox(t *testing.T, f *Fleet, tok enroll.Token) Box {
	t.Helper()
	b, _, err := f.Enroll(context.Background(), Enrollment{Token: tok, Hostname: "h", Issue: issue})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestTokenUsesAreExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, _ := openFleet(t)
	tok := newToken(t, f, 5)
	var ok, refused atomic.Int32
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := f.Enroll(ctx, Enrollment{Token: tok, Hostname: "h", Issue: issue})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, errdefs.ErrPermission):
				refused.Add(1)
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 5 || refused.Load() != 15 {
		t.Fatalf("%d enrolled, %d refused; want 5 and 15", ok.Load(), refused.Load())
	}
	if bs, err := f.Boxes(ctx, DefaultTenant); err != nil || len(bs) != 5 {
		t.Fatalf("%d boxes recorded (%v), want 5", len(bs), err)
	}
}

func TestWrongSecretRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, s := openFleet(t)
	tok := newToken(t, f, 1)
	forged := tok
	forged.Secret = make([]byte, enroll.SecretLen)
	if _, _, err := f.Enroll(ctx, Enrollment{Token: forged, Remote: "10.1.1.1", Issue: issue}); !errors.Is(err, errdefs.ErrPermission) {
		t.Fatalf("forged secret: %v", err)
	}
	// The refusal is audited on its own.
	es := audittest.Entries(t, s)
	if e := es[len(es)-1]; e.Action != "box.enroll" || e.Remote != "10.1.1.1" || !strings.Contains(e.Result, "not valid") {
		t.Fatalf("refusal audited as %+v", e)
	}
	// The real one still works: a forged try did not spend a use.
	if _, _, err := f.Enroll(ctx, Enrollment{Token: tok, Issue: issue}); err != nil {
		t.Fatalf("real token after a forged try: %v", err)
	}
}

func TestFailedIssueSpendsNoUse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, _ := openFleet(t)
	tok := newToken(t, f, 1)
	fail := func(string) ([]byte, time.Time, error) { return nil, time.Time{}, errors.New("CA unreadable") }
	if _, _, err := f.Enroll(ctx, Enrollment{Token: tok, Issue: fail}); err == nil || !strings.Contains(err.Error(), "CA unreadable") {
		t.Fatalf("enroll with a failing CA: %v", err)
	}
	if bs, _ := f.Boxes(ctx, DefaultTenant); len(bs) != 0 {
		t.Fatalf("%d boxes recorded by a failed enrollment", len(bs))
	}
	enrollBox(t, f, tok)
}

func TestRevocationSurvivesRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, s := openFleet(t)
	box := enrollBox(t, f, newToken(t, f, 1))
	if f.IsRevoked(box.ID) {
		t.Fatal("revoked before Revoke")
	}
	if _, err := f.Revoke(ctx, admin, box.ID); err != nil {
		t.Fatal(err)
	}
	if !f.IsRevoked(box.ID) {
		t.Fatal("not revoked in memory as Revoke returned")
	}
	f2, err := New(ctx, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !f2.IsRevoked(box.ID) {
		t.Fatal("revocation lost across a restart")
	}
	if _, err := f2.Approve(ctx, admin, box.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("approving a revoked box: %v", err)
	}
}

// run starts f.Run and stops it at the end of the test, checking that it
// returned nil.
func run(t *testing.T, f *Fleet) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// eventually waits, generously, for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRevokedByAnotherConsole: two consoles share a store (as replicas on
// etcd do); a box revoked through one is refused by the other, through the
// watch, also when the history it would have watched from is compacted.
func TestRevokedByAnotherConsole(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		newStore func(*testing.T) store.Store
	}{
		{"bbolt", func(t *testing.T) store.Store { return storetest.Bolt(t) }},
		{"etcd", newEtcd},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testRevokedByAnotherConsole(t, tc.newStore(t))
		})
	}
}

func testRevokedByAnotherConsole(t *testing.T, s store.Store) {
	ctx := context.Background()
	here, err := New(ctx, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	there, err := New(ctx, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok := newToken(t, there, 3)
	a, b, c := enrollBox(t, there, tok), enrollBox(t, there, tok), enrollBox(t, there, tok)

	stop := run(t, here)
	if _, err := there.Revoke(ctx, admin, a.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a revoke by another console seen here", func() bool { return here.IsRevoked(a.ID) })
	if _, err := there.RevokeToWipe(ctx, admin, b.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a revoke to wipe by another console seen here", func() bool { return here.IsRevoked(b.ID) })
	if here.IsRevoked(c.ID) {
		t.Fatal("a box nobody revoked is refused")
	}

	// Stopped, it misses a revocation and the history that held it.
	stop()
	if _, err := there.Revoke(ctx, admin, c.ID); err != nil {
		t.Fatal(err)
	}
	rev, err := s.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if here.IsRevoked(c.ID) {
		t.Fatal("revoked here with no watch running")
	}
	run(t, here)
	eventually(t, "a revoke in compacted history seen here", func() bool { return here.IsRevoked(c.ID) })
	if !here.IsRevoked(a.ID) || !here.IsRevoked(b.ID) {
		t.Fatal("a reload after compaction forgot earlier revocations")
	}
}

func TestRunEndsWithTheStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := storetest.Bolt(t)
	f, err := New(ctx, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	// Once Run follows its watch, the store closes under it.
	if _, err := store.Put(ctx, s, RevokedKey("bx-1"), []byte(DefaultTenant)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Run follows its watch", func() bool { return f.IsRevoked("bx-1") })
	s.Close()
	select {
	case err := <-done:
		if !errors.Is(err, store.ErrClosed) {
			t.Fatalf("Run on a closed store returned %v, want store.ErrClosed", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not end with its store")
	}
}

func TestTenantsSeeOnlyTheirOwn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, _ := openFleet(t)
	tok := newToken(t, f, 1)
	box := enrollBox(t, f, tok)
	other := audit.Actor{TenantID: "bank-b", Name: "eve"}
	if _, err := f.Box(ctx, other.TenantID, box.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("other tenant reads box: %v", err)
	}
	if _, err := f.Revoke(ctx, other, box.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("other tenant revokes box: %v", err)
	}
	if f.IsRevoked(box.ID) {
		t.Fatal("other tenant's revoke took")
	}
	if bs, _ := f.Boxes(ctx, other.TenantID); len(bs) != 0 {
		t.Fatalf("other tenant lists %d boxes", len(bs))
	}
	if ts, _ := f.Tokens(ctx, other.TenantID); len(ts) != 0 {
		t.Fatalf("other tenant lists %d tokens", len(ts))
	}
	if err := f.RevokeToken(ctx, other, tok.IDString()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("other tenant revokes token: %v", err)
	}
	if _, err := f.RecordWipe(ctx, other, box.ID, Wipe{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("other tenant records a wipe: %v", err)
	}
}

func TestLabelsValidated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, _ := openFleet(t)
	box := enrollBox(t, f, newToken(t, f, 1))
	b, err := f.Label(ctx, admin, box.ID, map[string]string{"bank": "icbc", "company": "acme"})
	if err != nil || b.Labels["bank"] != "icbc" {
		t.Fatalf("label: %+v %v", b.Labels, err)
	}
	b, err = f.Label(ctx, admin, box.ID, map[string]string{"bank": ""})
	if err != nil || len(b.Labels) != 1 {
		t.Fatalf("remove label: %+v %v", b.Labels, err)
	}
	if _, err := f.Label(ctx, admin, box.ID, map[string]string{"Bad Key": "x"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("bad key: %v", err)
	}
	if b, _ := f.Box(ctx, DefaultTenant, box.ID); len(b.Labels) != 1 || b.Labels["company"] != "acme" {
		t.Fatalf("stored labels %v", b.Labels)
	}
}

// TestEveryChangeIsAuditedOnce: each mutating operation leaves exactly one
// audit entry, and fails, changing nothing, when its entry cannot be
// written.
func TestEveryChangeIsAuditedOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, s := openFleet(t)
	tok := newToken(t, f, 10)
	boxes := make([]Box, 4)
	for i := range boxes {
		boxes[i] = enrollBox(t, f, tok)
	}
	var created EnrollToken
	for _, tc := range []struct {
		action string
		op     func() error
		check  func() error // after the op succeeded
	}{
		{"token.create", func() (err error) {
			_, created, err = f.CreateToken(ctx, admin, TokenSpec{Region: "west", Site: "b", TTL: time.Hour, Uses: 2},
				"https://c:8443", sha256.Sum256([]byte("ca")), [32]byte{})
			return err
		}, func() error {
			if ts, _ := f.Tokens(ctx, DefaultTenant); len(ts) != 2 {
				return fmt.Errorf("%d tokens, want 2 (the failed try none)", len(ts))
			}
			return nil
		}},
		{"token.revoke", func() error { return f.RevokeToken(ctx, admin, created.ID) }, nil},
		{"box.enroll", func() error {
			_, _, err := f.Enroll(ctx, Enrollment{Token: tok, Hostname: "h", Issue: issue})
			return err
		}, func() error {
			if bs, _ := f.Boxes(ctx, DefaultTenant); len(bs) != len(boxes)+1 {
				return fmt.Errorf("%d boxes, want %d", len(bs), len(boxes)+1)
			}
			return nil
		}},
		{"box.label", func() error {
			_, err := f.Label(ctx, admin, boxes[0].ID, map[string]string{"bank": "icbc"})
			return err
		}, nil},
		{"box.renew", func() error { return f.Renewed(ctx, boxes[0].ID, time.Now().Add(48*time.Hour)) }, nil},
		{"box.revoke", func() error {
			if f.IsRevoked(boxes[1].ID) {
				return errors.New("revoked before its revoke succeeded")
			}
			_, err := f.Revoke(ctx, admin, boxes[1].ID)
			return err
		}, func() error {
			if !f.IsRevoked(boxes[1].ID) {
				return errors.New("not refused after its revoke")
			}
			return nil
		}},
		{"box.revoke", func() error {
			_, err := f.RevokeToWipe(ctx, admin, boxes[2].ID)
			return err
		}, nil},
		{"box.wipe", func() error {
			_, err := f.RecordWipe(ctx, admin, boxes[2].ID, Wipe{Confirmed: true, Result: "ok"})
			return err
		}, nil},
	} {
		audittest.One(t, s, tc.action, tc.op)
		if tc.check != nil {
			if err := tc.check(); err != nil {
				t.Errorf("%s: %v", tc.action, err)
			}
		}
	}

	// Approval needs a box waiting for it.
	waiting, _, err := f.CreateToken(ctx, admin, TokenSpec{Region: "east", Site: "a", TTL: time.Hour, Uses: 1, RequireApproval: true},
		"https://c:8443", sha256.Sum256([]byte("ca")), [32]byte{})
	if err != nil {
		t.Fatal(err)
	}
	pending := enrollBox(t, f, waiting)
	if pending.State != StatePending {
		t.Fatalf("box enrolled with an approval token is %s", pending.State)
	}
	audittest.One(t, s, "box.approve", func() error {
		_, err := f.Approve(ctx, admin, pending.ID)
		return err
	})

	// Box reports are not audited.
	before := len(audittest.Entries(t, s))
	if _, err := f.ReportFacts(ctx, boxes[3].ID, Facts{Hostname: "h2"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := f.RecordSeen(ctx, map[string]time.Time{boxes[3].ID: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if n := len(audittest.Entries(t, s)); n != before {
		t.Fatalf("box reports left %d audit entries", n-before)
	}
}

// TestRecordSeenManyBoxes: last-seen times of more boxes than one
// transaction takes are all written; unknown boxes are skipped.
func TestRecordSeenManyBoxes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, _ := openFleet(t)
	const n = 2*maxTxnOps + 17
	tok := newToken(t, f, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := f.Enroll(ctx, Enrollment{Token: tok, Hostname: "h", Issue: issue}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	boxes, err := f.Boxes(ctx, DefaultTenant)
	if err != nil || len(boxes) != n {
		t.Fatalf("%d boxes (%v), want %d", len(boxes), err, n)
	}
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	seen := map[string]time.Time{"bx-unknown": at}
	for i, b := range boxes {
		seen[b.ID] = at.Add(time.Duration(i) * time.Second)
	}
	if err := f.RecordSeen(ctx, seen); err != nil {
		t.Fatal(err)
	}
	got, _ := f.Boxes(ctx, DefaultTenant)
	for _, b := range got {
		if !b.LastSeen.Equal(seen[b.ID]) {
			t.Fatalf("box %s last seen %v, want %v", b.ID, b.LastSeen, seen[b.ID])
		}
	}
	if _, err := f.BoxByID(ctx, "bx-unknown"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("an unknown box's last-seen time created it: %v", err)
	}
}

// TestReportsDoNotLoseChanges: box reports and an operator's changes of the
// same box at the same time all land.
func TestReportsDoNotLoseChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, _ := openFleet(t)
	box := enrollBox(t, f, newToken(t, f, 1))
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(3)
		go func() {
			defer wg.Done()
			if _, err := f.Label(ctx, admin, box.ID, map[string]string{fmt.Sprintf("l%d", i): "x"}); err != nil {
				t.Error(err)
			}
		}()
		go func() {
			defer wg.Done()
			if _, err := f.ReportFacts(ctx, box.ID, Facts{Hostname: "h", CPUs: 4}, time.Now()); err != nil {
				t.Error(err)
			}
		}()
		go func() {
			defer wg.Done()
			if err := f.RecordSeen(ctx, map[string]time.Time{box.ID: time.Now()}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	b, err := f.BoxByID(ctx, box.ID)
	if err != nil || len(b.Labels) != 20 || b.CPUs != 4 || b.LastSeen.IsZero() {
		t.Fatalf("after concurrent changes: %d labels, %d CPUs, last seen %v (%v)", len(b.Labels), b.CPUs, b.LastSeen, err)
	}
}

// flaky is a real store whose watches end with an error, and whose
// ranges fail, the first times they are asked: as an etcd that loses its
// leader does.
type flaky struct {
	store.Store
	watchFails, rangeFails atomic.Int32
}

var errNoLeader = errors.New("flaky: no leader")

func (s *flaky) Watch(ctx context.Context, prefix string, from int64) <-chan store.WatchResponse {
	if s.watchFails.Add(-1) >= 0 {
		ch := make(chan store.WatchResponse, 1)
		ch <- store.WatchResponse{Err: errNoLeader}
		close(ch)
		return ch
	}
	return s.Store.Watch(ctx, prefix, from)
}

func (s *flaky) Range(ctx context.Context, prefix string, limit int) ([]store.KV, int64, error) {
	if s.rangeFails.Add(-1) >= 0 {
		return nil, 0, errNoLeader
	}
	return s.Store.Range(ctx, prefix, limit)
}

// TestRunOutlastsAFailingStore: while the store fails for a while, Run
// goes on trying and then sees the revocations it missed.
func TestRunOutlastsAFailingStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := &flaky{Store: storetest.Bolt(t)}
	here, err := New(ctx, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	there, err := New(ctx, s.Store, nil)
	if err != nil {
		t.Fatal(err)
	}
	box := enrollBox(t, there, newToken(t, there, 1))
	s.watchFails.Store(3)
	s.rangeFails.Store(3)
	run(t, here)
	if _, err := there.Revoke(ctx, admin, box.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a revoke seen once the store works again", func() bool { return here.IsRevoked(box.ID) })
	if s.watchFails.Load() > 0 || s.rangeFails.Load() > 0 {
		t.Fatalf("the store's failures were not all met: %d watches and %d ranges left", s.watchFails.Load(), s.rangeFails.Load())
	}
}

// TestHelloThatChangesNothingWritesNothing: a box that reconnects and says
// what its record already says costs no write, however long ago it was
// seen (its last-seen time is the presence tracker's to write, in
// batches); new facts are written.
func TestHelloThatChangesNothingWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, s := openFleet(t)
	box := enrollBox(t, f, newToken(t, f, 1))
	facts := Facts{Hostname: "h", OS: "linux", Arch: "amd64", AgentVersion: "1.2.0", Capability: 1, CPUs: 4, MemoryBytes: 8 << 30}
	t0 := time.Now()
	rev := func() int64 {
		r, err := s.Revision(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, c := range []struct {
		name  string
		facts Facts
		seen  time.Time
		write bool
	}{
		{"first hello", facts, t0, true},
		{"the same, 30 s later", facts, t0.Add(30 * time.Second), false},
		{"the same, 59 s later", facts, t0.Add(59 * time.Second), false},
		{"the same, an hour later", facts, t0.Add(time.Hour), false},
		{"a new agent version", Facts{Hostname: "h", OS: "linux", Arch: "amd64", AgentVersion: "1.3.0", Capability: 1, CPUs: 4, MemoryBytes: 8 << 30}, t0.Add(60 * time.Second), true},
		{"the same, 2 minutes after that", Facts{Hostname: "h", OS: "linux", Arch: "amd64", AgentVersion: "1.3.0", Capability: 1, CPUs: 4, MemoryBytes: 8 << 30}, t0.Add(3 * time.Minute), false},
	} {
		before := rev()
		b, err := f.ReportFacts(ctx, box.ID, c.facts, c.seen)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if wrote := rev() != before; wrote != c.write {
			t.Errorf("%s: wrote %t, want %t", c.name, wrote, c.write)
		}
		if !b.facts().equal(c.facts) || b.Name != box.Name {
			t.Errorf("%s: answered %+v", c.name, b)
		}
	}
}
