package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/enroll"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// harnesses returns a fresh environment of each kind.
var harnesses = map[string]func(t *testing.T) testenv.Harness{
	"inprocess": func(t *testing.T) testenv.Harness { return testenv.NewInProcess(t, testenv.Options{}) },
	"binaries":  func(t *testing.T) testenv.Harness { return testenv.NewBinaries(t) },
}

// scenario runs f on every harness, in parallel.
func scenario(t *testing.T, f func(t *testing.T, h testenv.Harness)) {
	t.Parallel()
	for name, mk := range harnesses {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, mk(t))
		})
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestEnrollAndComeOnline(t *testing.T) {
	scenario(t, func(t *testing.T, h testenv.Harness) {
		tok := h.Token(t, api.TokenRequest{Region: "east", Site: "shop-1", Labels: map[string]string{"bank": "icbc"}})
		box, err := h.Enroll(t, tok, "robot-host-1")
		if err != nil {
			t.Fatalf("enroll: %v", err)
		}
		b := testenv.BoxState(t, h, box.ID())
		if b.Name != "robot-host-1" || b.Region != "east" || b.Site != "shop-1" || b.Labels["bank"] != "icbc" || b.State != "approved" {
			t.Fatalf("enrolled box is %+v", b)
		}
		if b.Online {
			t.Fatal("box online before its agent runs")
		}
		box.Start(t)
		took := testenv.WaitFor(t, 15*time.Second, "box online", func() bool { return testenv.BoxState(t, h, box.ID()).Online })
		t.Logf("online %v after agent start", took)
		testenv.WaitFor(t, 10*time.Second, "host facts", func() bool {
			b := testenv.BoxState(t, h, box.ID())
			return b.OS != "" && b.Arch != "" && b.AgentVersion != "" && b.CPUs > 0
		})
		// The same box by name.
		if got, err := h.Admin().Box(ctx(t), "robot-host-1"); err != nil || got.ID != box.ID() {
			t.Fatalf("box by name: %+v, %v", got, err)
		}
		entries, err := h.Admin().Audit(ctx(t), 100, box.ID())
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) == 0 || entries[0].Action != "box.enroll" || entries[0].Remote == "" {
			t.Fatalf("audit for box: %+v", entries)
		}
	})
}

func TestEnrollmentRefusals(t *testing.T) {
	scenario(t, func(t *testing.T, h testenv.Harness) {
		// Reused.
		tok := h.Token(t, api.TokenRequest{Region: "east", Site: "a"})
		if _, err := h.Enroll(t, tok, "first"); err != nil {
			t.Fatal(err)
		}
		_, err := h.Enroll(t, tok, "second")
		wantErr(t, "reused token", err, "already used (1 of 1 uses)")

		// Malformed.
		_, err = h.Enroll(t, "ebx1.this-is-not-a-token", "x")
		wantErr(t, "malformed token", err, "not a valid enrollment token")
		_, err = h.Enroll(t, tok[:len(tok)-7], "x")
		wantErr(t, "truncated token", err, "not a valid enrollment token")

		// Pinned to another CA: the console is not trusted, nothing is sent.
		parsed, perr := enroll.ParseToken(h.Token(t, api.TokenRequest{Region: "east", Site: "a"}))
		if perr != nil {
			t.Fatal(perr)
		}
		parsed.CAHash[0] ^= 0xff
		_, err = h.Enroll(t, parsed.String(), "x")
		wantErr(t, "wrong-CA token", err, "not the console that made this token")

		// Revoked token.
		text := h.Token(t, api.TokenRequest{Region: "east", Site: "a", Uses: 5})
		p2, _ := enroll.ParseToken(text)
		if err := h.Admin().RevokeToken(ctx(t), p2.IDString()); err != nil {
			t.Fatal(err)
		}
		_, err = h.Enroll(t, text, "x")
		wantErr(t, "revoked token", err, "was revoked")

		// A token of N uses enrolls N boxes.
		multi := h.Token(t, api.TokenRequest{Region: "east", Site: "a", Uses: 2})
		for _, n := range []string{"m1", "m2"} {
			if _, err := h.Enroll(t, multi, n); err != nil {
				t.Fatalf("use of a 2-use token: %v", err)
			}
		}
		_, err = h.Enroll(t, multi, "m3")
		wantErr(t, "third use of 2-use token", err, "already used (2 of 2 uses)")
	})
}

func wantErr(t *testing.T, what string, err error, substr string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), substr) {
		t.Fatalf("%s: got error %v, want one saying %q", what, err, substr)
	}
}

