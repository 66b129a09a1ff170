package registry

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// routeCases seed both TestParseRoute and FuzzParseRoute.
var routeCases = []struct {
	path string
	want route
	code string // the error code when refused
}{
	{"/v2/", route{kind: routeBase}, ""},
	{"/v2", route{kind: routeBase}, ""},
	{"/v2/_catalog", route{kind: routeCatalog}, ""},
	{"/v2/robots/icbc/tags/list", route{kind: routeTags, repo: "robots/icbc"}, ""},
	{"/v2/robots/icbc/manifests/1.2", route{kind: routeManifest, repo: "robots/icbc", ref: "1.2"}, ""},
	{"/v2/a/manifests/" + testDigest, route{kind: routeManifest, repo: "a", ref: testDigest}, ""},
	{"/v2/a/blobs/" + testDigest, route{kind: routeBlob, repo: "a", ref: testDigest}, ""},
	{"/v2/a/blobs/x/blobs/" + testDigest, route{kind: routeBlob, repo: "a/blobs/x", ref: testDigest}, ""},
	{"/v2/a/blobs/uploads/", route{kind: routeUploads, repo: "a"}, ""},
	{"/v2/a/blobs/uploads", route{kind: routeUploads, repo: "a"}, ""},
	{"/v2/a/blobs/uploads/3f1c-aa_b.c=", route{kind: routeUpload, repo: "a", ref: "3f1c-aa_b.c="}, ""},
	{"/v2/a/referrers/" + testDigest, route{kind: routeReferrers, repo: "a", ref: testDigest}, ""},
	{"/v2/a__b/c-d/e.f/manifests/latest", route{kind: routeManifest, repo: "a__b/c-d/e.f", ref: "latest"}, ""},
	{"/v2/" + strings.Repeat("a", 255) + "/tags/list", route{kind: routeTags, repo: strings.Repeat("a", 255)}, ""},

	{"/v2/" + strings.Repeat("a", 256) + "/tags/list", route{}, "NAME_INVALID"},
	{"/v2/" + strings.Repeat("ab/", 100) + "c/manifests/latest", route{}, "NAME_INVALID"},
	{"/v2/UPPER/manifests/latest", route{}, "NAME_INVALID"},
	{"/v2/a//b/manifests/latest", route{}, "NAME_INVALID"},
	{"/v2/a/../b/manifests/latest", route{}, "NAME_INVALID"},
	{"/v2/-a/manifests/latest", route{}, "NAME_INVALID"},
	{"/v2/a_/manifests/latest", route{}, "NAME_INVALID"},
	{"/v2/a%20b/manifests/latest", route{}, "NAME_INVALID"},
	{"/v2/a b/manifests/latest", route{}, "NAME_INVALID"},
	{"/v2/_uploads/manifests/latest", route{}, "NAME_INVALID"},
	{"/v2//manifests/latest", route{}, "NAME_INVALID"},
	{"/v2/a/manifests/-tag", route{}, "MANIFEST_INVALID"},
	{"/v2/a/manifests/sha256:short", route{}, "MANIFEST_INVALID"},
	{"/v2/a/manifests/", route{}, "MANIFEST_INVALID"},
	{"/v2/a/blobs/latest", route{}, "DIGEST_INVALID"},
	{"/v2/a/referrers/sha256:00", route{}, "DIGEST_INVALID"},
	{"/v2/a/blobs/uploads/a/b", route{}, "UNSUPPORTED"},
	{"/v2/a/blobs/uploads/" + strings.Repeat("u", 300), route{}, "BLOB_UPLOAD_UNKNOWN"},
	{"/v2/a/blobs/uploads/x%y", route{}, "BLOB_UPLOAD_UNKNOWN"},
	{"/v2/a", route{}, "UNSUPPORTED"},
	{"/v2/a/tags/list/", route{}, "UNSUPPORTED"},
	{"/v2/a/wat/x", route{}, "UNSUPPORTED"},
	{"/v3/a/manifests/latest", route{}, "UNSUPPORTED"},
	{"/", route{}, "UNSUPPORTED"},
}

func TestParseRoute(t *testing.T) {
	t.Parallel()
	for _, c := range routeCases {
		got, err := parseRoute(c.path)
		switch {
		case c.code == "" && err != nil:
			t.Errorf("parseRoute(%.60q): %v", c.path, err)
		case c.code == "" && got != c.want:
			t.Errorf("parseRoute(%.60q) = %+v, want %+v", c.path, got, c.want)
		case c.code != "" && (err == nil || err.code != c.code):
			t.Errorf("parseRoute(%.60q) = %+v, %v; want %s", c.path, got, err, c.code)
		case c.code != "" && (err.status < 400 || err.status > 499):
			t.Errorf("parseRoute(%.60q) answers %d", c.path, err.status)
		}
	}
}

