package registry

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcr "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

const (
	sbomType = "application/vnd.example.sbom.v1+json"
	sigType  = "application/vnd.example.signature.v1+json"
)

// push writes img to srv as repoTag with go-containerregistry, the
// client crane is built on, and returns its digest.
func push(t *testing.T, srv *httptest.Server, repoTag string, img ggcr.Image) ggcr.Hash {
	t.Helper()
	ref, err := name.ParseReference(strings.TrimPrefix(srv.URL, "http://")+"/"+repoTag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("pushing %s: %v", repoTag, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func randomImage(t *testing.T) ggcr.Image {
	t.Helper()
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// artifact is an image manifest whose config media type says what it is,
// attached to subject.
func artifact(t *testing.T, artifactType string, subject ggcr.Image, annotations map[string]string) ggcr.Image {
	t.Helper()
	d, err := subject.Digest()
	if err != nil {
		t.Fatal(err)
	}
	size, _ := subject.Size()
	mt, _ := subject.MediaType()
	img := mutate.MediaType(randomImage(t), types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.MediaType(artifactType))
	img = mutate.Annotations(img, annotations).(ggcr.Image)
	return mutate.Subject(img, ggcr.Descriptor{MediaType: mt, Digest: d, Size: size}).(ggcr.Image)
}

func getIndex(t *testing.T, srv *httptest.Server, path string) (*http.Response, v1.Index) {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var idx v1.Index
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(&idx); err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
	}
	return resp, idx
}

func digests(idx v1.Index) []string {
	var out []string
	for _, m := range idx.Manifests {
		out = append(out, m.Digest.String())
	}
	slices.Sort(out)
	return out
}

func sorted(ds ...ggcr.Hash) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.String())
	}
	slices.Sort(out)
	return out
}

