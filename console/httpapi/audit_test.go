package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/apps"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/audit/audittest"
	"github.com/edgebox/edgebox/console/auth"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/keys"
	"github.com/edgebox/edgebox/console/store/storetest"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// TestChangesAreAuditedAsTheCaller: each mutating call on apps, keys and a
// box's desired state leaves exactly one audit entry, the domain
// operation's, with the calling token's tenant and name and the client's
// address; when that entry cannot be written, the call fails and leaves
// no entry.
func TestChangesAreAuditedAsTheCaller(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := audittest.Wrap(storetest.Bolt(t))
	fl, err := fleet.New(ctx, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	toks := auth.New(s)
	tok, err := toks.Create(ctx, auth.APIToken{Name: "ops", TenantID: fleet.DefaultTenant, Role: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	admin := audit.Actor{TenantID: fleet.DefaultTenant, Name: "admin"}
	etok, _, err := fl.CreateToken(ctx, admin, fleet.TokenSpec{Region: "east", Site: "a", TTL: time.Hour, Uses: 1},
		"https://127.0.0.1:8443", sha256.Sum256([]byte("ca")), [32]byte{})
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := fl.Enroll(ctx, fleet.Enrollment{Token: etok, Hostname: "h", Name: "shop-1",
		Issue: func(string) ([]byte, time.Time, error) { return []byte("cert"), time.Now().Add(time.Hour), nil }})
	if err != nil {
		t.Fatal(err)
	}
	d := desired.New(s)
	kr := keys.New(s, d)
	dev := &edgeboxv1.UsbDevice{Port: "1-2", VendorId: "096e", ProductId: "0702", Serial: "S1"}
	if err := kr.Report(ctx, b, []*edgeboxv1.UsbDevice{dev}); err != nil {
		t.Fatal(err)
	}
	key := keys.ID(b.ID, dev)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	h := New(Deps{Fleet: fl, Audit: audit.New(s, nil), Tokens: toks, Sessions: noSessions{}, Desired: d, Keys: kr,
		Apps: apps.New(s, d, fl, nil, []string{"127.0.0.1:8443"}, kr, log), Metrics: http.NotFoundHandler(), Log: log})

	call := func(method, path, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, bytes.NewBufferString(body))
		req.RemoteAddr = "198.51.100.7:40000"
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	// The calls run in order, each on what the one before left.
	for _, tc := range []struct {
		method, path, body     string
		action, target, detail string
	}{
		{method: "POST", path: "/api/v1/apps", body: `{"name":"clock"}`, action: "app.create", target: "clock"},
		{method: "POST", path: "/api/v1/apps/clock/releases", body: `{"version":"1","runtime":"process","image":"/bin/sleep"}`,
			action: "release.create", target: "clock@1", detail: "/bin/sleep"},
		{method: "PUT", path: "/api/v1/apps/clock/pins/region/east", body: `{"version":"1"}`,
			action: "app.deploy", target: "clock@1", detail: "region east"},
		{method: "DELETE", path: "/api/v1/apps/clock/pins/region/east",
			action: "app.undeploy", target: "clock", detail: "region east"},
		{method: "DELETE", path: "/api/v1/apps/clock", action: "app.delete", target: "clock"},
		{method: "PUT", path: "/api/v1/boxes/shop-1/desired/Workload/robot", body: `{"app":"robot","release":"1","runtime":"process","image":"/bin/sleep"}`,
			action: "desired.put", target: b.ID, detail: "Workload/robot at revision 3"},
		{method: "DELETE", path: "/api/v1/boxes/shop-1/desired/Workload/robot",
			action: "desired.delete", target: b.ID, detail: "Workload/robot at revision 4"},
		{method: "POST", path: "/api/v1/keys/" + key + "/labels", body: `{"labels":{"bank":"icbc"}}`, action: "key.label", target: key},
		{method: "POST", path: "/api/v1/keys/" + key + "/lease", body: `{"workload":"robot"}`,
			action: "key.lease", target: key, detail: "to workload robot on box " + b.ID},
		{method: "POST", path: "/api/v1/keys/" + key + "/release", action: "key.release", target: key, detail: "on box " + b.ID},
	} {
		name := tc.method + " " + tc.path
		before := len(audittest.Entries(t, s))
		s.Fail(true)
		rec := call(tc.method, tc.path, tc.body)
		s.Fail(false)
		if rec.Code < 500 {
			t.Fatalf("%s with the audit write failing: %d %s", name, rec.Code, rec.Body)
		}
		if n := len(audittest.Entries(t, s)); n != before {
			t.Fatalf("%s with the audit write failing left %d entries", name, n-before)
		}
		if rec := call(tc.method, tc.path, tc.body); rec.Code >= 300 {
			t.Fatalf("%s: %d %s", name, rec.Code, rec.Body)
		}
		es := audittest.Entries(t, s)
		if len(es) != before+1 {
			t.Fatalf("%s left %d audit entries, want 1: %+v", name, len(es)-before, es[before:])
		}
		e := es[len(es)-1]
		want := audit.Entry{Seq: e.Seq, Time: e.Time, TenantID: fleet.DefaultTenant, Actor: "ops", Remote: "198.51.100.7",
			Action: tc.action, Target: tc.target, Result: "ok", Detail: tc.detail}
		if e != want {
			t.Errorf("%s: entry %+v, want %+v", name, e, want)
		}
	}
}