func TestRevokeDropsLiveSessionWithinASecond(t *testing.T) {
	scenario(t, func(t *testing.T, h testenv.Harness) {
		box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "a"}), "doomed")
		if err != nil {
			t.Fatal(err)
		}
		box.Start(t)
		testenv.WaitFor(t, 15*time.Second, "box online", func() bool { return testenv.BoxState(t, h, box.ID()).Online })
		start := time.Now()
		b, err := h.Admin().Revoke(ctx(t), box.ID())
		if err != nil {
			t.Fatal(err)
		}
		if b.State != "revoked" {
			t.Fatalf("state after revoke: %s", b.State)
		}
		testenv.WaitFor(t, time.Second-time.Since(start), "session dropped", func() bool { return !testenv.BoxState(t, h, box.ID()).Online })
		t.Logf("session dropped %v after the revoke call", time.Since(start))
		// It stays out: the agent keeps redialling and is refused.
		time.Sleep(2 * time.Second)
		if testenv.BoxState(t, h, box.ID()).Online {
			t.Fatal("revoked box came back online")
		}
		entries, _ := h.Admin().Audit(ctx(t), 10, box.ID())
		if last := entries[len(entries)-1]; last.Action != "box.revoke" || last.Actor != "admin" {
			t.Fatalf("last audit entry %+v", last)
		}
	})
}

func TestWaitingRoomUntilApproved(t *testing.T) {
	scenario(t, func(t *testing.T, h testenv.Harness) {
		box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "a", RequireApproval: true}), "newcomer")
		if err != nil {
			t.Fatal(err)
		}
		box.Start(t)
		testenv.WaitFor(t, 15*time.Second, "waiting box connected", func() bool { return testenv.BoxState(t, h, box.ID()).Online })
		if s := testenv.BoxState(t, h, box.ID()).State; s != "pending" {
			t.Fatalf("state %q, want pending", s)
		}
		if _, err := h.Admin().Approve(ctx(t), box.ID()); err != nil {
			t.Fatal(err)
		}
		if s := testenv.BoxState(t, h, box.ID()).State; s != "approved" {
			t.Fatalf("state %q after approve", s)
		}
		_, err = h.Admin().Approve(ctx(t), box.ID())
		var se *api.StatusError
		if !errors.As(err, &se) || se.Status != 409 || !strings.Contains(se.Message, "already approved") {
			t.Fatalf("second approve: %v", err)
		}
	})
}

func TestReconnectAfterConsoleRestart(t *testing.T) {
	scenario(t, func(t *testing.T, h testenv.Harness) {
		box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "a"}), "survivor")
		if err != nil {
			t.Fatal(err)
		}
		box.Start(t)
		testenv.WaitFor(t, 15*time.Second, "box online", func() bool { return testenv.BoxState(t, h, box.ID()).Online })
		if _, err := h.Admin().Label(ctx(t), box.ID(), map[string]string{"bank": "boc"}); err != nil {
			t.Fatal(err)
		}
		h.RestartConsole(t)
		took := testenv.WaitFor(t, 20*time.Second, "box back online", func() bool { return testenv.BoxState(t, h, box.ID()).Online })
		t.Logf("back online %v after the console restarted", took)
		if b := testenv.BoxState(t, h, box.ID()); b.Labels["bank"] != "boc" {
			t.Fatalf("labels lost across restart: %+v", b.Labels)
		}
	})
}

func TestAPIErrorsAreJSONForOperators(t *testing.T) {
	scenario(t, func(t *testing.T, h testenv.Harness) {
		_, err := h.Admin().Box(ctx(t), "no-such-box")
		var se *api.StatusError
		if !errors.As(err, &se) || se.Status != 404 || !strings.Contains(se.Message, `no box with ID or name "no-such-box"`) {
			t.Fatalf("missing box: %v", err)
		}
		_, err = h.Admin().CreateToken(ctx(t), api.TokenRequest{Region: "East Coast", Site: "a"})
		if !errors.As(err, &se) || se.Status != 400 || !strings.Contains(se.Message, `region "East Coast"`) {
			t.Fatalf("bad region: %v", err)
		}
		// A wrong API token is refused with a hint.
		bad, err2 := api.NewClient(h.URL(), "ebxa_wrong", caOf(t, h))
		if err2 != nil {
			t.Fatal(err2)
		}
		_, err = bad.Boxes(ctx(t))
		if !errors.As(err, &se) || se.Status != 401 || !strings.Contains(se.Message, "API token is not valid") {
			t.Fatalf("wrong API token: %v", err)
		}
		// Failed mutating calls are audited too.
		entries, _ := h.Admin().Audit(ctx(t), 5, "")
		if last := entries[len(entries)-1]; !strings.HasPrefix(last.Result, "failed") {
			t.Fatalf("failed call not audited: %+v", last)
		}
	})
}

// caOf fetches the console CA the way a first login does, pinned by the
// admin client's own trust.
func caOf(t *testing.T, h testenv.Harness) []byte {
	t.Helper()
	return testenv.FetchCA(t, h.URL())
}