// TestReferrers: artifacts pushed with a subject are found through the
// referrers API of the distribution spec v1.1 by a real client, filtered
// by artifact type on request, kept across a restart, and forgotten when
// deleted; pushing one answers OCI-Subject, so no fallback tag is made.
func TestReferrers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	reg := newTestRegistry(t, DefaultConfig(dir))
	srv := serveOperators(t, reg, nil)
	host := strings.TrimPrefix(srv.URL, "http://")

	subject := randomImage(t)
	sd := push(t, srv, "robots/icbc:1", subject)
	sbom := push(t, srv, "robots/icbc:sbom", artifact(t, sbomType, subject, map[string]string{"org.example.tool": "syft"}))
	sig := push(t, srv, "robots/icbc:sig", artifact(t, sigType, subject, nil))
	// The same subject referred to from another repository is not this
	// repository's referrer.
	push(t, srv, "robots/other:sbom", artifact(t, sbomType, subject, nil))

	// An index with its own artifactType, pushed by hand to see the
	// answer's header.
	sdesc := v1.Descriptor{MediaType: v1.MediaTypeImageManifest, Digest: digest.Digest(sd.String()), Size: 1}
	sz, _ := subject.Size()
	sdesc.Size = sz
	raw, _ := json.Marshal(v1.Index{Versioned: specsVersion2, MediaType: v1.MediaTypeImageIndex,
		ArtifactType: "application/vnd.example.bundle", Manifests: []v1.Descriptor{}, Subject: &sdesc,
		Annotations: map[string]string{"org.example.n": "1"}})
	req, _ := http.NewRequest(http.MethodPut, srv.URL+"/v2/robots/icbc/manifests/bundle", bytes.NewReader(raw))
	req.Header.Set("Content-Type", v1.MediaTypeImageIndex)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("OCI-Subject") != sd.String() {
		t.Fatalf("PUT of an index with a subject: %s, OCI-Subject %q, want 201 and %s", resp.Status, resp.Header.Get("OCI-Subject"), sd)
	}
	bundle := ggcr.Hash{Algorithm: "sha256", Hex: digest.FromBytes(raw).Encoded()}
	// A manifest with no subject gets no such header.
	plain, _ := randomImage(t).RawManifest()
	req, _ = http.NewRequest(http.MethodPut, srv.URL+"/v2/robots/icbc/manifests/plain", bytes.NewReader(plain))
	req.Header.Set("Content-Type", v1.MediaTypeImageManifest)
	if resp, err := srv.Client().Do(req); err != nil || resp.Header.Get("OCI-Subject") != "" {
		t.Fatalf("PUT without a subject: %v, OCI-Subject %q", err, resp.Header.Get("OCI-Subject"))
	}

	subjectRef, err := name.NewDigest(host+"/robots/icbc@"+sd.String(), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, want ...ggcr.Hash) {
		t.Helper()
		idx, err := remote.Referrers(subjectRef)
		if err != nil {
			t.Fatal(err)
		}
		m, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		var got []ggcr.Hash
		for _, d := range m.Manifests {
			got = append(got, d.Digest)
			switch d.Digest {
			case sbom:
				if d.ArtifactType != sbomType || d.Annotations["org.example.tool"] != "syft" || d.MediaType != types.OCIManifestSchema1 {
					t.Errorf("sbom descriptor: %+v", d)
				}
			case sig:
				if d.ArtifactType != sigType {
					t.Errorf("signature descriptor: %+v", d)
				}
			case bundle:
				if d.ArtifactType != "application/vnd.example.bundle" || d.MediaType != types.OCIImageIndex || d.Size != int64(len(raw)) {
					t.Errorf("bundle descriptor: %+v", d)
				}
			}
		}
		if g, w := sorted(got...), sorted(want...); !slices.Equal(g, w) {
			t.Errorf("referrers of %s: %v, want %v", sd, g, w)
		}
	}
	check(t, sbom, sig, bundle)

	// The registry answered, so the client made no fallback tag.
	tags, err := remote.List(subjectRef.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, tag := range tags {
		if strings.HasPrefix(tag, "sha256-") {
			t.Errorf("fallback tag %s was pushed: the client did not see the referrers API", tag)
		}
	}

	// Filtering by artifact type, and saying so.
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"?artifactType=" + url.QueryEscape(sbomType), sorted(sbom)},
		{"?artifactType=" + url.QueryEscape("application/vnd.example.bundle"), sorted(bundle)},
		{"?artifactType=" + url.QueryEscape("application/none"), nil},
		{"", sorted(sbom, sig, bundle)},
	} {
		resp, idx := getIndex(t, srv, "/v2/robots/icbc/referrers/"+sd.String()+c.query)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != v1.MediaTypeImageIndex ||
			idx.SchemaVersion != 2 || idx.MediaType != v1.MediaTypeImageIndex || idx.Manifests == nil {
			t.Errorf("referrers%s: %s %q %+v", c.query, resp.Status, resp.Header.Get("Content-Type"), idx)
		}
		if got := digests(idx); !slices.Equal(got, c.want) {
			t.Errorf("referrers%s: %v, want %v", c.query, got, c.want)
		}
		if filtered := resp.Header.Get("OCI-Filters-Applied"); (c.query != "") != (filtered == "artifactType") {
			t.Errorf("referrers%s: OCI-Filters-Applied %q", c.query, filtered)
		}
	}

	// Nothing refers to it, or it does not exist: an empty index, never a
	// 404. A malformed digest: 400.
	for path, want := range map[string]int{
		"/v2/robots/icbc/referrers/" + sbom.String():                  http.StatusOK,
		"/v2/robots/nobody/referrers/" + sd.String():                  http.StatusOK,
		"/v2/robots/icbc/referrers/sha256:" + strings.Repeat("0", 64): http.StatusOK,
		"/v2/robots/icbc/referrers/sha256:xyz":                        http.StatusBadRequest,
		"/v2/robots/icbc/referrers/latest":                            http.StatusBadRequest,
	} {
		resp, idx := getIndex(t, srv, path)
		if resp.StatusCode != want || (want == http.StatusOK && (len(idx.Manifests) != 0 || idx.Manifests == nil)) {
			t.Errorf("GET %s: %s %+v, want %d and an empty list", path, resp.Status, idx, want)
		}
	}

	// The index survives a restart.
	srv.Close()
	reg.Close()
	reg = newTestRegistry(t, DefaultConfig(dir))
	srv = httptest.NewServer(reg.Operators(func(*http.Request) (Access, error) { return Access{}, nil }))
	t.Cleanup(srv.Close)
	host = strings.TrimPrefix(srv.URL, "http://")
	subjectRef, _ = name.NewDigest(host+"/robots/icbc@"+sd.String(), name.Insecure)
	check(t, sbom, sig, bundle)

	// Deleting a referrer removes it from the list.
	if err := remote.Delete(subjectRef.Context().Digest(sig.String())); err != nil {
		t.Fatal(err)
	}
	check(t, sbom, bundle)

	// A console stopped between deleting a manifest and its index entry
	// leaves an entry whose manifest is gone: it is not listed.
	gone := v1.Descriptor{MediaType: v1.MediaTypeImageManifest, Digest: digest.FromString("gone"), Size: 2, ArtifactType: sbomType}
	if err := reg.referrer.add("robots/icbc", digest.Digest(sd.String()), gone); err != nil {
		t.Fatal(err)
	}
	check(t, sbom, bundle)
	if left, _ := reg.referrer.list("robots/icbc", digest.Digest(sd.String())); len(left) != 2 {
		t.Errorf("stale entry kept: %v", left)
	}
}

