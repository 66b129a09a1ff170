package auth

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/store/storetest"
	"github.com/edgebox/edgebox/errdefs"
)

var testHash = HashParams{Time: 1, Memory: 64, Threads: 1}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newUsers(t *testing.T) (*Users, *clock) {
	clk := &clock{t: time.Date(2026, 11, 1, 9, 0, 0, 0, time.UTC)}
	return NewUsers(storetest.Bolt(t), NewHasher(testHash, 2, time.Minute), clk.now), clk
}

var root = audit.Actor{TenantID: ConsoleTenant, Name: "root"}

func TestPasswordsHashAndVerify(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := NewHasher(DefaultHashParams, 1, time.Minute)
	hash, err := h.Hash(ctx, "correct horse battery")
	if err != nil || !strings.HasPrefix(hash, "$argon2id$v=19$m=65536,t=3,p=1$") {
		t.Fatalf("hash %q, %v", hash, err)
	}
	if again, _ := h.Hash(ctx, "correct horse battery"); again == hash {
		t.Fatal("two hashes of one password are equal: no salt")
	}
	for pw, want := range map[string]bool{"correct horse battery": true, "correct horse batterY": false, "": false} {
		if ok, err := h.Verify(ctx, hash, pw); err != nil || ok != want {
			t.Errorf("verify %q: %v %v, want %v", pw, ok, err, want)
		}
	}
	if ok, err := h.Verify(ctx, "", "anything"); ok || err != nil {
		t.Errorf("no hash (unknown user) matched: %v %v", ok, err)
	}
}

// FuzzParseHash: a stored hash of any shape is refused or read within the
// bounds, never a panic nor a cost past them.
func FuzzParseHash(f *testing.F) {
	h := NewHasher(testHash, 1, time.Minute)
	good, _ := h.Hash(context.Background(), "a long enough password")
	for _, s := range []string{good, "", "$argon2id$v=19$m=1,t=1,p=1$$", "$argon2id$v=19$m=99999999999,t=1,p=1$YWJjZGVmZ2g$YWJjZGVmZ2hpamtsbW5vcA",
		"$argon2i$v=19$m=64,t=1,p=1$YWJjZGVmZ2g$YWJjZGVmZ2hpamtsbW5vcA", "$argon2id$v=19$t=1$a$b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ph, err := parseHash(s)
		if err != nil {
			return
		}
		if ph.Time > maxHashTime || ph.Memory > maxHashMemory || len(ph.key) > 64 {
			t.Fatalf("read %q past the bounds: %+v", s, ph.HashParams)
		}
	})
}

func TestHasherBoundsConcurrentHashes(t *testing.T) {
	t.Parallel()
	h := NewHasher(testHash, 1, 50*time.Millisecond)
	h.slots <- struct{}{} // the one slot is taken
	if _, err := h.Hash(context.Background(), "a long enough password"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("hash with no slot free: %v, want unavailable", err)
	}
	<-h.slots
	if _, err := h.Hash(context.Background(), "a long enough password"); err != nil {
		t.Fatal(err)
	}
}

func TestUsersAndRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, _ := newUsers(t)
	if _, err := u.CreateTenant(ctx, root, "bank1", "Bank One"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, pw, tenant string
		role             Role
		kind             error
	}{
		{"Alice", "a long enough password", "bank1", Operator, errdefs.ErrInvalid},
		{"alice", "short", "bank1", Operator, errdefs.ErrInvalid},
		{"alice", strings.Repeat("x", MaxPassword+1), "bank1", Operator, errdefs.ErrInvalid},
		{"alice", "a long enough password", "bank1", "boss", errdefs.ErrInvalid},
		{"alice", "a long enough password", "bank9", Operator, errdefs.ErrNotFound},
		{"<script>", "a long enough password", "bank1", Operator, errdefs.ErrInvalid},
	} {
		if _, err := u.Create(ctx, root, tc.name, tc.pw, tc.tenant, tc.role); !errors.Is(err, tc.kind) {
			t.Errorf("create %q in %s as %s: %v, want %v", tc.name, tc.tenant, tc.role, err, tc.kind)
		}
	}
	if _, err := u.Create(ctx, root, "alice", "a long enough password", "bank1", Operator); err != nil {
		t.Fatal(err)
	}
	if _, err := u.Create(ctx, root, "alice", "another long password", "bank1", Viewer); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second alice: %v", err)
	}
	usr, err := u.SetRole(ctx, root, "alice", ConsoleTenant, Auditor)
	if err != nil || usr.Roles["bank1"] != Operator || usr.Roles[ConsoleTenant] != Auditor {
		t.Fatalf("roles %v, %v", usr.Roles, err)
	}
	if got := usr.Tenants(); strings.Join(got, ",") != "bank1,default" {
		t.Errorf("tenants %v", got)
	}
	if list, _ := u.List(ctx, "bank1"); len(list) != 1 {
		t.Errorf("bank1 lists %d users", len(list))
	}
	if usr, err = u.SetRole(ctx, root, "alice", "bank1", ""); err != nil || len(usr.Roles) != 1 {
		t.Fatalf("after taking bank1 away: %v %v", usr.Roles, err)
	}
	if list, _ := u.List(ctx, "bank1"); len(list) != 0 {
		t.Errorf("bank1 still lists %d users", len(list))
	}
	if _, err := u.Authenticate(ctx, "alice", "a long enough password"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range [][2]string{{"alice", "wrong password!"}, {"nobody", "a long enough password"}, {"alice", ""}, {"../x", "y"}} {
		if _, err := u.Authenticate(ctx, tc[0], tc[1]); !errors.Is(err, errdefs.ErrPermission) || err.Error() != "wrong user name or password" {
			t.Errorf("authenticate %q: %v", tc[0], err)
		}
	}
	if err := u.SetPassword(ctx, root, "alice", "a new long password"); err != nil {
		t.Fatal(err)
	}
	if _, err := u.Authenticate(ctx, "alice", "a long enough password"); err == nil {
		t.Error("the old password still works")
	}
	if err := u.Delete(ctx, root, "alice"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := u.Get(ctx, "alice"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("deleted alice: %v", err)
	}
	if _, err := u.CreateTenant(ctx, root, ConsoleTenant, "again"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("creating the console's tenant: %v", err)
	}
	ts, err := u.Tenants(ctx)
	if err != nil || len(ts) != 2 || ts[0].ID != ConsoleTenant || ts[1].Name != "Bank One" {
		t.Errorf("tenants %+v %v", ts, err)
	}
}

func TestSessionsEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, clk := newUsers(t)
	usr, err := u.Create(ctx, root, "bob", "a long enough password", ConsoleTenant, Viewer)
	if err != nil {
		t.Fatal(err)
	}
	start := func() string {
		ck, s, err := u.StartSession(ctx, usr, "192.0.2.1", time.Hour)
		if err != nil || s.CSRF == "" || len(ck) < 40 {
			t.Fatalf("session %q %+v %v", ck, s, err)
		}
		return ck
	}
	over := func(ck, why string) {
		t.Helper()
		if _, _, err := u.CheckSession(ctx, ck); !errors.Is(err, ErrSessionOver) {
			t.Errorf("%s: %v, want the session over", why, err)
		}
	}
	a, b := start(), start()
	if _, got, err := u.CheckSession(ctx, a); err != nil || got.Name != "bob" {
		t.Fatalf("check: %+v %v", got, err)
	}
	over("", "empty cookie")
	over(a+"x", "another cookie")
	over(strings.Repeat("a", 1000), "a long cookie")
	if err := u.EndSession(ctx, a); err != nil {
		t.Fatal(err)
	}
	over(a, "logged out")
	if _, _, err := u.CheckSession(ctx, b); err != nil {
		t.Fatalf("the other session ended with the first: %v", err)
	}
	clk.add(time.Hour)
	over(b, "expired")
	c, d := start(), start()
	if err := u.LogOutEverywhere(ctx, root, "bob"); err != nil {
		t.Fatal(err)
	}
	over(c, "logged out everywhere")
	over(d, "logged out everywhere")
	usr, _, _ = u.Get(ctx, "bob")
	e := start()
	if err := u.SetPassword(ctx, root, "bob", "a new long password"); err != nil {
		t.Fatal(err)
	}
	over(e, "password changed")
	n, err := u.SweepSessions(ctx)
	if err != nil || n != 4 { // b expired; c, d, e of an old epoch
		t.Fatalf("swept %d, %v; want 4", n, err)
	}
	if kvs, _, _ := u.s.Range(ctx, SessionsPrefix, 0); len(kvs) != 0 {
		t.Errorf("%d sessions left", len(kvs))
	}
}

