package httpapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/auth"
	"github.com/edgebox/edgebox/console/dist"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/pki"
	"github.com/edgebox/edgebox/console/store/storetest"
	"github.com/edgebox/edgebox/scripts"
)

const testConsoleURL = "https://127.0.0.1:8443"

// downloadsAPI is the API serving the downloads in dir, and the console
// CA's hash.
func downloadsAPI(t *testing.T, dir string) (http.Handler, string) {
	t.Helper()
	data := t.TempDir()
	st := storetest.Bolt(t)
	a, _, err := pki.Open(data+"/pki", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	fl, err := fleet.New(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	downloads, err := dist.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := New(Deps{Fleet: fl, Audit: audit.New(st, nil), Tokens: auth.New(st), PKI: a, Sessions: noSessions{},
		ConsoleURL: testConsoleURL, BoxCertTTL: time.Hour, Metrics: http.NotFoundHandler(), Downloads: downloads,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ca := a.CAHash()
	return h, hex.EncodeToString(ca[:])
}

func get(t *testing.T, h http.Handler, path string) (int, []byte) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.Bytes()
}

// TestInstallPs1DownloadsWhatTheConsoleServes: the install.ps1 a console
// serves names an agent its /dl/ serves, and demands the SHA-256 of
// exactly that file; the CA it pins is the console's. A binary changed
// after the console fixed its sums is served, but no longer matches what
// the script demands, so the script refuses it. A console without a
// Windows agent serves a script that says so.
func TestInstallPs1DownloadsWhatTheConsoleServes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		files   map[string]string
		tamper  bool
		noAgent bool
	}{
		{name: "served", files: map[string]string{scripts.WindowsAgent: "MZ windows agent", "edgebox-agent-linux-amd64": "ELF linux agent"}},
		{name: "changed after start", files: map[string]string{scripts.WindowsAgent: "MZ windows agent"}, tamper: true},
		{name: "no Windows agent", files: map[string]string{"edgebox-agent-linux-amd64": "ELF linux agent"}, noAgent: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			for name, body := range c.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			h, caHash := downloadsAPI(t, dir)
			if c.tamper {
				os.WriteFile(filepath.Join(dir, scripts.WindowsAgent), []byte("MZ evil agent"), 0o755)
			}
			code, body := get(t, h, "/install.ps1")
			if code != http.StatusOK {
				t.Fatalf("GET /install.ps1: %d %s", code, body)
			}
			ps := string(body)
			if !strings.Contains(ps, "$CaSha256 = '"+caHash+"'") {
				t.Fatalf("the script does not pin the console's CA %s", caHash)
			}
			url, want, err := scripts.Ps1Download(ps)
			if err != nil {
				t.Fatal(err)
			}
			path, ok := strings.CutPrefix(url, testConsoleURL)
			if !ok || !strings.HasPrefix(path, "/dl/") {
				t.Fatalf("the script downloads %s, not from this console's /dl/", url)
			}
			code, agent := get(t, h, path)
			if c.noAgent {
				if want != "" || code != http.StatusNotFound || !strings.Contains(ps, "serves no Windows agent") {
					t.Fatalf("without a Windows agent: sum %q, GET %s: %d", want, path, code)
				}
				return
			}
			if code != http.StatusOK {
				t.Fatalf("GET %s: %d %s", path, code, agent)
			}
			sum := sha256.Sum256(agent)
			if match := hex.EncodeToString(sum[:]) == want; match == c.tamper {
				t.Fatalf("the served agent's SHA-256 %x, the script demands %s (changed after start: %v)", sum, want, c.tamper)
			}
		})
	}
}