// referrerCases seed TestParseReferrer and FuzzParseReferrer.
var referrerCases = []struct {
	contentType, body string
	subject           string // "" when it is not a referrer
	artifactType      string
}{
	{v1.MediaTypeImageManifest, `{"schemaVersion":2,"config":{"mediaType":"a/b"},"subject":{"digest":"` + testDigest + `"}}`, testDigest, "a/b"},
	{"", `{"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"x/y","config":{"mediaType":"a/b"},"subject":{"digest":"` + testDigest + `"}}`, testDigest, "x/y"},
	{v1.MediaTypeImageIndex + "; charset=utf-8", `{"artifactType":"x/y","subject":{"digest":"` + testDigest + `"}}`, testDigest, "x/y"},
	{v1.MediaTypeImageManifest, `{"schemaVersion":2,"config":{"mediaType":"a/b"}}`, "", ""},
	{v1.MediaTypeImageManifest, `{"subject":{"digest":"sha256:short"}}`, "", ""},
	{"application/vnd.docker.distribution.manifest.v2+json", `{"subject":{"digest":"` + testDigest + `"}}`, "", ""},
	{v1.MediaTypeImageManifest, `{"subject":null}`, "", ""},
	{v1.MediaTypeImageManifest, `not json`, "", ""},
	{v1.MediaTypeImageManifest, ``, "", ""},
}

func TestParseReferrer(t *testing.T) {
	t.Parallel()
	for _, c := range referrerCases {
		d := digest.FromString(c.body)
		subject, desc, ok := parseReferrer(c.contentType, []byte(c.body), d)
		if ok != (c.subject != "") || string(subject) != c.subject || (ok && (desc.ArtifactType != c.artifactType || desc.Digest != d ||
			desc.Size != int64(len(c.body)))) {
			t.Errorf("parseReferrer(%q, %s) = %q %+v %v", c.contentType, c.body, subject, desc, ok)
		}
	}
}

func FuzzParseReferrer(f *testing.F) {
	for _, c := range referrerCases {
		f.Add(c.contentType, []byte(c.body))
	}
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		d := digest.FromBytes(body)
		subject, desc, ok := parseReferrer(contentType, body, d)
		if !ok {
			return
		}
		if subject.Validate() != nil || desc.Digest != d || desc.Size != int64(len(body)) ||
			(desc.MediaType != v1.MediaTypeImageManifest && desc.MediaType != v1.MediaTypeImageIndex) {
			t.Fatalf("parseReferrer(%q, %q) = %q %+v", contentType, body, subject, desc)
		}
		if _, err := json.Marshal(desc); err != nil {
			t.Fatal(err)
		}
	})
}
