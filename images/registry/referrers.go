package registry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

var specsVersion2 = specs.Versioned{SchemaVersion: 2}

// maxManifestSize is the largest manifest accepted, distribution's own
// limit.
const maxManifestSize = 4 << 20

// referrerIndex records, per repository, which manifests name another as
// their subject, for the referrers API of the distribution spec v1.1.
// distribution v3 keeps no such index. It lives in files beside the
// registry's storage and survives restarts:
//
//	<root>/<repository>/_subjects/<algorithm>/<hex>/<algorithm>-<hex>.json
//
// one file per referrer, holding its descriptor (media type, digest,
// size, artifact type, annotations). Repository components never start
// with "_", so _subjects never meets a repository's own path.
//
// A referrer is added before its push is confirmed and removed after its
// delete is: a crash in between leaves an entry whose manifest is gone,
// which reads skip (and remove), never a confirmed referrer missing.
type referrerIndex struct {
	root string
	mu   sync.Mutex // orders writes and removals of entries
}

func (x *referrerIndex) dir(repo string, subject digest.Digest) string {
	return filepath.Join(x.root, filepath.FromSlash(repo), "_subjects", subject.Algorithm().String(), subject.Encoded())
}

func entryName(d digest.Digest) string { return d.Algorithm().String() + "-" + d.Encoded() + ".json" }

// add records desc as a referrer of subject in repo.
func (x *referrerIndex) add(repo string, subject digest.Digest, desc v1.Descriptor) error {
	b, err := json.Marshal(desc)
	if err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	dir := x.dir(repo, subject)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("referrers index: %w", err)
	}
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("referrers index: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("referrers index: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("referrers index: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("referrers index: %w", err)
	}
	if err := os.Rename(f.Name(), filepath.Join(dir, entryName(desc.Digest))); err != nil {
		return fmt.Errorf("referrers index: %w", err)
	}
	return nil
}

// remove forgets the referrer d of subject in repo.
func (x *referrerIndex) remove(repo string, subject, d digest.Digest) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	err := os.Remove(filepath.Join(x.dir(repo, subject), entryName(d)))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("referrers index: %w", err)
	}
	return nil
}

// list returns the referrers recorded for subject in repo, by digest.
func (x *referrerIndex) list(repo string, subject digest.Digest) ([]v1.Descriptor, error) {
	dir := x.dir(repo, subject)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("referrers index: %w", err)
	}
	var out []v1.Descriptor
	for _, e := range ents {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("referrers index: %w", err)
		}
		var d v1.Descriptor
		if err := json.Unmarshal(b, &d); err != nil || d.Digest.Validate() != nil {
			continue // written by no version of this code; the manifest's own push rewrites it
		}
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b v1.Descriptor) int { return strings.Compare(string(a.Digest), string(b.Digest)) })
	return out, nil
}

// manifestFields are the parts of an OCI manifest or index the referrers
// API reads.
type manifestFields struct {
	MediaType    string `json:"mediaType"`
	ArtifactType string `json:"artifactType"`
	Config       *struct {
		MediaType string `json:"mediaType"`
	} `json:"config"`
	Subject     *v1.Descriptor    `json:"subject"`
	Annotations map[string]string `json:"annotations"`
}

// parseReferrer reads a manifest as pushed (its Content-Type and body):
// when it is an OCI manifest or index with a valid subject, it returns
// that subject and the descriptor the referrers API lists for it, with
// digest d. ok is false for anything else, which is then stored and
// checked by distribution alone.
func parseReferrer(contentType string, body []byte, d digest.Digest) (subject digest.Digest, desc v1.Descriptor, ok bool) {
	var m manifestFields
	if len(body) > maxManifestSize || json.Unmarshal(body, &m) != nil || m.Subject == nil || m.Subject.Digest.Validate() != nil {
		return "", v1.Descriptor{}, false
	}
	mt := m.MediaType
	if mt == "" {
		mt, _, _ = strings.Cut(contentType, ";")
		mt = strings.TrimSpace(mt)
	}
	desc = v1.Descriptor{MediaType: mt, Digest: d, Size: int64(len(body)), ArtifactType: m.ArtifactType, Annotations: m.Annotations}
	switch mt {
	case v1.MediaTypeImageManifest:
		if desc.ArtifactType == "" && m.Config != nil {
			desc.ArtifactType = m.Config.MediaType
		}
	case v1.MediaTypeImageIndex:
	default:
		return "", v1.Descriptor{}, false
	}
	return m.Subject.Digest, desc, true
}

