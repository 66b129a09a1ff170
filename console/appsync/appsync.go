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
)

// Loop is the periodic app sync.
type Loop struct {
	apps    *apps.Apps
	more    []func(ctx context.Context, tenants []string) error
	tenants func(context.Context) ([]string, error)
	every   time.Duration
	log     *slog.Logger
}

// New returns the loop that syncs the boxes of every tenant tenants
// lists, every interval, which must be positive. It starts nothing.
// more are synced at each interval too (the agent's own pins).
func New(a *apps.Apps, tenants func(context.Context) ([]string, error), every time.Duration, log *slog.Logger, more ...func(ctx context.Context, tenants []string) error) (*Loop, error) {
	if every <= 0 {
		return nil, errors.New("appsync: the interval must be positive")
	}
	return &Loop{apps: a, more: more, tenants: tenants, every: every, log: log.With("component", "appsync")}, nil
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
		ts, err := l.tenants(ctx)
		if err == nil {
			err = l.apps.SyncAll(ctx, ts)
			for _, sync := range l.more {
				err = errors.Join(err, sync(ctx, ts))
			}
		}
		if err != nil && ctx.Err() == nil {
			l.log.Warn("periodic app sync", "err", err)
		}
	}
}
