package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console/audit"
)

// browser calls the API as a browser would: the session cookie it was
// given, and the headers a page of the console's own origin sends.
type browser struct {
	e      *rolesEnv
	addr   string
	cookie *http.Cookie
	csrf   string
}

func (b *browser) do(method, path, body string, hdr map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, "https://console.example"+path, bytes.NewBufferString(body))
	req.RemoteAddr = b.addr + ":50000"
	req.Header.Set("Content-Type", "application/json")
	if b.cookie != nil {
		req.AddCookie(b.cookie)
	}
	if b.csrf != "" && method != http.MethodGet {
		req.Header.Set(CSRFHeader, b.csrf)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	b.e.h.ServeHTTP(rec, req)
	return rec
}

func (b *browser) login(t *testing.T, user, pw string) *httptest.ResponseRecorder {
	t.Helper()
	body, _ := json.Marshal(api.LoginRequest{User: user, Password: pw})
	rec := b.do("POST", "/api/v1/login", string(body), nil)
	if rec.Code != http.StatusOK {
		return rec
	}
	for _, c := range rec.Result().Cookies() {
		if c.Name == SessionCookie {
			if !c.HttpOnly || !c.Secure || c.SameSite != http.SameSiteStrictMode || c.Path != "/" {
				t.Errorf("session cookie %+v: want HttpOnly, Secure, SameSite=Strict, Path=/", c)
			}
			b.cookie = c
		}
	}
	var me api.Me
	if err := json.Unmarshal(rec.Body.Bytes(), &me); err != nil || me.CSRF == "" || b.cookie == nil {
		t.Fatalf("login answer %s, cookie %v: %v", rec.Body, b.cookie, err)
	}
	b.csrf = me.CSRF
	return rec
}

func TestBrowserSessionLogsInRefusesCrossSiteAndLogsOut(t *testing.T) {
	t.Parallel()
	e := newRolesEnv(t)
	b := &browser{e: e, addr: "192.0.2.10"}
	if rec := b.login(t, "operator", "a long enough password"); rec.Code != http.StatusOK {
		t.Fatalf("login: %d %s", rec.Code, rec.Body)
	}
	if rec := b.do("GET", "/api/v1/boxes", "", nil); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "bank1-box") {
		t.Fatalf("boxes with the session: %d %s", rec.Code, rec.Body)
	}
	label := `{"labels":{"floor":"2"}}`
	path := "/api/v1/boxes/" + e.own.box + "/labels"
	for name, h := range map[string]map[string]string{
		"no CSRF token":         {CSRFHeader: ""},
		"a wrong CSRF token":    {CSRFHeader: "x" + b.csrf},
		"another origin":        {"Origin": "https://evil.example"},
		"a cross-site fetch":    {"Sec-Fetch-Site": "cross-site"},
		"a same-site subdomain": {"Sec-Fetch-Site": "same-site"},
	} {
		rec := b.do("POST", path, label, h)
		if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "cross-site") {
			t.Errorf("a change with %s: %d %s, want 403", name, rec.Code, rec.Body)
		}
	}
	if rec := b.do("POST", path, label, map[string]string{"Origin": "https://console.example", "Sec-Fetch-Site": "same-origin"}); rec.Code != http.StatusOK {
		t.Fatalf("a change from the console's own page: %d %s", rec.Code, rec.Body)
	}
	// A second browser of the same user, then log out everywhere from it.
	b2 := &browser{e: e, addr: "192.0.2.11"}
	b2.login(t, "operator", "a long enough password")
	if rec := b.do("POST", "/api/v1/logout", "", nil); rec.Code != http.StatusNoContent {
		t.Fatalf("logout: %d %s", rec.Code, rec.Body)
	}
	if rec := b.do("GET", "/api/v1/me", "", nil); rec.Code != http.StatusUnauthorized {
		t.Errorf("after logout: %d %s", rec.Code, rec.Body)
	}
	if rec := b2.do("GET", "/api/v1/me", "", nil); rec.Code != http.StatusOK {
		t.Fatalf("the other browser after the first logged out: %d %s", rec.Code, rec.Body)
	}
	if rec := b2.do("POST", "/api/v1/logout/everywhere", "", nil); rec.Code != http.StatusNoContent {
		t.Fatalf("logout everywhere: %d %s", rec.Code, rec.Body)
	}
	if rec := b2.do("GET", "/api/v1/me", "", nil); rec.Code != http.StatusUnauthorized {
		t.Errorf("after logging out everywhere: %d %s", rec.Code, rec.Body)
	}
	// The API token of the same user still works: it is not a session.
	if rec := e.call("operator", "", "GET", "/api/v1/me", ""); rec.Code != http.StatusOK {
		t.Errorf("the user's API token after logging out everywhere: %d %s", rec.Code, rec.Body)
	}
}

