// Package appsync checks every box against the app pins now and then, so
// a box whose sync failed when its pin changed still gets its releases.
// Deploys and boxes' hellos sync at once; this is the net behind them.
package appsync

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/edgebox/edgebox/console/apps"
	"github.com/edgebox/edgebox/console/fleet"
)

// Loop is the periodic app sync.
type Loop struct {
	apps  *apps.Apps
	every time.Duration
	log   *slog.Logger
}

// New returns the loop that syncs a's boxes every interval, which must be
// positive. It starts nothing.
func New(a *apps.Apps, every time.Duration, log *slog.Logger) (*Loop, error) {
	if every <= 0 {
		return nil, errors.New("appsync: the interval must be positive")
	}
	return &Loop{apps: a, every: every, log: log.With("component", "appsync")}, nil
}

// Run syncs every interval until ctx ends, and returns nil then. A failed
// sync is logged and tried again at the next interval.
func (l *Loop) Run(ctx context.Context) error {
	t := time.NewTicker(l.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		// One tenant until tenants are managed.
		if err := l.apps.SyncAll(ctx, []string{fleet.DefaultTenant}); err != nil && ctx.Err() == nil {
			l.log.Warn("periodic app sync", "err", err)
		}
	}
}
