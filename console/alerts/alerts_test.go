package alerts

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/keys"
	"github.com/edgebox/edgebox/console/rollout"
	"github.com/edgebox/edgebox/console/sitehealth"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/console/store/storetest"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// world is what the rules look at in these tests: the facts the
// console's parts would give, set by the test.
type world struct {
	mu       sync.Mutex
	health   map[string]sitehealth.State
	keys     []keys.Key
	statuses map[string][]*edgeboxv1.ObjectStatus
	rollouts []rollout.Rollout
}

var boxes = []fleet.Box{
	{ID: "bx-1", TenantID: "bank1", Name: "teller-1", Region: "east", Site: "branch-7", State: fleet.StateApproved, CertNotAfter: time.Now().Add(90 * 24 * time.Hour)},
	{ID: "bx-2", TenantID: "bank1", Name: "teller-2", Region: "east", Site: "branch-7", State: fleet.StateApproved, CertNotAfter: time.Now().Add(3 * 24 * time.Hour)},
	{ID: "bx-3", TenantID: "bank1", Name: "waiting", Region: "east", Site: "branch-7", State: fleet.StatePending},
}

func (w *world) facts() Facts {
	return Facts{
		Boxes: func(context.Context, string) ([]fleet.Box, error) { return boxes, nil },
		Health: func(_ context.Context, b fleet.Box) (sitehealth.State, string) {
			w.mu.Lock()
			defer w.mu.Unlock()
			if s, ok := w.health[b.ID]; ok {
				return s, "as the test says"
			}
			return sitehealth.Online, ""
		},
		Keys: func(context.Context, string) ([]keys.Key, error) {
			w.mu.Lock()
			defer w.mu.Unlock()
			return w.keys, nil
		},
		Statuses: func(_ context.Context, box string) ([]*edgeboxv1.ObjectStatus, error) {
			w.mu.Lock()
			defer w.mu.Unlock()
			return w.statuses[box], nil
		},
		Rollouts: func(context.Context, string) ([]rollout.Rollout, error) {
			w.mu.Lock()
			defer w.mu.Unlock()
			return w.rollouts, nil
		},
	}
}

func (w *world) set(f func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f()
}

// hook is a webhook server that records what it took, and fails the
// first fail posts.
type hook struct {
	*httptest.Server
	mu       sync.Mutex
	fail     int
	tries    int
	got      []Payload
	bad      []string // what was wrong with a post
	secret   string
	received chan struct{}
}

func newHook(t *testing.T, fail int, secret string) *hook {
	h := &hook{fail: fail, secret: secret, received: make(chan struct{}, 100)}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		defer h.mu.Unlock()
		h.tries++
		if h.fail > 0 {
			h.fail--
			http.Error(w, "not now", http.StatusServiceUnavailable)
			return
		}
		if h.secret != "" {
			m := hmac.New(sha256.New, []byte(h.secret))
			m.Write(body)
			if r.Header.Get("X-Edgebox-Signature") != "sha256="+hex.EncodeToString(m.Sum(nil)) {
				h.bad = append(h.bad, "a wrong signature: "+r.Header.Get("X-Edgebox-Signature"))
			}
		}
		var p Payload
		if err := json.Unmarshal(body, &p); err != nil {
			h.bad = append(h.bad, err.Error())
		}
		if r.Header.Get("X-Edgebox-Delivery") != p.Delivery {
			h.bad = append(h.bad, "the delivery header is not the payload's")
		}
		h.got = append(h.got, p)
		h.received <- struct{}{}
	}))
	t.Cleanup(h.Close)
	return h
}

// posts returns what the hook took, as "status kind subject" lines.
func (h *hook) posts(t *testing.T) []string {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, b := range h.bad {
		t.Error(b)
	}
	var out []string
	for _, p := range h.got {
		out = append(out, p.Status+" "+string(p.Incident.Kind)+" "+p.Incident.Subject)
	}
	return out
}

// clock is a test's time, moved by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type env struct {
	st    store.Store
	w     *world
	clock *clock
	s     *Service
}

var admin = audit.Actor{TenantID: "bank1", Name: "ops"}

