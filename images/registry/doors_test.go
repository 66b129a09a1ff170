package registry

import (
	"strings"
	"testing"
)

func TestParseTarget(t *testing.T) {
	t.Parallel()
	const d = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	repo, got, err := parseTarget("/v2/robots/icbc/manifests/" + d)
	if err != nil || repo != "robots/icbc" || got.String() != d {
		t.Fatalf("manifest: %q %q %v", repo, got, err)
	}
	repo, got, err = parseTarget("/v2/a/blobs/x/blobs/" + d)
	if err != nil || repo != "a/blobs/x" || got.String() != d {
		t.Fatalf("blob: %q %q %v", repo, got, err)
	}
	for _, bad := range []string{"/v2/a/manifests/latest", "/v2/_catalog", "/v2/a/tags/list", "/v3/a/blobs/" + d,
		"/v2/a/blobs/uploads/", "/v2//manifests/" + d} {
		if _, _, err := parseTarget(bad); err == nil {
			t.Errorf("parseTarget(%q) accepted", bad)
		}
	}
}

func FuzzParseTarget(f *testing.F) {
	f.Add("/v2/robots/icbc/manifests/sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
	f.Add("/v2/a/blobs/sha512:00")
	f.Add("/v2//blobs/")
	f.Fuzz(func(t *testing.T, path string) {
		repo, d, err := parseTarget(path)
		if err != nil {
			return
		}
		if repo == "" || d.Validate() != nil || !strings.HasPrefix(path, "/v2/"+repo+"/") {
			t.Fatalf("parseTarget(%q) = %q, %q", path, repo, d)
		}
	})
}