// putManifest stores a pushed manifest through distribution; one that
// names a subject is added to the referrers index before the push is
// confirmed, and the answer carries the OCI-Subject header that tells the
// client no fallback tag is needed.
func (r *Registry) putManifest(w http.ResponseWriter, req *http.Request, rt route) {
	body, err := io.ReadAll(io.LimitReader(req.Body, maxManifestSize+1))
	if err != nil {
		refuse(w, req, http.StatusBadRequest, "MANIFEST_INVALID", "the manifest did not arrive: "+err.Error())
		return
	}
	if len(body) > maxManifestSize {
		refuse(w, req, http.StatusRequestEntityTooLarge, "SIZE_INVALID", "a manifest may be at most 4 MiB")
		return
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	// The digest distribution will store it under: the one the path names,
	// or the body's sha256.
	d := digest.FromBytes(body)
	if pd, err := digest.Parse(rt.ref); err == nil {
		d = pd
	}
	subject, desc, ok := parseReferrer(req.Header.Get("Content-Type"), body, d)
	if !ok {
		r.app.ServeHTTP(w, req)
		return
	}
	hw := &hookWriter{ResponseWriter: w, before: func(status int) *apiError {
		if status != http.StatusCreated {
			return nil
		}
		if got, err := digest.Parse(w.Header().Get("Docker-Content-Digest")); err == nil {
			desc.Digest = got
		}
		if err := r.referrer.add(rt.repo, subject, desc); err != nil {
			r.log.Warn("registry referrers index not updated", "repo", rt.repo, "digest", desc.Digest, "err", err)
			return &apiError{http.StatusInternalServerError, "UNKNOWN", "the console could not record this manifest's subject; push it again"}
		}
		w.Header().Set("OCI-Subject", subject.String())
		return nil
	}}
	r.app.ServeHTTP(hw, req)
}

// deleteManifest deletes a manifest through distribution and, once it is
// gone, its entry in the referrers index.
func (r *Registry) deleteManifest(w http.ResponseWriter, req *http.Request, rt route) {
	d, err := digest.Parse(rt.ref)
	if err != nil { // a tag: only the tag goes, the manifest stays
		r.app.ServeHTTP(w, req)
		return
	}
	subject, ok := r.subjectOf(req, rt.repo, d)
	if !ok {
		r.app.ServeHTTP(w, req)
		return
	}
	hw := &hookWriter{ResponseWriter: w, before: func(int) *apiError { return nil }}
	r.app.ServeHTTP(hw, req)
	if hw.status != http.StatusAccepted {
		return
	}
	if err := r.referrer.remove(rt.repo, subject, d); err != nil {
		r.log.Warn("registry referrers index not updated", "repo", rt.repo, "digest", d, "err", err)
	}
}

// subjectOf returns the subject of the manifest d in repo, if it has one.
func (r *Registry) subjectOf(req *http.Request, repo string, d digest.Digest) (digest.Digest, bool) {
	rp, err := r.repository(req.Context(), repo)
	if err != nil {
		return "", false
	}
	ms, err := rp.Manifests(req.Context())
	if err != nil {
		return "", false
	}
	m, err := ms.Get(req.Context(), d)
	if err != nil {
		return "", false
	}
	mt, payload, err := m.Payload()
	if err != nil {
		return "", false
	}
	subject, _, ok := parseReferrer(mt, payload, d)
	return subject, ok
}

// serveReferrers answers GET /v2/<name>/referrers/<digest>: an OCI image
// index of the manifests in the repository whose subject is that digest,
// only those of one artifact type when ?artifactType= asks. A subject
// nobody refers to, or that does not exist, gets an empty index, as the
// spec requires.
func (r *Registry) serveReferrers(w http.ResponseWriter, req *http.Request, rt route) {
	subject := digest.Digest(rt.ref)
	all, err := r.referrer.list(rt.repo, subject)
	if err != nil {
		r.log.Warn("registry referrers index unreadable", "repo", rt.repo, "subject", subject, "err", err)
		writeError(w, http.StatusInternalServerError, "UNKNOWN", "the console could not read its referrers index; try again")
		return
	}
	wantType, filtered := req.URL.Query()["artifactType"]
	manifests := []v1.Descriptor{}
	for _, d := range all {
		if filtered && !slices.Contains(wantType, d.ArtifactType) {
			continue
		}
		ok, err := r.HasManifest(req.Context(), rt.repo, d.Digest)
		if err != nil {
			r.log.Warn("registry referrer check failed", "repo", rt.repo, "digest", d.Digest, "err", err)
			writeError(w, http.StatusInternalServerError, "UNKNOWN", "the console could not read its registry; try again")
			return
		}
		if !ok { // deleted, and the console stopped before the index followed
			_ = r.referrer.remove(rt.repo, subject, d.Digest)
			continue
		}
		manifests = append(manifests, d)
	}
	if filtered {
		w.Header().Set("OCI-Filters-Applied", "artifactType")
	}
	w.Header().Set("Content-Type", v1.MediaTypeImageIndex)
	json.NewEncoder(w).Encode(v1.Index{Versioned: specsVersion2, MediaType: v1.MediaTypeImageIndex, Manifests: manifests})
}

// hookWriter runs before just before the status is written; when before
// answers an error, the client gets that error instead of what the handler
// answered.
type hookWriter struct {
	http.ResponseWriter
	before  func(status int) *apiError
	status  int  // as the handler wrote it
	swallow bool // the handler's answer is replaced
}

func (h *hookWriter) WriteHeader(status int) {
	if h.status != 0 {
		return
	}
	h.status = status
	if e := h.before(status); e != nil {
		h.swallow = true
		for _, k := range []string{"Location", "Docker-Content-Digest", "Content-Length", "Range", "Docker-Upload-UUID"} {
			h.ResponseWriter.Header().Del(k)
		}
		writeError(h.ResponseWriter, e.status, e.code, e.msg)
		return
	}
	h.ResponseWriter.WriteHeader(status)
}

func (h *hookWriter) Write(p []byte) (int, error) {
	if h.status == 0 {
		h.WriteHeader(http.StatusOK)
	}
	if h.swallow {
		return len(p), nil
	}
	return h.ResponseWriter.Write(p)
}

func (h *hookWriter) Unwrap() http.ResponseWriter { return h.ResponseWriter }