func TestThrottleSlowsGuessersAndNobodyElse(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Date(2026, 11, 1, 9, 0, 0, 0, time.UTC)}
	th := NewThrottle(DefaultThrottleConfig, clk.now)
	// 50 wrong passwords in a row for alice from one address, each as soon
	// as the throttle allows.
	var waited time.Duration
	for range 50 {
		w := th.Wait("alice", "203.0.113.9")
		clk.add(w)
		waited += w
		th.Failed("alice", "203.0.113.9")
	}
	if waited < time.Hour {
		t.Errorf("50 guesses took %v of waiting, want over an hour", waited)
	}
	if w := th.Wait("bob", "198.51.100.1"); w != 0 {
		t.Errorf("another user from another address waits %v", w)
	}
	if w := th.Wait("alice", "198.51.100.1"); w <= 0 || w > DefaultThrottleConfig.UserMax {
		t.Errorf("alice from her own address waits %v, want up to %v", w, DefaultThrottleConfig.UserMax)
	}
	if w := th.Wait("bob", "203.0.113.9"); w <= DefaultThrottleConfig.UserMax {
		t.Errorf("the guessing address trying bob waits %v, want its own longer wait", w)
	}
	th.Succeeded("alice", "198.51.100.1")
	if w := th.Wait("alice", "198.51.100.1"); w != 0 {
		t.Errorf("after a good login alice waits %v", w)
	}
	// Memory is bounded: a flood of addresses keeps at most MaxKeys.
	small := NewThrottle(ThrottleConfig{Free: 1, UserMax: time.Second, AddrMax: time.Second, Forget: time.Minute, MaxKeys: 100}, clk.now)
	for i := range 1000 {
		small.Failed("u"+strings.Repeat("x", i%7), "a"+string(rune('a'+i%26))+strings.Repeat("y", i))
		clk.add(10 * time.Millisecond)
	}
	if n := small.Len(); n > 100 {
		t.Errorf("throttle holds %d keys, bound 100", n)
	}
}

// TestAUserMadeAgainUnderTheNameIsAnother: a deleted user's tokens and
// sessions stay dead when a new user takes the name.
func TestAUserMadeAgainUnderTheNameIsAnother(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u, _ := newUsers(t)
	toks := New(u.s)
	old, err := u.Create(ctx, root, "carol", "a long enough password", ConsoleTenant, Viewer)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := toks.Create(ctx, APIToken{Name: "cli", User: "carol", UserID: old.ID})
	if err != nil {
		t.Fatal(err)
	}
	ck, _, err := u.StartSession(ctx, old, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Delete(ctx, root, "carol"); err != nil {
		t.Fatal(err)
	}
	if _, err := u.Create(ctx, root, "carol", "another long password", ConsoleTenant, Admin); err != nil {
		t.Fatal(err)
	}
	rec, err := toks.Check(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := u.Principal(ctx, rec); !errors.Is(err, errdefs.ErrPermission) {
		t.Errorf("the old carol's token acts as the new carol: %+v %v", p, err)
	}
	if _, _, err := u.CheckSession(ctx, ck); !errors.Is(err, ErrSessionOver) {
		t.Errorf("the old carol's session: %v", err)
	}
}
