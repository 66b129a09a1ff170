//go:build linux

package containerd

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/edgebox/edgebox/agent/runtime"
)

// HasImage says whether ref is in edgebox's namespace with all the
// content this box's platform needs.
func (d *Driver) HasImage(ctx context.Context, ref string) (bool, error) {
	ctx = ns(ctx)
	img, err := d.c.GetImage(ctx, ref)
	if cerrdefs.IsNotFound(err) {
		return false, nil
	} else if err != nil {
		return false, translate(err, "image %s", ref)
	}
	ok, _, _, missing, err := images.Check(ctx, d.c.ContentStore(), img.Target(), platforms.Default())
	if err != nil {
		return false, translate(err, "image %s", ref)
	}
	return ok && len(missing) == 0, nil
}

// progressEvery is how often a pull reports its progress.
const progressEvery = 500 * time.Millisecond

// Pull fetches ref through hc and unpacks it. containerd verifies every
// blob against its digest and keeps a partly fetched blob as an ingest
// named for its digest, so the next pull asks the registry for the rest
// only.
func (d *Driver) Pull(ctx context.Context, ref string, hc *http.Client, progress func(runtime.Progress)) error {
	ctx = ns(ctx)
	resolver := docker.NewResolver(docker.ResolverOptions{
		Hosts: docker.ConfigureDefaultRegistries(docker.WithClient(hc), docker.WithPlainHTTP(docker.MatchLocalhost)),
	})
	var done, total atomic.Int64
	count := func(h images.Handler) images.Handler {
		return images.HandlerFunc(func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
			children, err := h.Handle(ctx, desc)
			if err != nil {
				return children, err
			}
			if isManifest(desc.MediaType) {
				for _, c := range children {
					if !isManifest(c.MediaType) {
						total.Add(c.Size)
					}
				}
			} else {
				done.Add(desc.Size)
			}
			return children, nil
		})
	}
	report := func() {
		if progress == nil {
			return
		}
		var inflight int64
		if sts, err := d.c.ContentStore().ListStatuses(ctx); err == nil {
			for _, st := range sts {
				inflight += st.Offset
			}
		}
		progress(runtime.Progress{Done: min(done.Load()+inflight, max(total.Load(), done.Load())), Total: total.Load()})
	}
	stop := make(chan struct{})
	ticker := make(chan struct{})
	go func() {
		defer close(ticker)
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				report()
			}
		}
	}()
	_, err := d.c.Pull(ctx, ref,
		client.WithResolver(resolver),
		client.WithPullUnpack,
		client.WithPullSnapshotter(d.cfg.Snapshotter),
		client.WithImageHandlerWrapper(count),
	)
	close(stop)
	<-ticker
	if err != nil {
		return translate(err, "pulling %s", ref)
	}
	report()
	return nil
}

func isManifest(mt string) bool { return images.IsManifestType(mt) || images.IsIndexType(mt) }

// Images lists the images in edgebox's namespace.
func (d *Driver) Images(ctx context.Context) ([]string, error) {
	imgs, err := d.c.ListImages(ns(ctx))
	if err != nil {
		return nil, translate(err, "listing images")
	}
	out := make([]string, 0, len(imgs))
	for _, img := range imgs {
		out = append(out, img.Name())
	}
	return out, nil
}

// RemoveImage deletes an image; containerd collects the content no other
// image or container holds.
func (d *Driver) RemoveImage(ctx context.Context, ref string) error {
	err := d.c.ImageService().Delete(ns(ctx), ref, images.SynchronousDelete())
	if cerrdefs.IsNotFound(err) {
		return nil
	}
	return translate(err, "removing image %s", ref)
}