func FuzzParseRoute(f *testing.F) {
	for _, c := range routeCases {
		f.Add(c.path)
	}
	f.Fuzz(func(t *testing.T, path string) {
		rt, err := parseRoute(path)
		if err != nil {
			if err.status < 400 || err.status > 499 || err.code == "" || err.msg == "" {
				t.Fatalf("parseRoute(%q) refused with %d %q %q", path, err.status, err.code, err.msg)
			}
			return
		}
		if methods[rt.kind] == nil {
			t.Fatalf("parseRoute(%q) = kind %d with no methods", path, rt.kind)
		}
		switch rt.kind {
		case routeBase, routeCatalog:
			if rt.repo != "" {
				t.Fatalf("parseRoute(%q) = %+v", path, rt)
			}
		default:
			if len(rt.repo) > maxNameLen || !nameRE.MatchString(rt.repo) || !strings.HasPrefix(path, "/v2/"+rt.repo+"/") {
				t.Fatalf("parseRoute(%q) accepted repository %q", path, rt.repo)
			}
		}
	})
}

// TestBadNamesOnEveryRoute: a malformed repository name, on every
// endpoint and with every method, answers a 4xx with exactly one
// well-formed error body, from the real registry behind the operators'
// door, never a 500.
func TestBadNamesOnEveryRoute(t *testing.T) {
	t.Parallel()
	reg := newTestRegistry(t, DefaultConfig(t.TempDir()))
	srv := serveOperators(t, reg, nil)
	bad := map[string]string{
		"too long":          strings.Repeat("a", 256),
		"too long, nested":  strings.Repeat("robots/", 40) + "x",
		"upper case":        "Robots/ICBC",
		"bad character":     "robots/ic$bc",
		"space":             "robots/ic bc",
		"empty component":   "robots//icbc",
		"dot component":     "robots/./icbc",
		"dot-dot":           "robots/../icbc",
		"leading separator": "-robots",
		"trailing sep":      "robots_",
		"underscore first":  "_catalog/x",
		"unicode":           "robots/ícbc",
		"control character": "robots/a\x01b",
	}
	suffixes := []string{"/tags/list", "/manifests/latest", "/manifests/" + testDigest, "/blobs/" + testDigest,
		"/blobs/uploads/", "/blobs/uploads/abc-123", "/referrers/" + testDigest}
	verbs := []string{http.MethodGet, http.MethodHead, http.MethodPut, http.MethodPost, http.MethodPatch, http.MethodDelete}
	for what, name := range bad {
		t.Run(what, func(t *testing.T) {
			t.Parallel()
			for _, suffix := range suffixes {
				for _, verb := range verbs {
					u := srv.URL + "/v2/" + escapePath(name) + suffix
					req, err := http.NewRequest(verb, u, strings.NewReader("{}"))
					if err != nil {
						t.Fatal(err)
					}
					resp, err := srv.Client().Do(req)
					if err != nil {
						t.Fatalf("%s %s: %v", verb, suffix, err)
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode < 400 || resp.StatusCode > 499 {
						t.Errorf("%s /v2/%.40s…%s: %d, want a 4xx", verb, name, suffix, resp.StatusCode)
						continue
					}
					if verb == http.MethodHead {
						continue
					}
					if code := oneError(t, body); code != "NAME_INVALID" {
						t.Errorf("%s /v2/%.40s…%s: code %q, want NAME_INVALID", verb, name, suffix, code)
					}
				}
			}
		})
	}
}

// oneError checks that body is exactly one JSON error document of the
// distribution API and returns its code.
func oneError(t *testing.T, body []byte) string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(body))
	var doc struct {
		Errors []struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"errors"`
	}
	if err := dec.Decode(&doc); err != nil {
		t.Errorf("error body %.200q: %v", body, err)
		return ""
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Errorf("error body %.300q holds more than one document", body)
	}
	if len(doc.Errors) != 1 || doc.Errors[0].Message == "" {
		t.Errorf("error body %.200q: want one error with a message", body)
		return ""
	}
	return doc.Errors[0].Code
}

// escapePath escapes what a URL cannot carry as is, leaving slashes.
func escapePath(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '/' || c == '.' || c == '-' || c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '$' {
			b.WriteByte(c)
			continue
		}
		b.WriteString("%" + strings.ToUpper(string("0123456789abcdef"[c>>4])+string("0123456789abcdef"[c&15])))
	}
	return b.String()
}