func TestWrongPasswordsSlowTheGuesserAndLockNobodyElseOut(t *testing.T) {
	t.Parallel()
	e := newRolesEnv(t)
	attacker := &browser{e: e, addr: "203.0.113.66"}
	codes := map[int]int{}
	for range 50 {
		rec := attacker.login(t, "admin", "not the password")
		codes[rec.Code]++
		if rec.Code == http.StatusTooManyRequests && rec.Header().Get("Retry-After") == "" {
			t.Fatal("a throttled login says not when to come back")
		}
	}
	if codes[http.StatusUnauthorized] > 5 || codes[http.StatusTooManyRequests] < 45 {
		t.Errorf("50 wrong passwords: %v, want a few refused and the rest told to wait", codes)
	}
	// Everyone else logs in as usual, the attacked user from its own
	// address after its own, shorter, wait.
	if rec := (&browser{e: e, addr: "192.0.2.20"}).login(t, "viewer", "a long enough password"); rec.Code != http.StatusOK {
		t.Errorf("another user during the attack: %d %s", rec.Code, rec.Body)
	}
	rec := (&browser{e: e, addr: "192.0.2.21"}).login(t, "admin", "a long enough password")
	wait, _ := strconv.Atoi(rec.Header().Get("Retry-After"))
	if rec.Code != http.StatusTooManyRequests || wait < 1 || wait > 30 {
		t.Errorf("the attacked user from its own address: %d, Retry-After %q; want told to wait at most 30 s", rec.Code, rec.Header().Get("Retry-After"))
	}
	// Failed logins are audited.
	entries, err := audit.New(e.st, nil).List(context.Background(), audit.Query{TenantID: "bank1", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, en := range entries {
		if en.Action == "user.login" && en.Target == "admin" && strings.HasPrefix(en.Result, "failed") && en.Remote == "203.0.113.66" {
			n++
		}
	}
	if n != codes[http.StatusUnauthorized] {
		t.Errorf("%d failed logins audited in bank1, want %d", n, codes[http.StatusUnauthorized])
	}
}

func TestLoginCanMakeAnAPIToken(t *testing.T) {
	t.Parallel()
	e := newRolesEnv(t)
	body, _ := json.Marshal(api.LoginRequest{User: "maintainer", Password: "a long enough password", TokenName: "laptop", TokenTTL: "24h"})
	rec := (&browser{e: e, addr: "192.0.2.30"}).do("POST", "/api/v1/login", string(body), nil)
	var me api.Me
	if err := json.Unmarshal(rec.Body.Bytes(), &me); rec.Code != http.StatusOK || err != nil || me.Token == "" || me.ExpiresAt.IsZero() {
		t.Fatalf("login for a token: %d %s", rec.Code, rec.Body)
	}
	if len(rec.Result().Cookies()) != 0 {
		t.Error("a login for a token also set a cookie")
	}
	e.tokens["laptop"] = me.Token
	rec = e.call("laptop", "", "GET", "/api/v1/me", "")
	if err := json.Unmarshal(rec.Body.Bytes(), &me); err != nil || me.User != "maintainer" || me.Role != "maintainer" || me.Tenant != "bank1" {
		t.Fatalf("me with the new token: %d %s", rec.Code, rec.Body)
	}
	// Its tenant's admin sees the token, and may revoke it.
	rec = e.call("admin", "", "GET", "/api/v1/users/maintainer/apitokens", "")
	var toks []api.APIToken
	if err := json.Unmarshal(rec.Body.Bytes(), &toks); err != nil || len(toks) != 2 { // maintainer-cli, laptop
		t.Fatalf("the maintainer's tokens as its admin sees them: %d %s", rec.Code, rec.Body)
	}
	if rec := e.call("admin", "", "GET", "/api/v1/users/root/apitokens", ""); rec.Code != http.StatusNotFound {
		t.Errorf("tokens of a user of another tenant: %d %s", rec.Code, rec.Body)
	}
	for _, tk := range toks {
		if tk.Name == "laptop" {
			if rec := e.call("admin", "", "DELETE", "/api/v1/users/maintainer/apitokens/"+tk.ID, ""); rec.Code != http.StatusNoContent {
				t.Fatalf("revoke: %d %s", rec.Code, rec.Body)
			}
		}
	}
	if rec := e.call("laptop", "", "GET", "/api/v1/me", ""); rec.Code != http.StatusUnauthorized {
		t.Errorf("a revoked token: %d %s", rec.Code, rec.Body)
	}
	// Taking the user's role away takes the token's with it.
	if rec := e.call("admin", "", "PUT", "/api/v1/users/maintainer/role", `{"role":""}`); rec.Code != http.StatusOK {
		t.Fatalf("take the role away: %d %s", rec.Code, rec.Body)
	}
	if rec := e.call("maintainer", "bank1", "GET", "/api/v1/boxes", ""); rec.Code != http.StatusNotFound {
		t.Errorf("the token of a user with no role left: %d %s, want 404", rec.Code, rec.Body)
	}
}

// TestAuditFiltersAndCSV: the audit log filters by actor, action, target
// and time, and exports CSV in which a hostile value cannot be a formula.
func TestAuditFiltersAndCSV(t *testing.T) {
	t.Parallel()
	e := newRolesEnv(t)
	before := time.Now().UTC().Format(time.RFC3339Nano)
	if rec := e.call("operator", "", "POST", "/api/v1/boxes/"+e.own.box+"/labels", `{"labels":{"note":"=HYPERLINK(\"http://x\")"}}`); rec.Code != http.StatusOK {
		t.Fatalf("label: %d %s", rec.Code, rec.Body)
	}
	if rec := e.call("admin", "", "POST", "/api/v1/apps", `{"name":"robot"}`); rec.Code != http.StatusCreated {
		t.Fatalf("app: %d %s", rec.Code, rec.Body)
	}
	list := func(q string) []api.AuditEntry {
		t.Helper()
		rec := e.call("auditor", "", "GET", "/api/v1/audit?"+q, "")
		var l api.AuditList
		if err := json.Unmarshal(rec.Body.Bytes(), &l); rec.Code != http.StatusOK || err != nil {
			t.Fatalf("audit ?%s: %d %s", q, rec.Code, rec.Body)
		}
		return l.Entries
	}
	for q, want := range map[string]string{
		"actor=operator":                                    "box.label",
		"action=app.&actor=admin":                           "app.create",
		"target=" + e.own.box + "&actor=operator":           "box.label",
		"since=" + url.QueryEscape(before) + "&action=box.": "box.label",
	} {
		got := list(q)
		if len(got) != 1 || got[0].Action != want {
			t.Errorf("audit ?%s: %+v, want one %s", q, got, want)
		}
	}
	if got := list("until=" + url.QueryEscape(before) + "&action=app.&actor=admin"); len(got) != 0 {
		t.Errorf("entries before %s: %+v", before, got)
	}
	if rec := e.call("auditor", "", "GET", "/api/v1/audit?since=yesterday", ""); rec.Code != http.StatusBadRequest {
		t.Errorf("a bad time: %d %s", rec.Code, rec.Body)
	}
	rec := e.call("auditor", "", "GET", "/api/v1/audit?format=csv&actor=operator", "")
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/csv") {
		t.Fatalf("csv: %d %s", rec.Code, rec.Header())
	}
	rows, err := csv.NewReader(rec.Body).ReadAll()
	if err != nil || len(rows) != 2 || rows[0][3] != "action" || rows[1][3] != "box.label" {
		t.Fatalf("csv rows %q, %v", rows, err)
	}
	for _, cell := range rows[1] {
		if strings.HasPrefix(cell, "=") {
			t.Errorf("a cell starts a formula: %q", cell)
		}
	}
}

func TestAuditCSVDisarmsFormulas(t *testing.T) {
	t.Parallel()
	gin.SetMode(gin.ReleaseMode)
	rec := httptest.NewRecorder()
	c, _ := gin.CreateTestContext(rec)
	writeAuditCSV(c, []api.AuditEntry{{Seq: 1, Actor: "=cmd|' /C calc'!A0", Action: "+1", Target: "-2", Remote: "@SUM(A1)", Result: "ok", Detail: "\tx"}})
	rows, err := csv.NewReader(rec.Body).ReadAll()
	if err != nil || len(rows) != 2 {
		t.Fatalf("%q %v", rows, err)
	}
	for i, want := range map[int]string{2: "'=cmd|' /C calc'!A0", 3: "'+1", 4: "'-2", 5: "'@SUM(A1)", 6: "ok", 7: "'\tx"} {
		if rows[1][i] != want {
			t.Errorf("cell %d: %q, want %q", i, rows[1][i], want)
		}
	}
}

func TestTheWebAppHasEveryPathButTheAPIs(t *testing.T) {
	t.Parallel()
	h := New(Deps{WebUI: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "the app") }),
		Metrics: http.NotFoundHandler()})
	for path, want := range map[string]string{"/": "the app", "/boxes/bx-1": "the app", "/api/v1/nope": `"error"`, "/api/nope": `"error"`} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("GET %s: %d %s, want %s", path, rec.Code, rec.Body, want)
		}
	}
}

