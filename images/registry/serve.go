package registry

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// serve is the registry behind both doors: it checks the request's path
// and method, serves the catalog and the referrers API itself, keeps the
// referrers index as manifests come and go, and hands the rest to
// distribution. acc is what the caller may see.
func (r *Registry) serve(w http.ResponseWriter, req *http.Request, acc Access) {
	rt, aerr := parseRoute(req.URL.Path)
	if aerr != nil {
		refuse(w, req, aerr.status, aerr.code, aerr.msg)
		return
	}
	if allowed := methods[rt.kind]; !slices.Contains(allowed, req.Method) {
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		refuse(w, req, http.StatusMethodNotAllowed, "UNSUPPORTED", req.Method+" is not allowed on this path")
		return
	}
	if rt.repo != "" && !acc.sees(rt.repo) {
		refuse(w, req, http.StatusNotFound, "NAME_UNKNOWN", "no repository "+rt.repo)
		return
	}
	if rt.repo != "" && req.Method != http.MethodGet && req.Method != http.MethodHead && !acc.writes(rt.repo) {
		refuse(w, req, http.StatusForbidden, "DENIED", "you may pull from "+rt.repo+" but not push to it or delete from it")
		return
	}
	if rt.kind == routeUploads {
		// distribution reads mount and from with FormValue, which would
		// parse a form body too; only the query counts, and a blob is
		// mounted only from a repository the caller sees (else the
		// upload starts empty, as the spec says when a mount fails).
		q := req.URL.Query()
		if from := q.Get("from"); from != "" && (checkName(from) != nil || !acc.sees(from)) {
			q.Del("from")
			q.Del("mount")
		}
		req.Form = q
	}
	if req.Body != nil && req.Body != http.NoBody {
		body := &progressBody{body: req.Body, rc: http.NewResponseController(w), idle: r.cfg.BodyIdle, unsupported: r.noDeadlines}
		// Over HTTP/1 armed now, not at the first read: a body the
		// handler never reads is still read (and discarded) by the server
		// after it, and must not hold the connection either. A late first
		// read arms again before it reads. (HTTP/2 discards nothing, and
		// its deadline, once passed, ends the body for good.)
		if req.ProtoMajor == 1 {
			body.arm()
		}
		req.Body = body
		// distribution answers a body it could not read with a 500; one
		// cut for idleness gets the 408 it is.
		w = &hookWriter{ResponseWriter: w, before: func(int) *apiError {
			if body.cut.Load() {
				return &apiError{http.StatusRequestTimeout, "UNKNOWN",
					fmt.Sprintf("the request body sent nothing for %s and was cut; send it again", r.cfg.BodyIdle)}
			}
			return nil
		}}
	}
	switch {
	case rt.kind == routeCatalog:
		r.serveCatalog(w, req, acc)
	case rt.kind == routeReferrers:
		r.serveReferrers(w, req, rt)
	case rt.kind == routeManifest && req.Method == http.MethodPut:
		r.putManifest(w, req, rt)
	case rt.kind == routeManifest && req.Method == http.MethodDelete:
		r.deleteManifest(w, req, rt)
	default:
		r.app.ServeHTTP(w, req)
	}
}

// progressBody is a request body whose connection may wait at most idle
// for each next byte: every read moves the connection's read deadline on,
// so a body that keeps coming, however slowly, is read to its end, and a
// body that stops is cut when idle has passed without a byte.
type progressBody struct {
	body io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration
	// unsupported is told when the connection takes no deadlines.
	unsupported func(error)
	// cut is set when the deadline ended the body.
	cut atomic.Bool
	// done is set once the body has ended; from then on the deadline is
	// the server's again. Reads of a body are not concurrent.
	done bool
}

// arm gives the body idle from now for its next byte.
func (b *progressBody) arm() {
	if err := b.rc.SetReadDeadline(time.Now().Add(b.idle)); err != nil {
		b.unsupported(err)
	}
}

func (b *progressBody) Read(p []byte) (int, error) {
	if !b.done {
		b.arm()
	}
	n, err := b.body.Read(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		b.cut.Store(true)
	}
	if errors.Is(err, io.EOF) && !b.done {
		// Done: the connection may wait for its next request as long as
		// the server says. After any other error the deadline stays, so
		// the server's own reading of what is left ends at once too.
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

func (b *progressBody) Close() error { return b.body.Close() }

// noDeadlines warns, once, that request bodies are read without an idle
// deadline: the server in front passes on no way to set one.
func (r *Registry) noDeadlines(err error) {
	r.deadlineWarn.Do(func() {
		r.log.Warn("registry request bodies have no idle deadline on this server; a stalled upload holds its connection", "err", err)
	})
}
