package registry

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestCatalog: the catalog lists the repositories a caller sees, in
// order, a page at a time with a Link to the next as the spec draws it;
// n=1000 works, n beyond the limit gets the limit, a bad n is refused;
// repositories a caller does not see are neither listed nor served.
func TestCatalog(t *testing.T) {
	t.Parallel()
	reg := newTestRegistry(t, DefaultConfig(t.TempDir()))
	all := serveOperators(t, reg, nil)
	repos := []string{"a/one", "bb", "robots/icbc", "robots/icbc/vm", "robots/zz", "z9"}
	img := randomImage(t)
	for _, r := range repos {
		push(t, all, r+":1", img)
	}
	notMine := func(repo string) bool { return !strings.HasPrefix(repo, "robots/") }
	some := serveOperators(t, reg, notMine)

	get := func(t *testing.T, base, path string) (*http.Response, []string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var doc struct {
			Repositories []string `json:"repositories"`
		}
		if resp.StatusCode == http.StatusOK {
			if err := json.Unmarshal(body, &doc); err != nil || doc.Repositories == nil {
				t.Fatalf("GET %s: %s: %v", path, body, err)
			}
		} else {
			oneError(t, body)
		}
		return resp, doc.Repositories
	}
	for _, c := range []struct {
		query string
		want  []string
		link  string
	}{
		{"", repos, ""},
		{"?n=1000", repos, ""},
		{"?n=100000", repos, ""},
		{"?n=0", []string{}, ""},
		{"?n=2", repos[:2], "</v2/_catalog?last=bb&n=2>; rel=\"next\""},
		{"?n=2&last=bb", repos[2:4], "</v2/_catalog?last=robots%2Ficbc%2Fvm&n=2>; rel=\"next\""},
		{"?n=2&last=robots/icbc/vm", repos[4:], ""},
		{"?last=robots", repos[2:], ""},
		{"?last=zzz", []string{}, ""},
	} {
		resp, got := get(t, all.URL, "/v2/_catalog"+c.query)
		if resp.StatusCode != http.StatusOK || !slices.Equal(got, c.want) || resp.Header.Get("Link") != c.link {
			t.Errorf("catalog%s: %s %q, Link %q; want %q, Link %q", c.query, resp.Status, got, resp.Header.Get("Link"), c.want, c.link)
		}
	}
	for _, q := range []string{"?n=-1", "?n=abc", "?n=1e3", "?last=" + strings.Repeat("a", 300)} {
		if resp, _ := get(t, all.URL, "/v2/_catalog"+q); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("catalog%s: %s, want 400", q, resp.Status)
		}
	}

	// A real client pages through it.
	host := strings.TrimPrefix(all.URL, "http://")
	r, _ := name.NewRegistry(host, name.Insecure)
	got, err := remote.Catalog(context.Background(), r, remote.WithPageSize(4))
	if err != nil || !slices.Equal(got, repos) {
		t.Errorf("remote.Catalog: %q, %v", got, err)
	}

	// A caller who does not see robots/…: not listed, not served.
	var want []string
	for _, r := range repos {
		if notMine(r) {
			want = append(want, r)
		}
	}
	if _, got := get(t, some.URL, "/v2/_catalog"); !slices.Equal(got, want) {
		t.Errorf("filtered catalog: %q, want %q", got, want)
	}
	resp, got1 := get(t, some.URL, "/v2/_catalog?n=1&last=a/one")
	if !slices.Equal(got1, []string{"bb"}) || resp.Header.Get("Link") != "</v2/_catalog?last=bb&n=1>; rel=\"next\"" {
		t.Errorf("filtered page: %q, Link %q", got1, resp.Header.Get("Link"))
	}
	if resp, got := get(t, some.URL, "/v2/_catalog?n=1&last=bb"); !slices.Equal(got, []string{"z9"}) || resp.Header.Get("Link") != "" {
		t.Errorf("filtered last page: %q, Link %q", got, resp.Header.Get("Link"))
	}
	// Nor mounted from: the upload starts empty instead.
	layers, _ := img.Layers()
	ld, _ := layers[0].Digest()
	for _, c := range []struct {
		srv  string
		want int
	}{{all.URL, http.StatusCreated}, {some.URL, http.StatusAccepted}} {
		resp, err := http.Post(c.srv+"/v2/z9/blobs/uploads/?mount="+ld.String()+"&from=robots/icbc", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("mount from robots/icbc: %s, want %d", resp.Status, c.want)
		}
	}
	for _, path := range []string{"/v2/robots/icbc/manifests/1", "/v2/robots/icbc/tags/list"} {
		resp, err := http.Get(some.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || oneError(t, body) != "NAME_UNKNOWN" {
			t.Errorf("GET %s by a caller who does not see it: %s %s", path, resp.Status, body)
		}
	}
}