func newEnv(t *testing.T, st store.Store) *env {
	t.Helper()
	if st == nil {
		st = storetest.Bolt(t)
	}
	e := &env{st: st, w: &world{health: map[string]sitehealth.State{}, statuses: map[string][]*edgeboxv1.ObjectStatus{}},
		clock: &clock{now: time.Now()}}
	s, err := New(Config{Store: st, Tenants: func(context.Context) ([]string, error) { return []string{"bank1"}, nil },
		Facts: e.w.facts(), Every: time.Hour, RetryMin: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond,
		Now: e.clock.Now, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	e.s = s
	return e
}

// run runs the service until the test ends.
func (e *env) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

func (e *env) evaluate(t *testing.T) {
	t.Helper()
	if err := e.s.Evaluate(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func (e *env) setRules(t *testing.T, r Rules) {
	t.Helper()
	if _, err := e.s.SetRules(context.Background(), admin, r); err != nil {
		t.Fatal(err)
	}
}

// pending counts the notices in the outbox.
func pending(st store.Store) (int, error) {
	kvs, _, err := st.Range(context.Background(), outboxPrefix, 0)
	return len(kvs), err
}

// settle waits until the outbox is empty, then a little for a post that
// should not come.
func (e *env) settle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := pending(e.st)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d notices still in the outbox", n)
		}
		e.s.wakeOutbox()
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
}

func equal(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("%s:\n got %q\nwant %q", what, got, want)
	}
}

// TestAnIncidentIsToldOnceAndItsEndOnce: a box offline for its rule's
// minutes fires once however many rounds see it, and is resolved once;
// a webhook with a secret gets signed posts.
func TestAnIncidentIsToldOnceAndItsEndOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	h := newHook(t, 0, "s3cret")
	e.setRules(t, Rules{Rules: []Rule{{Kind: BoxOffline, ForMinutes: 5}}, Webhooks: []Webhook{{URL: h.URL, Secret: "s3cret"}}})
	e.run(t)
	e.w.set(func() { e.w.health["bx-1"] = sitehealth.DisconnectedRunning })
	e.evaluate(t)
	open, _ := e.s.Open(context.Background(), "bank1")
	if len(open) != 1 || open[0].State != Pending {
		t.Fatalf("want one pending incident, got %+v", open)
	}
	e.clock.add(4 * time.Minute)
	e.evaluate(t)
	e.settle(t)
	equal(t, "posts before the rule's minutes", h.posts(t), nil)
	e.clock.add(time.Minute)
	for range 3 {
		e.evaluate(t)
		e.clock.add(time.Minute)
	}
	e.settle(t)
	equal(t, "posts of an incident", h.posts(t), []string{"firing box-offline box teller-1"})
	e.w.set(func() { e.w.health["bx-1"] = sitehealth.Online })
	e.evaluate(t)
	e.evaluate(t)
	e.settle(t)
	equal(t, "posts once it ended", h.posts(t), []string{"firing box-offline box teller-1", "resolved box-offline box teller-1"})
	if open, _ := e.s.Open(context.Background(), "bank1"); len(open) != 0 {
		t.Errorf("incidents left open: %+v", open)
	}
	res, _ := e.s.Resolved(context.Background(), "bank1", 10)
	if len(res) != 1 || res[0].FiredAt.IsZero() || res[0].ResolvedAt.IsZero() {
		t.Errorf("resolved: %+v", res)
	}
	// A condition gone before its minutes leaves nothing behind.
	e.w.set(func() { e.w.health["bx-2"] = sitehealth.Down })
	e.evaluate(t)
	e.w.set(func() { e.w.health["bx-2"] = sitehealth.Online })
	e.evaluate(t)
	e.settle(t)
	if res, _ := e.s.Resolved(context.Background(), "bank1", 10); len(res) != 1 {
		t.Errorf("a pending incident that ended is in the history: %+v", res)
	}
	equal(t, "posts after a short blip", h.posts(t), []string{"firing box-offline box teller-1", "resolved box-offline box teller-1"})
}

