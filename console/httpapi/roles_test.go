package httpapi

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/edgebox/edgebox/console/agentrel"
	"github.com/edgebox/edgebox/console/alerts"
	"github.com/edgebox/edgebox/console/apps"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/auth"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/events"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/keys"
	"github.com/edgebox/edgebox/console/pki"
	"github.com/edgebox/edgebox/console/rollout"
	"github.com/edgebox/edgebox/console/sessions"
	"github.com/edgebox/edgebox/console/sitehealth"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/console/store/storetest"
	"github.com/edgebox/edgebox/images/registry"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// cheapHash keeps tests that make many users quick; the console itself
// uses auth.DefaultHashParams.
var cheapHash = auth.HashParams{Time: 1, Memory: 64, Threads: 1}

// tenantFixture is what one tenant owns in the role test.
type tenantFixture struct {
	box, key, app, rollout, session, silence string
}

// rolesEnv is the API with two tenants, bank1 and bank2, each with a box,
// a key on it and an app with a release, and a user of each role in
// bank1, plus a console admin.
type rolesEnv struct {
	h      http.Handler
	st     store.Store
	users  *auth.Users
	tokens map[string]string // user -> API token
	own    tenantFixture     // bank1's
	other  tenantFixture     // bank2's
	srv    *httptest.Server  // serves h over TLS, for the registry
	host   string            // srv's host:port, as images name it
}

