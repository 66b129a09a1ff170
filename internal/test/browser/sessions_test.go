package browser

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// TestWebSessions runs a remote session from the web console, in
// Chromium, on a real agent (the process runtime: a shell on the box
// itself is a shell on this machine): an admin opens a shell on the box's
// page, types a command and sees its output, narrows the window and the
// box hears the new size, sees the shell live on the Sessions page, and
// leaves the shell; the Sessions page shows how it ended; a shell whose
// page is left ends; on a box kept to four eyes a shell waits until a
// maintainer approves it, who then watches it at the admin's terminal's
// size and ends it; an admin edits the session rules on the Sessions page
// (a bad line saves nothing), which a maintainer only reads; the box page
// opens a web page the box serves itself in a new tab; an auditor finds
// the recording intact and plays it; a viewer is offered no shell. Then
// the Alerts page, under a rule that every box's certificate ends too
// soon: an incident fires for each box and reaches a webhook once; a
// maintainer silences one and ends the silence, which repeats nothing;
// a viewer only reads; an admin sets a webhook secret and tests the
// webhook, whose test post comes signed; the box page shows the box's
// health and vitals. web/tests/sessions.mjs says each step.
func TestWebSessions(t *testing.T) {
	t.Parallel()
	h := testenv.NewBinaries(t)
	ctx := context.Background()
	admin := h.Admin()

	box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "shop-1"}), "shell-box")
	if err != nil {
		t.Fatal(err)
	}
	testenv.StartAgentArgs(t, box, "--workload-uids", "2020000") // users of its own, as in TestWebConsole
	// A second box, where money is: the tenant keeps its sessions to
	// four eyes.
	money, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "shop-1"}), "money-box")
	if err != nil {
		t.Fatal(err)
	}
	testenv.StartAgentArgs(t, money, "--workload-uids", "2030000")
	if _, err := admin.Label(ctx, money.ID(), map[string]string{"money": "yes"}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.SetSessionRules(ctx, api.SessionRules{FourEyes: []api.BoxMatch{{Labels: map[string]string{"money": "yes"}}}}); err != nil {
		t.Fatal(err)
	}
	for _, u := range []api.UserRequest{
		{Name: "vera", Password: "vera's long password", Role: "viewer"},
		{Name: "audrey", Password: "audrey's long password", Role: "auditor"},
		{Name: "max", Password: "max's long password", Role: "maintainer"},
	} {
		if _, err := admin.CreateUser(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	// A web page the box serves itself, on its loopback: the agent runs
	// on this machine, whose 127.0.0.1 is the box's. It notes what each
	// request carried, which must be none of the console's secrets.
	const boxPage = "hello from the box's own page"
	var (
		pageMu   sync.Mutex
		pageGets []string
	)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pageMu.Lock()
		pageGets = append(pageGets, fmt.Sprintf("%s %s cookie=%q csrf=%q", r.Method, r.URL.Path, r.Header.Get("Cookie"), r.Header.Get("X-CSRF-Token")))
		pageMu.Unlock()
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, "<!doctype html><title>box page</title><h1 id=greeting>%s</h1>", boxPage)
	}))
	t.Cleanup(web.Close)
	webPort := web.Listener.Addr().(*net.TCPAddr).Port

	testenv.WaitFor(t, 30*time.Second, "the boxes online", func() bool {
		for _, id := range []string{box.ID(), money.ID()} {
			if b, err := admin.Box(ctx, id); err != nil || !b.Online {
				return false
			}
		}
		return true
	})

	// Alerts: box certificates last less than a year, so this rule fires
	// at once for each box (setting the rules starts an evaluation), and
	// each incident is posted to the webhook, which records what it takes.
	const hookSecret = "the webhook's secret"
	var (
		hookMu    sync.Mutex
		hookPosts []webhookPost
	)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		p := webhookPost{signature: r.Header.Get("X-Edgebox-Signature"), body: body}
		if err == nil {
			err = json.Unmarshal(body, &p)
		}
		if err != nil {
			t.Errorf("the webhook took a post it cannot read: %v: %s", err, body)
		}
		hookMu.Lock()
		hookPosts = append(hookPosts, p)
		hookMu.Unlock()
	}))
	t.Cleanup(hook.Close)
	if _, err := admin.SetAlertRules(ctx, api.AlertRules{Rules: []api.AlertRule{{Kind: "cert-expiry", Days: 365}},
		Webhooks: []api.Webhook{{URL: hook.URL}}}); err != nil {
		t.Fatal(err)
	}

	t.Cleanup(func() { // what the sessions recorded, when a step failed
		if !t.Failed() {
			return
		}
		recs, err := admin.Sessions(context.Background(), false, "")
		if err != nil {
			t.Logf("sessions: %v", err)
		}
		for _, r := range recs {
			var cast bytes.Buffer
			err := admin.SessionRecording(context.Background(), r.ID, &cast)
			t.Logf("session %s on %s by %s, ended by %q (%v): recording %v\n%s", r.ID, r.BoxName, r.User, r.EndedBy, r.Error, err, cast.String())
		}
	})
	runScript(t, "sessions.mjs",
		"EDGEBOX_URL="+h.URL(),
		"EDGEBOX_ADMIN_PASSWORD="+h.AdminPassword(),
		"EDGEBOX_BOX="+box.ID(),
		"EDGEBOX_VIEWER=vera",
		"EDGEBOX_VIEWER_PASSWORD=vera's long password",
		"EDGEBOX_AUDITOR=audrey",
		"EDGEBOX_AUDITOR_PASSWORD=audrey's long password",
		"EDGEBOX_MAINTAINER=max",
		"EDGEBOX_MAINTAINER_PASSWORD=max's long password",
		"EDGEBOX_FOUR_EYES_BOX="+money.ID(),
		"EDGEBOX_BOX_WEB_PORT="+strconv.Itoa(webPort),
		"EDGEBOX_BOX_WEB_TEXT="+boxPage,
		"EDGEBOX_WEBHOOK_URL="+hook.URL,
		"EDGEBOX_WEBHOOK_SECRET="+hookSecret,
		"EDGEBOX_SCREENSHOTS="+screenshots(t))

	// The webhook was told once that each box's incident fired: the
	// silence on shell-box's came after its post, and its end repeated
	// nothing. The admin's test came once, signed with the secret the
	// page set.
	hookMu.Lock()
	posts := append([]webhookPost(nil), hookPosts...)
	hookMu.Unlock()
	firing := map[string]int{}
	tests := 0
	for _, p := range posts {
		switch {
		case p.Status == "firing" && p.Incident.Kind == "cert-expiry":
			firing[p.Incident.Box]++
		case p.Status == "test":
			tests++
			mac := hmac.New(sha256.New, []byte(hookSecret))
			mac.Write(p.body)
			if want := "sha256=" + hex.EncodeToString(mac.Sum(nil)); p.signature != want {
				t.Errorf("the test post is signed %q, not %q", p.signature, want)
			}
		default:
			t.Errorf("the webhook took a post it should not have: %s", p.body)
		}
	}
	if want := map[string]int{box.ID(): 1, money.ID(): 1}; !reflect.DeepEqual(firing, want) || tests != 1 {
		t.Errorf("the webhook took firing cert-expiry posts by box %v (want one for each of %v) and %d test posts (want 1)", firing, want, tests)
	}
	alertRules, err := admin.GetAlertRules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []api.Webhook{{URL: hook.URL, HasSecret: true}}; !reflect.DeepEqual(alertRules.Webhooks, want) || alertRules.UpdatedBy != "admin" {
		t.Errorf("the alert rules the page saved: %+v, want webhooks %+v by admin", alertRules, want)
	}
	if sils, err := admin.Silences(ctx); err != nil || len(sils.Silences) != 0 {
		t.Errorf("silences after the page ended them: %+v %v", sils, err)
	}

	// The rules the admin saved on the page: the four-eyes rule kept, the
	// one added, and the forward allow lists, in that order.
	rules, err := admin.GetSessionRules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantRules := api.SessionRules{
		FourEyes:     []api.BoxMatch{{Labels: map[string]string{"money": "yes"}}, {Labels: map[string]string{"city": "new york"}, Site: "shop-9"}},
		ForwardSites: map[string][]string{"shop-1": {"192.168.1.0/24:80", "printer.lan:631"}},
		ForwardBoxes: map[string][]string{box.ID(): {"10.1.2.3:8000-8080"}},
	}
	if got := (api.SessionRules{FourEyes: rules.FourEyes, ForwardSites: rules.ForwardSites, ForwardBoxes: rules.ForwardBoxes}); !reflect.DeepEqual(got, wantRules) {
		t.Errorf("the session rules the page saved:\n got %+v\nwant %+v", got, wantRules)
	}
	if rules.UpdatedBy != "admin" {
		t.Errorf("the session rules were saved by %q, not admin", rules.UpdatedBy)
	}
	// The box's page was asked for through the console, which passed on
	// none of the browser's cookies or the console's CSRF token.
	pageMu.Lock()
	gets := pageGets
	pageMu.Unlock()
	if len(gets) == 0 {
		t.Error("the box's own web page was never asked for")
	}
	for _, g := range gets {
		if !strings.HasSuffix(g, `cookie="" csrf=""`) {
			t.Errorf("the box's page got the console's secrets: %s", g)
		}
	}

	// What the page did, the console recorded: a shell by admin that
	// exited with 0, whose recording holds what was typed and shown, and
	// then one that ended when its page was left.
	recs, err := admin.Sessions(ctx, false, box.ID())
	if err != nil || len(recs) != 2 {
		t.Fatalf("sessions on the box: %+v %v", recs, err)
	}
	left, r := recs[0], recs[1] // newest first
	if r.Kind != "shell" || !r.TTY || r.User != "admin" || r.Workload != "" || r.EndedBy != "exit" || r.ExitCode == nil || *r.ExitCode != 0 {
		t.Errorf("the session the page opened: %+v", r)
	}
	if left.EndedBy != "operator left" {
		t.Errorf("the session whose page was left: %+v", left)
	}
	// On the money box: approved by max, who then ended it.
	recs, err = admin.Sessions(ctx, false, money.ID())
	if err != nil || len(recs) != 1 {
		t.Fatalf("sessions on the four-eyes box: %+v %v", recs, err)
	}
	if m := recs[0]; !m.FourEyes || m.ApprovedBy != "max" || m.EndedBy != "user:max" || m.User != "admin" {
		t.Errorf("the four-eyes session: %+v", m)
	}
	rep, err := admin.VerifySession(ctx, r.ID)
	if err != nil || !rep.OK {
		t.Errorf("its recording: %+v %v", rep, err)
	}
	var cast bytes.Buffer
	if err := admin.SessionRecording(ctx, r.ID, &cast); err != nil {
		t.Fatal(err)
	}
	// The command's output, and the terminal's sizes: fitted, then
	// narrowed with the window.
	if !strings.Contains(cast.String(), `hello\r\n`) || strings.Count(cast.String(), `, "r", "`) < 2 {
		t.Errorf("the recording has no hello, or fewer than two resizes:\n%s", cast.String())
	}
}

// webhookPost is what the console posted to an alert webhook.
type webhookPost struct {
	Status   string       `json:"status"`
	Incident api.Incident `json:"incident"`

	signature string // X-Edgebox-Signature
	body      []byte
}