// TestAFailingWebhookIsTriedAgain: a webhook that fails twice gets the
// notice on the third try, once.
func TestAFailingWebhookIsTriedAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	h := newHook(t, 2, "")
	e.setRules(t, Rules{Rules: []Rule{{Kind: BoxDown}}, Webhooks: []Webhook{{URL: h.URL}}})
	e.run(t)
	e.w.set(func() { e.w.health["bx-2"] = sitehealth.Down })
	e.evaluate(t)
	deadline := time.Now().Add(10 * time.Second)
	for len(h.posts(t)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the webhook never took the notice")
		}
		e.clock.add(time.Second) // past each retry's wait
		time.Sleep(20 * time.Millisecond)
	}
	e.settle(t)
	equal(t, "posts", h.posts(t), []string{"firing box-down box teller-2"})
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.tries != 3 {
		t.Errorf("the webhook was tried %d times, want 3", h.tries)
	}
}

// TestANoticeOutlivesTheConsole: a notice written by a console that
// stopped before it posted is posted by the next.
func TestANoticeOutlivesTheConsole(t *testing.T) {
	t.Parallel()
	st := storetest.Bolt(t)
	first := newEnv(t, st)
	h := newHook(t, 0, "")
	first.setRules(t, Rules{Rules: []Rule{{Kind: KeyBroken}}, Webhooks: []Webhook{{URL: h.URL}}})
	first.w.set(func() { first.w.keys = []keys.Key{{ID: "k1", BoxID: "bx-1", State: keys.Stuck, Holder: "robot"}} })
	first.evaluate(t) // never runs its outbox
	if n, _ := pending(st); n != 1 {
		t.Fatalf("the outbox holds %d notices, want 1", n)
	}
	next := newEnv(t, st)
	next.w.set(func() { next.w.keys = []keys.Key{{ID: "k1", BoxID: "bx-1", State: keys.Stuck, Holder: "robot"}} })
	next.run(t)
	next.evaluate(t)
	next.settle(t)
	equal(t, "posts", h.posts(t), []string{"firing key-broken key k1 on box teller-1"})
}

// TestSilences: an incident that fires under a silence is told when the
// silence ends; one that ends under it is never told.
func TestSilences(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	h := newHook(t, 0, "")
	e.setRules(t, Rules{Rules: []Rule{{Kind: WorkloadUnhealthy}, {Kind: RolloutStopped}}, Webhooks: []Webhook{{URL: h.URL}}})
	e.run(t)
	ctx := context.Background()
	if _, err := e.s.Silence(ctx, admin, Silence{}, time.Hour); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a silence of everything: %v", err)
	}
	sil, err := e.s.Silence(ctx, admin, Silence{Box: "teller-1", Comment: "replacing its disk"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Silence(ctx, admin, Silence{Kind: RolloutStopped}, 30*time.Minute); err != nil {
		t.Fatal(err)
	}
	e.w.set(func() {
		e.w.statuses["bx-1"] = []*edgeboxv1.ObjectStatus{{Kind: edgeboxv1.KindWorkload, Name: "robot", Phase: "Running", Health: "unhealthy", Restarts: 3}}
		e.w.statuses["bx-2"] = []*edgeboxv1.ObjectStatus{{Kind: edgeboxv1.KindWorkload, Name: "robot", Phase: "Failed", Reason: "StartFailed"}}
		e.w.rollouts = []rollout.Rollout{{ID: "r1", App: "robot", From: "1", To: "2", State: rollout.Stopped, Reason: "3 boxes failed"}}
	})
	e.evaluate(t)
	e.settle(t)
	equal(t, "posts under silences", h.posts(t), []string{"firing workload-unhealthy workload robot on box teller-2"})
	open, _ := e.s.Open(ctx, "bank1")
	silenced := 0
	for _, in := range open {
		if in.Silenced {
			silenced++
		}
	}
	if silenced != 2 {
		t.Errorf("%d incidents silenced, want 2: %+v", silenced, open)
	}
	// The rollout's ends under its silence; the box's silence is ended
	// while its workload still fails.
	e.w.set(func() { e.w.rollouts = nil })
	e.evaluate(t)
	if err := e.s.Unsilence(ctx, admin, sil.ID); err != nil {
		t.Fatal(err)
	}
	e.evaluate(t)
	e.settle(t)
	equal(t, "posts after the silences", h.posts(t), []string{
		"firing workload-unhealthy workload robot on box teller-2",
		"firing workload-unhealthy workload robot on box teller-1"})
	if err := e.s.Unsilence(ctx, admin, sil.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ending a silence twice: %v", err)
	}
}

// TestRulesGoneResolve: incidents of a kind no longer watched are
// resolved, and a certificate near its end is one.
func TestRulesGoneResolve(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	h := newHook(t, 0, "")
	e.setRules(t, Rules{Rules: []Rule{{Kind: CertExpiry, Days: 7}}, Webhooks: []Webhook{{URL: h.URL}}})
	e.run(t)
	e.evaluate(t)
	e.setRules(t, Rules{Webhooks: []Webhook{{URL: h.URL}}})
	e.evaluate(t)
	e.settle(t)
	equal(t, "posts", h.posts(t), []string{"firing cert-expiry box teller-2", "resolved cert-expiry box teller-2"})
}

// TestSecretsAreNotReadBack: reads say a webhook has a secret, never
// what; an update without it keeps it.
func TestSecretsAreNotReadBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	h := newHook(t, 0, "kept")
	e.setRules(t, Rules{Rules: []Rule{{Kind: BoxDown}}, Webhooks: []Webhook{{URL: h.URL, Secret: "kept"}}})
	r, err := e.s.GetRules(context.Background(), "bank1")
	if err != nil {
		t.Fatal(err)
	}
	if r.Webhooks[0].Secret != "" || !r.Webhooks[0].HasSecret || r.UpdatedBy != "ops" {
		t.Fatalf("read back: %+v", r)
	}
	e.setRules(t, r) // as a client that read and wrote back
	e.run(t)
	e.w.set(func() { e.w.health["bx-1"] = sitehealth.Down })
	e.evaluate(t)
	e.settle(t)
	equal(t, "posts", h.posts(t), []string{"firing box-down box teller-1"}) // its signature checked by the hook
}

