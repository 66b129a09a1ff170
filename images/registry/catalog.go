package registry

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"

	storagedriver "github.com/distribution/distribution/v3/registry/storage/driver"
)

const (
	// defaultCatalogPage is how many repositories a catalog request
	// without n gets.
	defaultCatalogPage = 100
	// maxCatalogPage bounds n: a larger n gets this many and a Link to
	// the rest, as the spec lets a registry do.
	maxCatalogPage = 1000
)

// serveCatalog answers GET /v2/_catalog with the repositories acc sees,
// in lexical order, n at a time after last, with a Link header to the next
// page when there is one.
func (r *Registry) serveCatalog(w http.ResponseWriter, req *http.Request, acc Access) {
	q := req.URL.Query()
	n := defaultCatalogPage
	if s := q.Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 0 {
			writeError(w, http.StatusBadRequest, "PAGINATION_NUMBER_INVALID", "n must be a number from 0 up, not "+clip(s))
			return
		}
		n = min(v, maxCatalogPage)
	}
	last := q.Get("last")
	if len(last) > maxNameLen {
		writeError(w, http.StatusBadRequest, "NAME_INVALID", "last is longer than a repository name can be")
		return
	}
	names, more, err := r.catalog(req, acc, n, last)
	if err != nil {
		r.log.Warn("registry catalog failed", "err", err)
		writeError(w, http.StatusInternalServerError, "UNKNOWN", "the console could not list its repositories; try again")
		return
	}
	if more {
		next := url.URL{Path: "/v2/_catalog", RawQuery: url.Values{"n": {strconv.Itoa(n)}, "last": {names[len(names)-1]}}.Encode()}
		w.Header().Set("Link", "<"+next.String()+`>; rel="next"`)
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(struct {
		Repositories []string `json:"repositories"`
	}{names})
}

// catalog returns up to n repositories after last that acc sees, and
// whether more follow.
func (r *Registry) catalog(req *http.Request, acc Access, n int, last string) (names []string, more bool, err error) {
	names = []string{}
	if n == 0 {
		return names, false, nil
	}
	buf := make([]string, n)
	for {
		got, err := r.ns.Repositories(req.Context(), buf, last)
		for _, name := range buf[:got] {
			if !acc.sees(name) {
				continue
			}
			if len(names) == n {
				return names, true, nil
			}
			names = append(names, name)
		}
		var notFound storagedriver.PathNotFoundError
		switch {
		case errors.Is(err, io.EOF) || errors.As(err, &notFound) || got == 0:
			return names, false, nil
		case err != nil:
			return nil, false, err
		}
		last = buf[got-1]
	}
}