// TestEventsTellATenantsPagesWhatChanged: a page's event stream names the
// topics of its own tenant that change, and nothing of another's.
func TestEventsTellATenantsPagesWhatChanged(t *testing.T) {
	t.Parallel()
	e := newRolesEnv(t)
	req, _ := http.NewRequest("GET", e.srv.URL+"/api/v1/events?tenant=bank1", nil)
	req.Header.Set("Authorization", "Bearer "+e.tokens["viewer"])
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := e.srv.Client().Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: %d %v", resp.StatusCode, resp.Header)
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func(what string) string {
		t.Helper()
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the stream ended waiting for %s", what)
				}
				if d, ok := strings.CutPrefix(l, "data: "); ok {
					return d
				}
			case <-ctx.Done():
				t.Fatalf("no event for %s", what)
			}
		}
	}
	// The first page wakes the hub's watch: pages fetch everything once.
	if got := next("the watch to begin"); got != `{"topics":["all"]}` {
		t.Fatalf("first event %s, want all", got)
	}
	// Another tenant's change first: bank1's page must not hear of it.
	if rec := e.call("root", "bank2", "POST", "/api/v1/boxes/"+e.other.box+"/labels", `{"labels":{"a":"b"}}`); rec.Code != http.StatusOK {
		t.Fatalf("label bank2's box: %d %s", rec.Code, rec.Body)
	}
	if rec := e.call("operator", "", "POST", "/api/v1/boxes/"+e.own.box+"/labels", `{"labels":{"a":"b"}}`); rec.Code != http.StatusOK {
		t.Fatalf("label bank1's box: %d %s", rec.Code, rec.Body)
	}
	if got := next("a label"); got != `{"topics":["boxes","audit"]}` {
		t.Errorf("after labelling bank1's box: %s", got)
	}
	if rec := e.call("operator", "", "PUT", "/api/v1/boxes/"+e.own.box+"/desired/Workload/robot",
		`{"app":"robot","release":"1","runtime":"process","image":"/bin/sleep"}`); rec.Code != http.StatusOK {
		t.Fatalf("desired: %d %s", rec.Code, rec.Body)
	}
	if got := next("a desired change"); got != `{"topics":["state","audit"]}` {
		t.Errorf("after a desired change: %s", got)
	}
}

func TestALoginFromAnotherSiteIsRefused(t *testing.T) {
	t.Parallel()
	e := newRolesEnv(t)
	body := `{"user":"viewer","password":"a long enough password"}`
	for name, hdr := range map[string]map[string]string{
		"another origin":    {"Origin": "https://evil.example", "Content-Type": "application/json"},
		"a cross-site form": {"Sec-Fetch-Site": "cross-site", "Content-Type": "application/json"},
		"a text/plain body": {"Content-Type": "text/plain"},
	} {
		req := httptest.NewRequest("POST", "https://console.example/api/v1/login", strings.NewReader(body))
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, req)
		if rec.Code != http.StatusForbidden || len(rec.Result().Cookies()) != 0 {
			t.Errorf("%s: %d %s", name, rec.Code, rec.Body)
		}
	}
}
