package registry

import (
	"context"
	"errors"
	"path"
	"strings"
	"time"

	storagedriver "github.com/distribution/distribution/v3/registry/storage/driver"
)

// repositoriesRoot is where distribution keeps repositories, upload
// sessions among them (<repository>/_uploads/<session>/).
const repositoriesRoot = "/docker/registry/v2/repositories"

// purgeLoop removes abandoned upload sessions every PurgeEvery until
// Close. It owns no other state.
func (r *Registry) purgeLoop() {
	defer close(r.purged)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopped := make(chan struct{})
	go func() { // ends the walk in progress at Close
		defer close(stopped)
		select {
		case <-r.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	defer func() { cancel(); <-stopped }()
	tick := time.NewTicker(r.cfg.PurgeEvery)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
		n, err := r.purgeUploads(ctx, time.Now().Add(-r.cfg.UploadIdle))
		if err != nil {
			r.log.Warn("registry upload purge incomplete", "purged", n, "err", err)
		} else if n > 0 {
			r.log.Info("registry purged abandoned uploads", "purged", n, "idle_over", r.cfg.UploadIdle)
		}
	}
}

// purgeUploads removes the upload sessions with no write since before and
// returns how many it removed. A session's last write is the newest
// modification time of its files.
func (r *Registry) purgeUploads(ctx context.Context, before time.Time) (int, error) {
	last := map[string]time.Time{} // session directory → its newest write
	err := r.driver.Walk(ctx, repositoriesRoot, func(fi storagedriver.FileInfo) error {
		p := fi.Path()
		_, base := path.Split(p)
		if fi.IsDir() && strings.HasPrefix(base, "_") && base != "_uploads" {
			return storagedriver.ErrSkipDir // _layers, _manifests
		}
		i := strings.Index(p, "/_uploads/")
		if i < 0 {
			return nil
		}
		session, _, _ := strings.Cut(p[i+len("/_uploads/"):], "/")
		key := p[:i] + "/_uploads/" + session
		if t := fi.ModTime(); t.After(last[key]) {
			last[key] = t
		}
		return nil
	})
	var notFound storagedriver.PathNotFoundError
	if err != nil && !errors.As(err, &notFound) {
		return 0, err
	}
	n := 0
	var errs []error
	for dir, t := range last {
		if !t.Before(before) {
			continue
		}
		if err := r.driver.Delete(ctx, dir); err != nil && !errors.As(err, &notFound) {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
