package webui

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestServesTheAppWithAStrictPolicy(t *testing.T) {
	t.Parallel()
	h := Handler()
	get := func(method, path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec
	}
	assets, err := fs.Glob(dist, "dist/assets/*.js")
	if err != nil || len(assets) == 0 {
		t.Fatalf("no built script in dist/assets (make web): %v", err)
	}
	asset := strings.TrimPrefix(assets[0], "dist")
	for _, p := range []string{"/", "/boxes/bx-1", "/login?next=%2Fkeys", "/waiting"} {
		rec := get("GET", p)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `<div id="app">`) || rec.Header().Get("Cache-Control") != "no-cache" {
			t.Errorf("GET %s: %d %q %s", p, rec.Code, rec.Header().Get("Cache-Control"), rec.Body)
		}
	}
	rec := get("GET", asset)
	if rec.Code != http.StatusOK || !strings.Contains(rec.Header().Get("Cache-Control"), "immutable") ||
		!strings.Contains(rec.Header().Get("Content-Type"), "javascript") {
		t.Errorf("GET %s: %d %v", asset, rec.Code, rec.Header())
	}
	if rec := get("GET", "/assets/nope.js"); rec.Code != http.StatusNotFound {
		t.Errorf("a missing asset: %d", rec.Code)
	}
	if rec := get("POST", "/"); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /: %d", rec.Code)
	}
	csp := rec.Header().Get("Content-Security-Policy")
	for _, want := range []string{"script-src 'self'", "frame-ancestors 'none'", "object-src 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
	}
	// WebAssembly may compile (the recording player); no inline script,
	// no eval of JavaScript.
	if strings.Contains(strings.ReplaceAll(csp, "'wasm-unsafe-eval'", ""), "unsafe") {
		t.Errorf("CSP %q allows something unsafe", csp)
	}
	index := get("GET", "/").Body.String()
	if strings.Contains(index, "<script>") || strings.Contains(index, "<style") {
		t.Errorf("index.html has inline script or style:\n%s", index)
	}
}
