package registry

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/opencontainers/go-digest"
)

// routeKind is one endpoint of the OCI distribution API.
type routeKind int

const (
	routeBase      routeKind = iota + 1 // /v2/
	routeCatalog                        // /v2/_catalog
	routeTags                           // /v2/<name>/tags/list
	routeManifest                       // /v2/<name>/manifests/<reference>
	routeBlob                           // /v2/<name>/blobs/<digest>
	routeUploads                        // /v2/<name>/blobs/uploads/
	routeUpload                         // /v2/<name>/blobs/uploads/<session>
	routeReferrers                      // /v2/<name>/referrers/<digest>
)

// route is a request path split into the API's parts, each checked.
type route struct {
	kind routeKind
	repo string // "" for the base and the catalog
	// ref is what follows the repository: a tag or digest for manifests,
	// a digest for blobs and referrers, an upload session's id.
	ref string
}

// methods lists what each endpoint answers.
var methods = map[routeKind][]string{
	routeBase:      {http.MethodGet, http.MethodHead},
	routeCatalog:   {http.MethodGet},
	routeTags:      {http.MethodGet},
	routeManifest:  {http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete},
	routeBlob:      {http.MethodGet, http.MethodHead, http.MethodDelete},
	routeUploads:   {http.MethodPost},
	routeUpload:    {http.MethodGet, http.MethodPatch, http.MethodPut, http.MethodDelete},
	routeReferrers: {http.MethodGet},
}

// Names as the OCI distribution spec draws them: lower-case components
// joined by slashes, at most maxNameLen characters in all.
var (
	nameRE    = regexp.MustCompile(`^[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*)*$`)
	tagRE     = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$`)
	sessionRE = regexp.MustCompile(`^[a-zA-Z0-9_.=-]{1,256}$`)
)

const maxNameLen = 255

// apiError is an answer in the distribution API's error format.
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.code + ": " + e.msg }

func nameInvalid(msg string) *apiError {
	return &apiError{http.StatusBadRequest, "NAME_INVALID", msg}
}

// parseRoute splits a request path of the distribution API into its
// endpoint, repository and reference, checking each part: a path that
// names no endpoint, or names one with a malformed part, is refused here
// with the error a client expects, before it reaches storage.
func parseRoute(path string) (route, *apiError) {
	rest, ok := strings.CutPrefix(path, "/v2/")
	if !ok {
		if path == "/v2" {
			return route{kind: routeBase}, nil
		}
		return route{}, &apiError{http.StatusNotFound, "UNSUPPORTED", "not a registry API path"}
	}
	switch rest {
	case "":
		return route{kind: routeBase}, nil
	case "_catalog":
		return route{kind: routeCatalog}, nil
	}
	segs := strings.Split(rest, "/")
	n := len(segs)
	var rt route
	var nameEnd int // segs[:nameEnd] is the repository
	switch {
	case n >= 3 && segs[n-2] == "tags" && segs[n-1] == "list":
		rt, nameEnd = route{kind: routeTags}, n-2
	case n >= 4 && segs[n-3] == "blobs" && segs[n-2] == "uploads":
		rt, nameEnd = route{kind: routeUpload, ref: segs[n-1]}, n-3
		if rt.ref == "" {
			rt.kind = routeUploads
		}
	case n >= 3 && segs[n-2] == "blobs" && segs[n-1] == "uploads":
		rt, nameEnd = route{kind: routeUploads}, n-2
	case n >= 3 && segs[n-2] == "manifests":
		rt, nameEnd = route{kind: routeManifest, ref: segs[n-1]}, n-2
	case n >= 3 && segs[n-2] == "blobs":
		rt, nameEnd = route{kind: routeBlob, ref: segs[n-1]}, n-2
	case n >= 3 && segs[n-2] == "referrers":
		rt, nameEnd = route{kind: routeReferrers, ref: segs[n-1]}, n-2
	default:
		return route{}, &apiError{http.StatusNotFound, "UNSUPPORTED", "not a registry API path"}
	}
	rt.repo = strings.Join(segs[:nameEnd], "/")
	if err := checkName(rt.repo); err != nil {
		return route{}, err
	}
	switch rt.kind {
	case routeManifest:
		if !tagRE.MatchString(rt.ref) {
			if _, err := digest.Parse(rt.ref); err != nil {
				return route{}, &apiError{http.StatusBadRequest, "MANIFEST_INVALID",
					"a manifest is named by a tag (up to 128 letters, digits, '_', '.', '-') or a digest"}
			}
		}
	case routeBlob, routeReferrers:
		if _, err := digest.Parse(rt.ref); err != nil {
			return route{}, &apiError{http.StatusBadRequest, "DIGEST_INVALID", "not a valid digest: " + clip(rt.ref)}
		}
	case routeUpload:
		if !sessionRE.MatchString(rt.ref) {
			return route{}, &apiError{http.StatusNotFound, "BLOB_UPLOAD_UNKNOWN", "no such upload session"}
		}
	}
	return rt, nil
}

// checkName refuses a repository name the spec does not allow.
func checkName(name string) *apiError {
	switch {
	case name == "":
		return nameInvalid("the repository name is empty")
	case len(name) > maxNameLen:
		return nameInvalid("the repository name is longer than 255 characters")
	case !nameRE.MatchString(name):
		return nameInvalid("invalid repository name " + clip(name) +
			": lower-case letters and digits, separated by '.', '_', '__' or '-', in components joined by '/'")
	}
	return nil
}

// clip quotes s for an error message, cut to a length a terminal shows.
func clip(s string) string {
	const max = 80
	if len(s) > max {
		return strconv.Quote(s[:max]) + "…"
	}
	return strconv.Quote(s)
}
