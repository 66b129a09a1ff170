package store

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// Compactor keeps a store's history to about its last Keep revisions, so
// watches that lag a little resume and the store does not grow without
// bound. Watches that fall further behind fail with ErrCompacted and start
// again.
type Compactor struct {
	s     Store
	every time.Duration
	keep  int64
	log   *slog.Logger
}

// NewCompactor returns a Compactor of s that checks every interval and
// keeps the last keep revisions; both must be positive. It starts nothing.
func NewCompactor(s Store, every time.Duration, keep int64, log *slog.Logger) (*Compactor, error) {
	if every <= 0 || keep <= 0 {
		return nil, errors.New("store: compaction interval and revisions kept must be positive")
	}
	return &Compactor{s: s, every: every, keep: keep, log: log.With("component", "compaction")}, nil
}

// Run compacts every interval until ctx ends, and returns nil then. A
// failed compaction is logged and tried again at the next interval.
func (c *Compactor) Run(ctx context.Context) error {
	t := time.NewTicker(c.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if rev, err := c.Once(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("store compaction failed", "err", err)
		} else if rev > 0 {
			c.log.Debug("store compacted", "before", rev)
		}
	}
}

// Once forgets history older than the kept revisions and returns the
// revision history now starts at, or 0 when there was nothing to do.
func (c *Compactor) Once(ctx context.Context) (int64, error) {
	cur, err := c.s.Revision(ctx)
	if err != nil {
		return 0, err
	}
	to := cur - c.keep
	if to <= 0 {
		return 0, nil
	}
	if err := c.s.Compact(ctx, to); errors.Is(err, ErrCompacted) {
		return 0, nil // done already
	} else if err != nil {
		return 0, err
	}
	return to, nil
}
