package registry

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

// writeError answers in the distribution API's error format, which
// docker, crane and containerd show to their users.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"errors": []map[string]string{{"code": code, "message": msg}}})
}

// refuse answers a request with err without reading its body. Over
// HTTP/1 a body that was sent along must then not be read either, so the
// connection closes after the answer.
func refuse(w http.ResponseWriter, req *http.Request, status int, code, msg string) {
	if req.ProtoMajor == 1 && (req.ContentLength != 0 || len(req.TransferEncoding) > 0) {
		w.Header().Set("Connection", "close")
	}
	writeError(w, status, code, msg)
}

// Credentials returns the API token a registry client sent: as a bearer
// token, or as the password of basic auth (docker login, crane auth login).
func Credentials(req *http.Request) (string, bool) {
	h := req.Header.Get("Authorization")
	if tok, ok := strings.CutPrefix(h, "Bearer "); ok && tok != "" {
		return tok, true
	}
	if _, pass, ok := req.BasicAuth(); ok && pass != "" {
		return pass, true
	}
	return "", false
}

// Access is what one caller may see in the registry.
type Access struct {
	// Sees says whether the caller may see and use repository repo: the
	// catalog lists only those, and other repositories answer as if they
	// did not exist. Nil sees every repository.
	Sees func(repo string) bool
	// Writes says whether the caller may push to and delete from a
	// repository it sees; a refused write answers 403 DENIED. Nil may
	// write to every repository it sees.
	Writes func(repo string) bool
}

func (a Access) sees(repo string) bool   { return a.Sees == nil || a.Sees(repo) }
func (a Access) writes(repo string) bool { return a.Writes == nil || a.Writes(repo) }

// Operators returns the registry behind a check of the caller's API token,
// made from the request's headers before any of its body is read:
// authorize returns what a caller who may push and pull sees, or an error
// for a caller it refuses. A refused caller gets a basic-auth challenge,
// which makes docker and crane ask for their stored login.
func (r *Registry) Operators(authorize func(req *http.Request) (Access, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		acc, err := authorize(req)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Basic realm="edgebox"`)
			refuse(w, req, http.StatusUnauthorized, "UNAUTHORIZED", err.Error())
			return
		}
		r.serve(w, req, acc)
	})
}

// Pullable returns what a box may pull: for each repository, the manifest
// digests its desired state references.
type Pullable func(ctx context.Context, box string) (map[string][]digest.Digest, error)

// Boxes returns the registry as boxes see it through the tunnel: reads
// only, and only of the manifests their desired state references and what
// those manifests refer to. box names the box a request came from.
func (r *Registry) Boxes(box func(*http.Request) string, pullable Pullable) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		id := box(req)
		if id == "" {
			refuse(w, req, http.StatusUnauthorized, "UNAUTHORIZED", "no box identity on this stream")
			return
		}
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			refuse(w, req, http.StatusForbidden, "DENIED", "boxes may only pull")
			return
		}
		if req.URL.Path == "/v2/" || req.URL.Path == "/v2" {
			r.serve(w, req, Access{})
			return
		}
		repo, target, err := parseTarget(req.URL.Path)
		if err != nil {
			writeError(w, http.StatusForbidden, "DENIED", err.Error())
			return
		}
		ok, err := r.mayPull(req.Context(), id, repo, target, pullable)
		if err != nil {
			r.log.Warn("registry access check failed", "box_id", id, "repo", repo, "err", err)
			writeError(w, http.StatusServiceUnavailable, "UNAVAILABLE", "the console could not check this pull; try again")
			return
		}
		if !ok {
			writeError(w, http.StatusForbidden, "DENIED", "this box's desired state does not reference "+repo+"@"+target.String())
			return
		}
		r.serve(w, req, Access{})
	})
}

// parseTarget splits /v2/<repo>/manifests/<digest> and
// /v2/<repo>/blobs/<digest>. Boxes pull by digest only: a tag could name
// something the desired state never referenced.
func parseTarget(path string) (repo string, target digest.Digest, err error) {
	rest, ok := strings.CutPrefix(path, "/v2/")
	if !ok {
		return "", "", errDenied("not a registry path")
	}
	var ref string
	if i := strings.LastIndex(rest, "/manifests/"); i > 0 {
		repo, ref = rest[:i], rest[i+len("/manifests/"):]
	} else if i := strings.LastIndex(rest, "/blobs/"); i > 0 {
		repo, ref = rest[:i], rest[i+len("/blobs/"):]
	} else {
		return "", "", errDenied("boxes may fetch manifests and blobs only")
	}
	d, err := digest.Parse(ref)
	if err != nil {
		return "", "", errDenied("boxes pull by digest, not by tag: " + ref)
	}
	return repo, d, nil
}

type errDenied string

func (e errDenied) Error() string { return string(e) }

// mayPull walks from the manifests box may pull in repo down through
// indexes to configs and layers, looking for target.
func (r *Registry) mayPull(ctx context.Context, box, repo string, target digest.Digest, pullable Pullable) (bool, error) {
	all, err := pullable(ctx, box)
	if err != nil {
		return false, err
	}
	roots := all[repo]
	seen := map[digest.Digest]bool{}
	queue := append([]digest.Digest(nil), roots...)
	for len(queue) > 0 {
		d := queue[0]
		queue = queue[1:]
		if seen[d] {
			continue
		}
		seen[d] = true
		if d == target {
			return true, nil
		}
		refs, err := r.references(ctx, repo, d)
		if err != nil {
			// Gone since it was referenced: it can be pulled no more.
			continue
		}
		for _, ref := range refs {
			if ref.Digest == target {
				return true, nil
			}
			if isManifest(ref.MediaType) {
				queue = append(queue, ref.Digest)
			}
		}
	}
	return false, nil
}

// isManifest says whether a descriptor's media type is a manifest or an
// index, whose own references a box may follow.
func isManifest(mediaType string) bool {
	switch mediaType {
	case v1.MediaTypeImageManifest, v1.MediaTypeImageIndex,
		"application/vnd.docker.distribution.manifest.v2+json",
		"application/vnd.docker.distribution.manifest.list.v2+json":
		return true
	}
	return false
}
