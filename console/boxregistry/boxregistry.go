// Package boxregistry serves the console's OCI registry to boxes over
// their tunnel's "registry" streams, under the pull policy: a box may pull
// only the manifests its desired workloads and image pre-pulls name, and
// what they are made of.
package boxregistry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgebox/edgebox/console/agentrel"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/images/registry"
	"github.com/edgebox/edgebox/tunnel"
)

type boxKey struct{}

// Server serves the registry to boxes.
type Server struct {
	hs     *http.Server
	l      net.Listener
	pulled *prometheus.CounterVec
}

// Metrics are the bytes served to boxes, for the console's registry of
// metrics.
func (s *Server) Metrics() prometheus.Collector { return s.pulled }

// New returns the server of reg on l, the tunnel's "registry" streams,
// letting each box pull what st's workloads for it name in the registry
// under one of hosts (the names images give the console's registry). It
// starts nothing.
func New(reg *registry.Registry, st *desired.State, hosts []string, agents AgentBinaries, l net.Listener, log *slog.Logger) *Server {
	boxOf := func(r *http.Request) string { id, _ := r.Context().Value(boxKey{}).(string); return id }
	mux := http.NewServeMux()
	mux.Handle("/", reg.Boxes(boxOf, pullable(st, hosts)))
	if agents != nil {
		mux.HandleFunc("GET /edgebox/agent/{version}/{platform}", func(w http.ResponseWriter, r *http.Request) {
			serveAgent(w, r, boxOf(r), agents)
		})
	}
	pulled := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "edgebox", Subsystem: "registry", Name: "served_bytes_total",
		Help: "Bytes the registry served to boxes through their tunnels, by what: manifest, blob or agent (binary)."}, []string{"what"})
	for _, w := range []string{"manifest", "blob", "agent"} {
		pulled.WithLabelValues(w) // each shown from the start, at 0
	}
	return &Server{l: l, pulled: pulled, hs: &http.Server{
		Handler:           accessLog(mux, boxOf, pulled, log),
		ReadHeaderTimeout: 30 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*tunnel.Conn); ok {
				return context.WithValue(ctx, boxKey{}, tc.Peer())
			}
			return ctx
		},
	}}
}

// accessLog logs every request a box makes, with what was answered: who
// pulled what, when, is the registry's access log.
func accessLog(h http.Handler, boxOf func(*http.Request) string, pulled *prometheus.CounterVec, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "box registry")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		cw := &countingWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(cw, r)
		what := "blob"
		switch {
		case strings.HasPrefix(r.URL.Path, "/edgebox/agent/"):
			what = "agent"
		case strings.Contains(r.URL.Path, "/manifests/"):
			what = "manifest"
		}
		pulled.WithLabelValues(what).Add(float64(cw.n))
		log.Info("box pull", "box_id", boxOf(r), "method", r.Method, "path", r.URL.Path, "status", cw.status,
			"bytes", cw.n, "took", time.Since(start).Round(time.Millisecond))
	})
}

type countingWriter struct {
	http.ResponseWriter
	status int
	n      int64
}

func (c *countingWriter) WriteHeader(code int) { c.status = code; c.ResponseWriter.WriteHeader(code) }
func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	return n, err
}

// AgentBinaries opens the agent binaries a box may fetch: those of the
// version its desired AgentRelease names (agentrel.Service).
type AgentBinaries interface {
	Open(ctx context.Context, box, version, platform string) (*os.File, agentrel.Binary, error)
}

// serveAgent answers a box's fetch of an agent binary, with ranges, so a
// cut download resumes.
func serveAgent(w http.ResponseWriter, r *http.Request, box string, agents AgentBinaries) {
	if box == "" {
		http.Error(w, "no box identity on this stream", http.StatusUnauthorized)
		return
	}
	goos, goarch, ok := strings.Cut(r.PathValue("platform"), "-")
	if !ok {
		http.Error(w, "name the platform as os-arch", http.StatusNotFound)
		return
	}
	f, bin, err := agents.Open(r.Context(), box, r.PathValue("version"), goos+"/"+goarch)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Etag", `"sha256:`+bin.SHA256+`"`)
	http.ServeContent(w, r, "", bin.At, f)
}

// Run serves until ctx ends, then closes the listener and every
// connection and returns nil; it returns the error of a listener that
// fails before.
func (s *Server) Run(ctx context.Context) error {
	served := make(chan error, 1)
	go func() { served <- s.hs.Serve(s.l) }()
	select {
	case err := <-served:
		s.hs.Close()
		return fmt.Errorf("box registry: %w", err)
	case <-ctx.Done():
		s.hs.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("box registry: %w", err)
		}
		return nil
	}
}

// pullable lists, per repository, the manifests a box's desired workloads
// and image pre-pulls name in the console's registry.
func pullable(st *desired.State, hosts []string) registry.Pullable {
	ours := map[string]bool{}
	for _, h := range hosts {
		ours[h] = true
	}
	return func(ctx context.Context, box string) (map[string][]digest.Digest, error) {
		objs, _, err := st.Live(ctx, box)
		if err != nil {
			return nil, err
		}
		out := map[string][]digest.Digest{}
		for _, o := range objs {
			var image string
			switch {
			case o.GetWorkload() != nil:
				image = o.GetWorkload().GetImage()
			case o.GetImagePrefetch() != nil:
				image = o.GetImagePrefetch().GetImage() // a rollout's pre-pull
			default:
				continue
			}
			ref, err := registry.ParseRef(image)
			if err != nil || !ours[ref.Host] || ref.Digest == "" {
				continue
			}
			out[ref.Repo] = append(out[ref.Repo], ref.Digest)
		}
		return out, nil
	}
}
