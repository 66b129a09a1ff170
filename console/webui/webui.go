// Package webui serves the web console: the app web/ builds with Vite into
// dist/, embedded in the console's binary, so the console needs no Node
// and the browser loads nothing from anywhere else. Every answer carries a
// Content-Security-Policy that allows scripts, styles and connections to
// the console's own origin only, and no inline script.
package webui

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed all:dist
var dist embed.FS

// CSP is the Content-Security-Policy of the web console. Scripts come
// from the console alone; 'wasm-unsafe-eval' lets them compile
// WebAssembly (the recording player's core is), and allows no eval of
// JavaScript.
const CSP = "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self'; img-src 'self' data:; font-src 'self'; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Handler serves the app: files under /assets/ (named by their content's
// hash, so cached for good), and index.html for every other path, which
// the app routes itself. It answers GET and HEAD only.
func Handler() http.Handler {
	root, err := fs.Sub(dist, "dist")
	if err != nil {
		panic(err) // the embed pattern names dist: it is there
	}
	index, _ := fs.ReadFile(root, "index.html")
	files := http.FileServerFS(root)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", CSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		p := path.Clean("/" + r.URL.Path)
		if strings.HasPrefix(p, "/assets/") {
			if _, err := fs.Stat(root, p[1:]); err != nil {
				http.NotFound(w, r)
				return
			}
			h.Set("Cache-Control", "public, max-age=31536000, immutable")
			files.ServeHTTP(w, r)
			return
		}
		if index == nil {
			http.Error(w, "the web console was not built into this binary (make web)", http.StatusNotFound)
			return
		}
		h.Set("Cache-Control", "no-cache")
		h.Set("Content-Type", "text/html; charset=utf-8")
		w.Write(index)
	})
}
