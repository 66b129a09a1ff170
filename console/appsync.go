package console

import (
	"context"
	"log/slog"
	"time"

	"github.com/edgebox/edgebox/console/apps"
	"github.com/edgebox/edgebox/console/fleet"
)

// appsLoop checks every box against the app pins now and then, so a box
// whose sync failed when its pin changed still gets its releases.
func appsLoop(ctx context.Context, a *apps.Apps, interval time.Duration, log *slog.Logger) {
	every(ctx, interval, func() {
		// One tenant until tenants are managed.
		if err := a.SyncAll(ctx, []string{fleet.DefaultTenant}); err != nil && ctx.Err() == nil {
			log.Warn("periodic app sync", "err", err)
		}
	})
}