func TestBadRules(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		r    Rules
		want string
	}{
		{"unknown kind", Rules{Rules: []Rule{{Kind: "box-sad"}}}, "unknown kind"},
		{"twice", Rules{Rules: []Rule{{Kind: BoxDown}, {Kind: BoxDown}}}, "second rule"},
		{"negative minutes", Rules{Rules: []Rule{{Kind: BoxDown, ForMinutes: -1}}}, "for_minutes"},
		{"days elsewhere", Rules{Rules: []Rule{{Kind: BoxDown, Days: 3}}}, "cert-expiry only"},
		{"not a URL", Rules{Webhooks: []Webhook{{URL: "ftp://x/y"}}}, "not an http"},
		{"no host", Rules{Webhooks: []Webhook{{URL: "https:///hook"}}}, "not an http"},
		{"a password", Rules{Webhooks: []Webhook{{URL: "https://u:p@x/hook"}}}, "password"},
		{"twice listed", Rules{Webhooks: []Webhook{{URL: "https://x/h"}, {URL: "https://x/h"}}}, "twice"},
		{"long URL", Rules{Webhooks: []Webhook{{URL: "https://x/" + strings.Repeat("a", 3000)}}}, "longer"},
		{"many", Rules{Webhooks: func() (w []Webhook) {
			for i := range MaxWebhooks + 1 {
				w = append(w, Webhook{URL: "https://x/" + strings.Repeat("a", i)})
			}
			return w
		}()}, "at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.r.Validate()
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an invalid error saying %q", err, tc.want)
			}
		})
	}
}

// TestEndedSilencesGo: a silence is listed until it ends, and kept a
// day after, then a round drops it.
func TestEndedSilencesGo(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := context.Background()
	if _, err := e.s.Silence(ctx, admin, Silence{Site: "branch-7"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	kept := func() int {
		kvs, _, err := e.st.Range(ctx, silencesPrefix("bank1"), 0)
		if err != nil {
			t.Fatal(err)
		}
		return len(kvs)
	}
	e.clock.add(2 * time.Hour)
	e.evaluate(t)
	if l, _ := e.s.Silences(ctx, "bank1"); len(l) != 0 || kept() != 1 {
		t.Fatalf("an hour after its end: %d listed, %d kept; want 0 and 1", len(l), kept())
	}
	e.clock.add(24 * time.Hour)
	e.evaluate(t)
	if kept() != 0 {
		t.Error("a silence that ended a day ago is still kept")
	}
}
