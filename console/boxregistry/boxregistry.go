// Package boxregistry serves the console's OCI registry to boxes over
// their tunnel's "registry" streams, under the pull policy: a box may pull
// only the manifests its desired workloads and image pre-pulls name, and
// what they are made of.
package boxregistry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/images/registry"
	"github.com/edgebox/edgebox/tunnel"
)

type boxKey struct{}

// Server serves the registry to boxes.
type Server struct {
	hs *http.Server
	l  net.Listener
}

// New returns the server of reg on l, the tunnel's "registry" streams,
// letting each box pull what st's workloads for it name in the registry
// under one of hosts (the names images give the console's registry). It
// starts nothing.
func New(reg *registry.Registry, st *desired.State, hosts []string, l net.Listener) *Server {
	boxOf := func(r *http.Request) string { id, _ := r.Context().Value(boxKey{}).(string); return id }
	return &Server{l: l, hs: &http.Server{
		Handler:           reg.Boxes(boxOf, pullable(st, hosts)),
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
