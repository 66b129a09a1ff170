package console

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/edgebox/edgebox/console/store"
)

// compactLoop keeps the store's history to about the last keep revisions,
// checking every interval, until ctx ends. Watches that fall further
// behind start again (the Sync hub re-reads every box).
func compactLoop(ctx context.Context, st store.Store, interval time.Duration, keep int64, log *slog.Logger) {
	every(ctx, interval, func() {
		if rev, err := compactOnce(ctx, st, keep); err != nil && ctx.Err() == nil {
			log.Warn("store compaction failed", "err", err)
		} else if rev > 0 {
			log.Debug("store compacted", "before", rev)
		}
	})
}

// compactOnce forgets history older than keep revisions back and returns
// the revision history now starts at, or 0 when there was nothing to do.
func compactOnce(ctx context.Context, st store.Store, keep int64) (int64, error) {
	cur, err := st.Revision(ctx)
	if err != nil {
		return 0, err
	}
	to := cur - keep
	if to <= 0 {
		return 0, nil
	}
	if err := st.Compact(ctx, to); errors.Is(err, store.ErrCompacted) {
		return 0, nil // done already
	} else if err != nil {
		return 0, err
	}
	return to, nil
}
