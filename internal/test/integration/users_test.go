package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// TestUsersRolesAndTenantsThroughTheCLI: the admin the console made at its
// first start logs in with its password, makes a tenant and a user; the
// user logs in, works in the tenant as its role allows and no further,
// changes its password and makes a token; all of it outlives a crash of
// the console; and a user removed from its last tenant is gone, tokens
// and all.
func TestUsersRolesAndTenantsThroughTheCLI(t *testing.T) {
	t.Parallel()
	h := testenv.NewBinaries(t)
	blk, _ := pem.Decode(h.CAPEM())
	sum := sha256.Sum256(blk.Bytes)
	caHash := hex.EncodeToString(sum[:])
	dir := t.TempDir()
	as := func(who string, env ...string) func(args ...string) (string, error) {
		env = append(env, "EDGEBOX_CONFIG="+filepath.Join(dir, who+".json"))
		return func(args ...string) (string, error) { return h.CLIWith(t, env, args...) }
	}
	must := func(run func(...string) (string, error), args ...string) string {
		t.Helper()
		out, err := run(args...)
		if err != nil {
			t.Fatalf("edgebox %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	refused := func(run func(...string) (string, error), want string, args ...string) {
		t.Helper()
		out, err := run(args...)
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("edgebox %s: %v\n%s\nwant it refused with %q", strings.Join(args, " "), err, out, want)
		}
	}

	admin := as("admin", "EDGEBOX_PASSWORD="+h.AdminPassword(), "EDGEBOX_NEW_PASSWORD=alice's first password")
	if out := must(admin, "login", h.URL(), "--ca-sha256", caHash, "--user", "admin"); !strings.Contains(out, "as admin, admin in tenant default") {
		t.Fatalf("admin login: %s", out)
	}
	refused(as("guesser", "EDGEBOX_PASSWORD=not the password"), "wrong user name or password",
		"login", h.URL(), "--ca-sha256", caHash, "--user", "admin")
	must(admin, "tenant", "create", "bank1", "--name", "Bank One")
	must(admin, "user", "create", "alice", "--role", "operator")
	adminInBank1 := as("admin", "EDGEBOX_TENANT=bank1")
	if out := must(adminInBank1, "user", "role", "alice", "viewer"); !strings.Contains(out, "bank1=viewer") || !strings.Contains(out, "default=operator") {
		t.Fatalf("alice's roles: %s", out)
	}
	tok := h.Token(t, api.TokenRequest{Region: "east", Site: "a"}) // a box of the console's own tenant
	if _, err := h.Enroll(t, tok, "default-box"); err != nil {
		t.Fatal(err)
	}

	alice := as("alice", "EDGEBOX_PASSWORD=alice's first password", "EDGEBOX_NEW_PASSWORD=alice's second password")
	if out := must(alice, "login", h.URL(), "--ca-sha256", caHash, "--user", "alice", "--tenant", "bank1"); !strings.Contains(out, "as alice, viewer in tenant bank1") {
		t.Fatalf("alice's login: %s", out)
	}
	if out := must(alice, "boxes", "ls"); strings.Contains(out, "default-box") {
		t.Errorf("alice in bank1 sees the console's box:\n%s", out)
	}
	refused(alice, "may not do this", "token", "create", "--region", "east", "--site", "a")
	refused(alice, "may not do this", "audit", "ls")
	refused(alice, "may not do this", "app", "create", "robot")
	if out, err := as("alice", "EDGEBOX_TENANT=bank9")("boxes", "ls"); err == nil || !strings.Contains(out, `no tenant "bank9"`) {
		t.Errorf("alice in a tenant she is not in: %v %s", err, out)
	}
	aliceHome := as("alice", "EDGEBOX_TENANT=default")
	if out := must(aliceHome, "boxes", "ls"); !strings.Contains(out, "default-box") {
		t.Errorf("alice as operator in default does not see its box:\n%s", out)
	}
	must(aliceHome, "app", "create", "robot")
	must(alice, "user", "passwd")
	refused(as("alice-old", "EDGEBOX_PASSWORD=alice's first password"), "wrong user name or password",
		"login", h.URL(), "--ca-sha256", caHash, "--user", "alice")
	out := must(alice, "apitoken", "create", "ci", "--ttl", "24h", "-o", "json")
	var ci api.APIToken
	if err := json.Unmarshal([]byte(out), &ci); err != nil || !strings.HasPrefix(ci.Token, "ebxa_") {
		t.Fatalf("apitoken create: %v %s", err, out)
	}
	withCI := as("alice-ci", "EDGEBOX_TOKEN="+ci.Token)
	must(withCI, "login", h.URL(), "--ca-sha256", caHash, "--token", ci.Token, "--tenant", "bank1")
	if out := must(alice, "apitoken", "ls"); !strings.Contains(out, "ci") || !strings.Contains(out, "cli@") {
		t.Errorf("alice's tokens:\n%s", out)
	}

	h.RestartConsole(t)
	if out := must(alice, "whoami"); !strings.Contains(out, "alice") || !strings.Contains(out, "bank1") {
		t.Errorf("alice after the console's crash: %s", out)
	}
	if out := must(admin, "user", "ls"); !strings.Contains(out, "alice") || !strings.Contains(out, "admin") {
		t.Errorf("users after the crash:\n%s", out)
	}
	must(adminInBank1, "user", "rm", "alice")
	if out, err := alice("boxes", "ls"); err == nil || !strings.Contains(out, `no tenant "bank1"`) {
		t.Errorf("alice after losing bank1: %v %s", err, out)
	}
	must(admin, "user", "rm", "alice")
	refused(alice, "no longer exists", "whoami")
	refused(withCI, "no longer exists", "whoami") // her tokens went with her
	refused(admin, "cannot delete yourself", "user", "rm", "admin")

	// The audit logs of both tenants tell who did what.
	out = must(admin, "audit", "ls") + must(adminInBank1, "audit", "ls")
	for _, want := range []string{"tenant.create", "user.create", "user.role", "user.passwd", "user.delete", "user.login", "apitoken.create"} {
		if !strings.Contains(out, want) {
			t.Errorf("the audit log has no %s:\n%s", want, out)
		}
	}
}
