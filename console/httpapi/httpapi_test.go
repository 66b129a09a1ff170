package httpapi

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/alerts"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/auth"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/keys"
	"github.com/edgebox/edgebox/console/pki"
	"github.com/edgebox/edgebox/console/presence"
	"github.com/edgebox/edgebox/console/rollout"
	"github.com/edgebox/edgebox/console/sitehealth"
	"github.com/edgebox/edgebox/console/store/storetest"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

type noSessions struct{}

func (noSessions) Presence(string) presence.Status { return presence.Status{} }
func (noSessions) Drop(string) bool                { return false }

// newAPI is the API on a real store and PKI, with an admin token.
func newAPI(t testing.TB) (http.Handler, string) {
	dir := t.TempDir()
	st := storetest.Bolt(t)
	a, _, err := pki.Open(dir+"/pki", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	fl, err := fleet.New(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	toks := auth.New(st)
	tok, err := toks.Create(context.Background(), auth.APIToken{Name: "admin", TenantID: fleet.DefaultTenant, Role: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	users := auth.NewUsers(st, auth.NewHasher(cheapHash, 2, time.Minute), time.Now)
	none := func(context.Context, string) ([]fleet.Box, error) { return nil, nil }
	alerting, err := alerts.New(alerts.Config{Store: st, Tenants: func(context.Context) ([]string, error) { return nil, nil },
		Facts: alerts.Facts{Boxes: none, Health: func(context.Context, fleet.Box) (sitehealth.State, string) { return sitehealth.Online, "" },
			Keys:     func(context.Context, string) ([]keys.Key, error) { return nil, nil },
			Statuses: func(context.Context, string) ([]*edgeboxv1.ObjectStatus, error) { return nil, nil },
			Rollouts: func(context.Context, string) ([]rollout.Rollout, error) { return nil, nil }}})
	if err != nil {
		t.Fatal(err)
	}
	h := New(Deps{Fleet: fl, Audit: audit.New(st, nil), Tokens: toks, PKI: a, Sessions: noSessions{}, Alerts: alerting,
		Users: users, Throttle: auth.NewThrottle(auth.DefaultThrottleConfig, time.Now), SessionTTL: time.Hour,
		ConsoleURL: "https://127.0.0.1:8443", BoxCertTTL: time.Hour, Metrics: http.NotFoundHandler(),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	return h, tok
}

var bodySeeds = []string{
	`{"region":"east","site":"shop-1","uses":3,"ttl":"2h","labels":{"bank":"icbc"}}`,
	`{"region":"East","site":""}`,
	`{"labels":{"bank":"icbc","old":""}}`,
	`{"token":"ebx1.AAAA","csr":"-----BEGIN CERTIFICATE REQUEST-----\n-----END CERTIFICATE REQUEST-----\n"}`,
	`{"ttl":"-5h","uses":-1}`,
	`{"user":"admin","password":"x","token_name":"cli","token_ttl":"1h"}`,
	`{"name":"bob","password":"a long enough password","role":"viewer"}`,
	`{"id":"bank-1","name":"<b>Bank</b>"}`,
	`{"rules":[{"kind":"box-offline","for_minutes":10},{"kind":"cert-expiry","days":14}],"webhooks":[{"url":"https://ops.example/hook","secret":"s"}]}`,
	`{"kind":"box-down","box":"teller-1","site":"shop-1","for":"2h","comment":"disk"}`,
	`[1,2,3]`, `null`, `{`, ``,
}

// FuzzAPIBodies sends arbitrary bodies to every endpoint that takes one: the
// API must answer with a client error or success, never fail or panic.
func FuzzAPIBodies(f *testing.F) {
	h, tok := newAPI(f)
	for _, s := range bodySeeds {
		f.Add(s)
	}
	paths := []string{"/api/v1/tokens", "/api/v1/boxes/bx-1/labels", "/api/v1/enroll", "/api/v1/login", "/api/v1/users",
		"/api/v1/tenants", "/api/v1/apitokens", "/api/v1/me/password", "/api/v1/silences", "PUT /api/v1/alert-rules"}
	f.Fuzz(func(t *testing.T, body string) {
		for _, p := range paths {
			method := http.MethodPost
			if m, path, ok := strings.Cut(p, " "); ok {
				method, p = m, path
			}
			req := httptest.NewRequest(method, p, bytes.NewBufferString(body))
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code >= 500 {
				t.Fatalf("%s %s %q: %d %s", method, p, body, rec.Code, rec.Body)
			}
		}
	})
}

func TestAPIRefusesWithoutToken(t *testing.T) {
	t.Parallel()
	h, _ := newAPI(t)
	for _, p := range []string{"/api/v1/boxes", "/api/v1/tokens", "/api/v1/audit", "/metrics"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
		if rec.Code != http.StatusUnauthorized || !bytes.Contains(rec.Body.Bytes(), []byte(`"error"`)) {
			t.Errorf("GET %s without a token: %d %s", p, rec.Code, rec.Body)
		}
	}
}
