package console

import (
	"context"
	"net"
	"net/http"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/images/registry"
	"github.com/edgebox/edgebox/tunnel"
)

type boxKey struct{}

// boxRegistryServer serves the registry to boxes over their tunnel's
// "registry" streams: each request knows its box from the stream.
func boxRegistryServer(reg *registry.Registry, st *desired.State, hosts []string) *http.Server {
	boxOf := func(r *http.Request) string { id, _ := r.Context().Value(boxKey{}).(string); return id }
	return &http.Server{
		Handler:           reg.Boxes(boxOf, pullable(st, hosts)),
		ReadHeaderTimeout: 30 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*tunnel.Conn); ok {
				return context.WithValue(ctx, boxKey{}, tc.Peer())
			}
			return ctx
		},
	}
}

// pullable lists, per repository, the manifests a box's desired workloads
// name in the console's registry.
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
			w := o.GetWorkload()
			if w == nil {
				continue
			}
			ref, err := registry.ParseRef(w.GetImage())
			if err != nil || !ours[ref.Host] || ref.Digest == "" {
				continue
			}
			out[ref.Repo] = append(out[ref.Repo], ref.Digest)
		}
		return out, nil
	}
}