func newRolesEnv(t *testing.T) *rolesEnv {
	t.Helper()
	ctx := context.Background()
	st := storetest.Bolt(t)
	fl, err := fleet.New(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	d := desired.New(st)
	kr := keys.New(st, d)
	reg, err := registry.Open(ctx, t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	var h http.Handler
	srv, host := lateTLSServer(t, &h)
	catalogue := apps.New(st, d, fl, reg, []string{host}, kr, log)
	users := auth.NewUsers(st, auth.NewHasher(cheapHash, 4, time.Minute), time.Now)
	toks := auth.New(st)
	a, _, err := pki.Open(t.TempDir()+"/pki", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	agents, err := agentrel.New(st, t.TempDir(), a.SignRelease, d, fl, log)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := agents.Upload(ctx, audit.Actor{TenantID: auth.ConsoleTenant, Name: "root"}, "1.0.0", "linux/amd64", 0, strings.NewReader("an agent")); err != nil {
		t.Fatal(err)
	}
	rollouts := rollout.New(rollout.Config{Store: st, Apps: catalogue, Agent: agents, Boxes: fl, Desired: d, Log: log})
	alerting, err := alerts.New(alerts.Config{Store: st, Tenants: func(context.Context) ([]string, error) { return []string{"bank1", "bank2"}, nil },
		Facts: alerts.Facts{Boxes: fl.Boxes, Health: func(context.Context, fleet.Box) (sitehealth.State, string) { return sitehealth.Online, "" },
			Keys: func(ctx context.Context, tenant string) ([]keys.Key, error) {
				return kr.List(ctx, tenant, keys.Filter{})
			},
			Statuses: d.Statuses, Rollouts: rollouts.List}, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	e := &rolesEnv{st: st, users: users, tokens: map[string]string{}, srv: srv, host: host}
	console := audit.Actor{TenantID: auth.ConsoleTenant, Name: "console"}
	for _, tenant := range []string{"bank1", "bank2"} {
		if _, err := users.CreateTenant(ctx, console, tenant, strings.ToUpper(tenant)); err != nil {
			t.Fatal(err)
		}
		by := audit.Actor{TenantID: tenant, Name: "setup"}
		etok, _, err := fl.CreateToken(ctx, by, fleet.TokenSpec{Region: "east", Site: "a", TTL: time.Hour, Uses: 1},
			"https://127.0.0.1:8443", sha256.Sum256([]byte("ca")), [32]byte{})
		if err != nil {
			t.Fatal(err)
		}
		b, _, err := fl.Enroll(ctx, fleet.Enrollment{Token: etok, Hostname: "h", Name: tenant + "-box",
			Issue: func(string) ([]byte, time.Time, error) { return []byte("cert"), time.Now().Add(time.Hour), nil }})
		if err != nil {
			t.Fatal(err)
		}
		dev := &edgeboxv1.UsbDevice{Port: "1-2", VendorId: "096e", ProductId: "0702", Serial: "S-" + tenant}
		if err := kr.Report(ctx, b, []*edgeboxv1.UsbDevice{dev}); err != nil {
			t.Fatal(err)
		}
		app := tenant + "-app"
		if _, err := catalogue.CreateApp(ctx, by, app, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := catalogue.CreateRelease(ctx, by, app, apps.Spec{Version: "1", Runtime: "process", Image: "/bin/sleep",
			Keys: []apps.KeyNeed{{Labels: map[string]string{"bank": "icbc"}}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := catalogue.CreateRelease(ctx, by, app, apps.Spec{Version: "2", Runtime: "process", Image: "/bin/sleep"}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := catalogue.Deploy(ctx, by, app, "1", apps.ScopeRegion, "east"); err != nil {
			t.Fatal(err)
		}
		ro, err := rollouts.Create(ctx, by, rollout.Request{App: app, From: "1", To: "2", Scope: rollout.Scope{Regions: []string{"east"}}})
		if err != nil {
			t.Fatal(err)
		}
		// A session that ended, as the broker records one.
		started := time.Now().Add(-time.Minute)
		ended := time.Now()
		sess := sessions.Record{ID: "s0000000000001" + map[string]string{"bank1": "01", "bank2": "02"}[tenant], TenantID: tenant,
			Box: b.ID, Kind: sessions.KindShell, User: "setup", Started: started, Ended: &ended, EndedBy: "exit"}
		raw, _ := json.Marshal(sess)
		if _, err := store.Put(ctx, st, sessions.Prefix+tenant+"/"+sess.ID, raw); err != nil {
			t.Fatal(err)
		}
		sil, err := alerting.Silence(ctx, by, alerts.Silence{Site: "a"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		f := tenantFixture{box: b.ID, key: keys.ID(b.ID, dev), app: app, rollout: ro.ID, session: sess.ID, silence: sil.ID}
		if tenant == "bank1" {
			e.own = f
		} else {
			e.other = f
		}
	}
	mk := func(name, tenant string, role auth.Role) {
		usr, err := users.Create(ctx, console, name, "a long enough password", tenant, role)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := toks.Create(ctx, auth.APIToken{Name: name + "-cli", User: name, UserID: usr.ID})
		if err != nil {
			t.Fatal(err)
		}
		e.tokens[name] = tok
	}
	for _, r := range auth.Roles {
		mk(string(r), "bank1", r)
	}
	mk("root", auth.ConsoleTenant, auth.Admin)
	hub := events.NewHub(st, fl.BoxByID, 8, log)
	hubCtx, stopHub := context.WithCancel(ctx)
	hubDone := make(chan struct{})
	go func() { hub.Run(hubCtx); close(hubDone) }()
	t.Cleanup(func() { stopHub(); <-hubDone })
	e.h = New(Deps{Fleet: fl, Events: hub, Audit: audit.New(st, nil), Tokens: toks, Users: users, SessionTTL: time.Hour,
		Throttle: auth.NewThrottle(auth.DefaultThrottleConfig, time.Now), Sessions: noSessions{}, Desired: d, Keys: kr,
		PKI: a, Apps: catalogue, Rollouts: rollouts, AgentReleases: agents, Registry: reg,
		Alerts: alerting, RemoteSessions: sessions.New(sessions.Config{Store: st, Dir: t.TempDir(), Log: log}), RegistryHosts: []string{host}, ConsoleURL: "https://127.0.0.1:8443", Log: log,
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })})
	h = e.h
	return e
}

func (e *rolesEnv) call(user, tenant, method, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, bytes.NewBufferString(body))
	if strings.HasPrefix(path, "/api/v1/events") { // a stream: answered, then cut
		ctx, cancel := context.WithTimeout(req.Context(), 200*time.Millisecond)
		defer cancel()
		req = req.WithContext(ctx)
	}
	req.Header.Set("Authorization", "Bearer "+e.tokens[user])
	req.Header.Set("Content-Type", "application/json")
	if tenant != "" {
		req.Header.Set(TenantHeader, tenant)
	}
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	return rec
}

// routeCase is how the role test calls one route: the permission it
// needs, and its path and body for a tenant's fixture.
type routeCase struct {
	perm auth.Permission
	path func(f tenantFixture) string
	body string
	// objects: the path names a tenant's object, so another tenant's
	// answers 404.
	objects bool
}

func fixed(p string) func(tenantFixture) string { return func(tenantFixture) string { return p } }

// routeTable lists every authenticated route of the API. A route that is
// not here fails TestEveryRouteChecksRoleAndTenant.
func routeTable() map[string]routeCase {
	box := func(suffix string) func(tenantFixture) string {
		return func(f tenantFixture) string { return "/api/v1/boxes/" + f.box + suffix }
	}
	app := func(suffix string) func(tenantFixture) string {
		return func(f tenantFixture) string { return "/api/v1/apps/" + f.app + suffix }
	}
	key := func(suffix string) func(tenantFixture) string {
		return func(f tenantFixture) string { return "/api/v1/keys/" + f.key + suffix }
	}
	ro := func(suffix string) func(tenantFixture) string {
		return func(f tenantFixture) string { return "/api/v1/rollouts/" + f.rollout + suffix }
	}
	sess := func(suffix string) func(tenantFixture) string {
		return func(f tenantFixture) string { return "/api/v1/sessions/" + f.session + suffix }
	}
	wl := `{"app":"robot","release":"1","runtime":"process","image":"/bin/sleep"}`
	return map[string]routeCase{
		"GET /metrics":           {perm: manageConsole, path: fixed("/metrics")},
		"GET /debug/pprof/:name": {perm: manageConsole, path: fixed("/debug/pprof/goroutine")},

		"GET /api/v1/me":                 {perm: anyone, path: fixed("/api/v1/me")},
		"GET /api/v1/events":             {perm: auth.Read, path: fixed("/api/v1/events")},
		"POST /api/v1/me/password":       {perm: anyone, path: fixed("/api/v1/me/password"), body: `{"old":"a long enough password","password":"a long enough password"}`},
		"POST /api/v1/logout":            {perm: anyone, path: fixed("/api/v1/logout")},
		"POST /api/v1/logout/everywhere": {perm: anyone, path: fixed("/api/v1/logout/everywhere")},
		"GET /api/v1/apitokens":          {perm: anyone, path: fixed("/api/v1/apitokens")},
		"POST /api/v1/apitokens":         {perm: anyone, path: fixed("/api/v1/apitokens"), body: `{"name":"more"}`},
		"DELETE /api/v1/apitokens/:id":   {perm: anyone, path: fixed("/api/v1/apitokens/0000000000000000")},
		"GET /api/v1/tenants":            {perm: anyone, path: fixed("/api/v1/tenants")},
		"POST /api/v1/tenants":           {perm: manageConsole, path: fixed("/api/v1/tenants"), body: `{"id":"bank9"}`},

		"GET /api/v1/users":                        {perm: auth.Administer, path: fixed("/api/v1/users")},
		"POST /api/v1/users":                       {perm: auth.Administer, path: fixed("/api/v1/users"), body: `{"name":"new","password":"a long enough password","role":"viewer"}`},
		"PUT /api/v1/users/:name/role":             {perm: auth.Administer, path: fixed("/api/v1/users/viewer/role"), body: `{"role":"viewer"}`},
		"PUT /api/v1/users/:name/password":         {perm: auth.Administer, path: fixed("/api/v1/users/nobody/password"), body: `{"password":"a long enough password"}`},
		"DELETE /api/v1/users/:name":               {perm: auth.Administer, path: fixed("/api/v1/users/nobody")},
		"GET /api/v1/users/:name/apitokens":        {perm: auth.Administer, path: fixed("/api/v1/users/viewer/apitokens")},
		"DELETE /api/v1/users/:name/apitokens/:id": {perm: auth.Administer, path: fixed("/api/v1/users/viewer/apitokens/0000000000000000")},

		"GET /api/v1/boxes":                            {perm: auth.Read, path: fixed("/api/v1/boxes")},
		"GET /api/v1/boxes/:id":                        {perm: auth.Read, path: box(""), objects: true},
		"POST /api/v1/boxes/:id/labels":                {perm: auth.Operate, path: box("/labels"), body: `{"labels":{"k":"v"}}`, objects: true},
		"POST /api/v1/boxes/:id/approve":               {perm: auth.Operate, path: box("/approve"), objects: true},
		"POST /api/v1/boxes/:id/revoke":                {perm: auth.Administer, path: box("/revoke"), body: `{}`, objects: true},
		"GET /api/v1/boxes/:id/state":                  {perm: auth.Read, path: box("/state"), objects: true},
		"PUT /api/v1/boxes/:id/desired/:kind/:name":    {perm: auth.Operate, path: box("/desired/Workload/robot"), body: wl, objects: true},
		"DELETE /api/v1/boxes/:id/desired/:kind/:name": {perm: auth.Operate, path: box("/desired/Workload/robot"), objects: true},
		"GET /api/v1/boxes/:id/workloads/:name/logs":   {perm: auth.Read, path: box("/workloads/robot/logs"), objects: true},
		"GET /api/v1/boxes/:id/exec":                   {perm: auth.Maintain, path: box("/exec?cmd=true"), objects: true},
		"GET /api/v1/boxes/:id/forward":                {perm: auth.Maintain, path: box("/forward?target=127.0.0.1:80"), objects: true},
		"GET /api/v1/boxes/:id/workloads/:name/screen": {perm: auth.Maintain, path: box("/workloads/robot/screen"), objects: true},
		"POST /api/v1/boxes/:id/session-requests":      {perm: auth.Maintain, path: box("/session-requests"), body: `{"kind":"screen","workload":"robot"}`, objects: true},
		"GET /api/v1/boxes/:id/web/:port/*path":        {perm: auth.Maintain, path: box("/web/80/index.html"), objects: true},
		"HEAD /api/v1/boxes/:id/web/:port/*path":       {perm: auth.Maintain, path: box("/web/80/index.html"), objects: true},
		"GET /api/v1/tenants/:tenant/boxes/:id/web/:port/*path": {perm: auth.Maintain, path: func(f tenantFixture) string {
			return "/api/v1/tenants/bank1/boxes/" + f.box + "/web/80/index.html"
		}, objects: true},
		"HEAD /api/v1/tenants/:tenant/boxes/:id/web/:port/*path": {perm: auth.Maintain, path: func(f tenantFixture) string {
			return "/api/v1/tenants/bank1/boxes/" + f.box + "/web/80/index.html"
		}, objects: true},
		"GET /api/v1/boxes/:id/files":      {perm: auth.Maintain, path: box("/files?path=/etc/hostname"), objects: true},
		"GET /api/v1/boxes/:id/files/stat": {perm: auth.Maintain, path: box("/files/stat?path=/etc/hostname"), objects: true},
		"PUT /api/v1/boxes/:id/files":      {perm: auth.Maintain, path: box("/files?path=/tmp/x&size=1&offset=0&sha256=00"), body: "x", objects: true},

		"GET /api/v1/sessions":                       {perm: auth.Read, path: fixed("/api/v1/sessions")},
		"GET /api/v1/sessions/:sid":                  {perm: auth.Read, path: sess(""), objects: true},
		"POST /api/v1/sessions/:sid/end":             {perm: auth.Maintain, path: sess("/end"), objects: true},
		"GET /api/v1/sessions/:sid/recording":        {perm: auth.Audit, path: sess("/recording"), objects: true},
		"GET /api/v1/sessions/:sid/recording/verify": {perm: auth.Audit, path: sess("/recording/verify"), objects: true},
		"POST /api/v1/sessions/:sid/approve":         {perm: auth.Maintain, path: sess("/approve"), objects: true},
		"GET /api/v1/sessions/:sid/watch":            {perm: auth.Maintain, path: sess("/watch"), objects: true},
		"GET /api/v1/session-rules":                  {perm: auth.Read, path: fixed("/api/v1/session-rules")},
		"PUT /api/v1/session-rules":                  {perm: auth.Administer, path: fixed("/api/v1/session-rules"), body: `{"four_eyes":[{"labels":{"money":"yes"}}]}`},

		"GET /api/v1/apps":                                       {perm: auth.Read, path: fixed("/api/v1/apps")},
		"POST /api/v1/apps":                                      {perm: auth.Operate, path: fixed("/api/v1/apps"), body: `{"name":"another"}`},
		"GET /api/v1/apps/:app":                                  {perm: auth.Read, path: app(""), objects: true},
		"DELETE /api/v1/apps/:app":                               {perm: auth.Operate, path: app(""), objects: true},
		"GET /api/v1/apps/:app/releases":                         {perm: auth.Read, path: app("/releases"), objects: true},
		"POST /api/v1/apps/:app/releases":                        {perm: auth.Operate, path: app("/releases"), body: `{"version":"1","runtime":"process","image":"/bin/sleep"}`, objects: true},
		"GET /api/v1/apps/:app/pins":                             {perm: auth.Read, path: app("/pins"), objects: true},
		"PUT /api/v1/apps/:app/pins/:scope/:target":              {perm: auth.Operate, path: app("/pins/region/east"), body: `{"version":"1"}`, objects: true},
		"DELETE /api/v1/apps/:app/pins/:scope/:target":           {perm: auth.Operate, path: app("/pins/region/east"), objects: true},
		"GET /api/v1/apps/:app/pins/:scope/:target/preview":      {perm: auth.Operate, path: app("/pins/region/east/preview?version=1"), objects: true},
		"GET /api/v1/apps/:app/status":                           {perm: auth.Read, path: app("/status"), objects: true},
		"GET /api/v1/keys":                                       {perm: auth.Read, path: fixed("/api/v1/keys")},
		"GET /api/v1/keys/:key":                                  {perm: auth.Read, path: key(""), objects: true},
		"POST /api/v1/keys/:key/labels":                          {perm: auth.Operate, path: key("/labels"), body: `{"labels":{"bank":"icbc"}}`, objects: true},
		"POST /api/v1/keys/:key/lease":                           {perm: auth.Operate, path: key("/lease"), body: `{"workload":"robot"}`, objects: true},
		"POST /api/v1/keys/:key/release":                         {perm: auth.Operate, path: key("/release"), objects: true},
		"GET /api/v1/keys/:key/history":                          {perm: auth.Read, path: key("/history"), objects: true},
		"GET /api/v1/agent-releases":                             {perm: auth.Read, path: fixed("/api/v1/agent-releases")},
		"GET /api/v1/agent-releases/:version":                    {perm: auth.Read, path: fixed("/api/v1/agent-releases/1.0.0")},
		"PUT /api/v1/agent-releases/:version/binaries/:os/:arch": {perm: manageConsole, path: fixed("/api/v1/agent-releases/1.0.0/binaries/linux/amd64"), body: "an agent"},
		"GET /api/v1/agent-pins":                                 {perm: auth.Read, path: fixed("/api/v1/agent-pins")},
		"PUT /api/v1/agent-pins/:scope/:target":                  {perm: auth.Operate, path: fixed("/api/v1/agent-pins/region/east"), body: `{"version":"1.0.0"}`},
		"DELETE /api/v1/agent-pins/:scope/:target":               {perm: auth.Operate, path: fixed("/api/v1/agent-pins/region/nowhere")},
		"GET /api/v1/rollouts":                                   {perm: auth.Read, path: fixed("/api/v1/rollouts")},
		"POST /api/v1/rollouts":                                  {perm: auth.Operate, path: fixed("/api/v1/rollouts"), body: `{"app":"bank1-app","from":"1","to":"2","regions":["east"]}`},
		"GET /api/v1/rollouts/:id":                               {perm: auth.Read, path: ro(""), objects: true},
		"POST /api/v1/rollouts/:id/:action":                      {perm: auth.Operate, path: ro("/pause"), objects: true},
		"GET /api/v1/alerts":                                     {perm: auth.Read, path: fixed("/api/v1/alerts?resolved=10")},
		"GET /api/v1/alert-rules":                                {perm: auth.Read, path: fixed("/api/v1/alert-rules")},
		"PUT /api/v1/alert-rules":                                {perm: auth.Administer, path: fixed("/api/v1/alert-rules"), body: `{"rules":[{"kind":"box-down","for_minutes":5}]}`},
		"POST /api/v1/alert-rules/test":                          {perm: auth.Administer, path: fixed("/api/v1/alert-rules/test")},
		"GET /api/v1/silences":                                   {perm: auth.Read, path: fixed("/api/v1/silences")},
		"POST /api/v1/silences":                                  {perm: auth.Operate, path: fixed("/api/v1/silences"), body: `{"site":"a","for":"1h"}`},
		"DELETE /api/v1/silences/:id":                            {perm: auth.Operate, path: func(f tenantFixture) string { return "/api/v1/silences/" + f.silence }, objects: true},
		"GET /api/v1/rollout-rules":                              {perm: auth.Read, path: fixed("/api/v1/rollout-rules")},
		"PUT /api/v1/rollout-rules":                              {perm: auth.Administer, path: fixed("/api/v1/rollout-rules"), body: `{}`},
		"GET /api/v1/tokens":                                     {perm: auth.Administer, path: fixed("/api/v1/tokens")},
		"POST /api/v1/tokens":                                    {perm: auth.Administer, path: fixed("/api/v1/tokens"), body: `{"region":"east","site":"b"}`},
		"DELETE /api/v1/tokens/:id":                              {perm: auth.Administer, path: fixed("/api/v1/tokens/nope")},
		"GET /api/v1/audit":                                      {perm: auth.Audit, path: fixed("/api/v1/audit")},
	}
}

// public lists the routes that need no caller.
var public = map[string]bool{
	"GET /healthz": true, "GET /api/v1/ca": true, "POST /api/v1/enroll": true, "GET /install.sh": true,
	"GET /install.ps1": true, "GET /dl/:file": true, "POST /api/v1/login": true,
}

// TestEveryRouteChecksRoleAndTenant walks every route × role, on the
// caller's own tenant's objects and on another tenant's: a role without
// the permission is refused (403), one with it is let through, and
// another tenant's object or the tenant itself answers 404, never 403 with
// its name.
func TestEveryRouteChecksRoleAndTenant(t *testing.T) {
	t.Parallel()
	e := newRolesEnv(t)
	table := routeTable()
	seen := map[string]bool{}
	for _, r := range e.h.(*gin.Engine).Routes() {
		k := r.Method + " " + r.Path
		seen[k] = true
		if _, ok := table[k]; !ok && !public[k] && !strings.HasPrefix(r.Path, "/v2/") {
			t.Errorf("route %s is not in the role table: say what it needs", k)
		}
	}
	for k := range table {
		if !seen[k] {
			t.Errorf("the role table lists %s, which the API does not serve", k)
		}
	}
	users := append([]string{"root"}, func() (out []string) {
		for _, r := range auth.Roles {
			out = append(out, string(r))
		}
		return out
	}()...)
	// Reads first, then changes, and the ones that end a fixture last, so
	// each call finds what it names.
	order := slices.Collect(maps.Keys(table))
	rank := func(k string) int {
		switch {
		case strings.HasPrefix(k, "GET "):
			return 0
		case k == "DELETE /api/v1/apps/:app" || strings.HasSuffix(k, "/revoke"):
			return 2
		}
		return 1
	}
	slices.SortFunc(order, func(a, b string) int { return cmp.Or(rank(a)-rank(b), strings.Compare(a, b)) })
	for _, k := range order {
		rc := table[k]
		method := k[:strings.IndexByte(k, ' ')]
		for _, u := range users {
			role := auth.Role(u)
			allowed := rc.perm == anyone || (rc.perm == manageConsole && u == "root") ||
				(rc.perm > 0 && (u == "root" || role.Can(rc.perm)))
			// Root acts in bank1 as its admin, through the console's role.
			rec := e.call(u, "bank1", method, rc.path(e.own), rc.body)
			switch {
			case allowed && (rec.Code == http.StatusForbidden || rec.Code == http.StatusUnauthorized):
				t.Errorf("%s as %s on its own tenant: %d %s, want it let through", k, u, rec.Code, rec.Body)
			case allowed && method == http.MethodGet && rec.Code != http.StatusOK && !needsMore(k):
				t.Errorf("%s as %s on its own tenant: %d %s, want 200", k, u, rec.Code, rec.Body)
			case !allowed && rec.Code != http.StatusForbidden:
				t.Errorf("%s as %s: %d %s, want 403", k, u, rec.Code, rec.Body)
			}
			if rc.objects {
				rec := e.call(u, "bank1", method, rc.path(e.other), rc.body)
				want := http.StatusNotFound
				if !allowed {
					want = http.StatusForbidden
				}
				if rec.Code != want || (want == http.StatusForbidden && bytes.Contains(rec.Body.Bytes(), []byte("bank2"))) {
					t.Errorf("%s as %s on bank2's object: %d %s, want %d", k, u, rec.Code, rec.Body, want)
				}
			}
			if u != "root" {
				if rec := e.call(u, "bank2", method, rc.path(e.other), rc.body); rec.Code != http.StatusNotFound {
					t.Errorf("%s as %s acting in bank2: %d %s, want 404", k, u, rec.Code, rec.Body)
				}
			}
		}
	}
}

// TestRegistryKeepsEachTenantToItsNamespace: a tenant's users push and
// pull under its ID only, as their role allows; another tenant's
// repositories do not exist for them; its releases use only its images.
func TestRegistryKeepsEachTenantToItsNamespace(t *testing.T) {
	t.Parallel()
	e := newRolesEnv(t)
	// Each push a new image, so none finds its manifest there already.
	push := func(user, repo string) error {
		img, err := random.Image(256, 1)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := name.ParseReference(e.host + "/" + repo + ":1")
		if err != nil {
			t.Fatal(err)
		}
		return remote.Write(ref, img, remote.WithTransport(e.srv.Client().Transport),
			remote.WithAuth(&authn.Basic{Username: "edgebox", Password: e.tokens[user]}))
	}
	pull := func(user, repo string) error {
		ref, err := name.ParseReference(e.host + "/" + repo + ":1")
		if err != nil {
			t.Fatal(err)
		}
		_, err = remote.Image(ref, remote.WithTransport(e.srv.Client().Transport),
			remote.WithAuth(&authn.Basic{Username: "edgebox", Password: e.tokens[user]}))
		return err
	}
	status := func(err error) int {
		var te *transport.Error
		if errors.As(err, &te) {
			return te.StatusCode
		}
		if err != nil {
			t.Fatalf("not a registry answer: %v", err)
		}
		return 200
	}
	if err := push("root", "bank2/robot"); err != nil {
		t.Fatalf("the console's admin pushing into bank2: %v", err)
	}
	if err := push("root", "robots/shared"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		user, repo string
		push, pull int
	}{
		{"operator", "bank1/robot", 200, 200},
		{"viewer", "bank1/robot", 403, 200},
		{"auditor", "bank1/other", 403, 404}, // sees the namespace; nothing pushed there
		{"operator", "bank2/robot", 404, 404},
		{"admin", "bank2/robot", 404, 404},
		{"operator", "robots/shared", 404, 404},
	} {
		if got := status(push(tc.user, tc.repo)); got != tc.push {
			t.Errorf("%s pushing %s: %d, want %d", tc.user, tc.repo, got, tc.push)
		}
		if got := status(pull(tc.user, tc.repo)); got != tc.pull {
			t.Errorf("%s pulling %s: %d, want %d", tc.user, tc.repo, got, tc.pull)
		}
	}
	// The catalog lists the tenant's own repositories only.
	reg, _ := name.NewRegistry(e.host)
	repos, err := remote.Catalog(context.Background(), reg, remote.WithTransport(e.srv.Client().Transport),
		remote.WithAuth(&authn.Basic{Username: "edgebox", Password: e.tokens["viewer"]}))
	if err != nil || strings.Join(repos, ",") != "bank1/robot" {
		t.Errorf("bank1's catalog: %v %v", repos, err)
	}
	// A release of bank1 takes its images from bank1's namespace only.
	for img, want := range map[string]int{e.host + "/bank1/robot:1": 201, e.host + "/robots/shared:1": 400, "bank2/robot:1": 400} {
		body := `{"version":"v-` + strings.NewReplacer("/", "-", ":", "-", ".", "-").Replace(img) + `","runtime":"containerd","image":"` + img + `"}`
		if rec := e.call("operator", "", "POST", "/api/v1/apps/"+e.own.app+"/releases", body); rec.Code != want {
			t.Errorf("a bank1 release of %s: %d %s, want %d", img, rec.Code, rec.Body, want)
		}
	}
}

// needsMore says whether a GET route answers something else than 200 to
// a caller it lets through, here: it needs the box online (logs,
// sessions, screens, forwards, files, its web pages), a recording, or a
// live session (watch).
func needsMore(route string) bool {
	for _, p := range []string{"/logs", "/exec", "/forward", "/files", "/screen", "/web/", "/recording", "/watch"} {
		if strings.Contains(route, p) {
			return true
		}
	}
	return false
}
