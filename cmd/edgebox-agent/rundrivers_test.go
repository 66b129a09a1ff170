package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/fake"
)

// running is a driver with a Run of its own, as the qemu driver is.
type running struct {
	*fake.Driver
	started, ended atomic.Bool
}

func (r *running) Run(ctx context.Context) error {
	r.started.Store(true)
	<-ctx.Done()
	time.Sleep(10 * time.Millisecond) // a run that takes a moment to stop
	r.ended.Store(true)
	return nil
}

// TestRunWithDrivers: a driver's Run runs while the agent does and has
// ended when runWithDrivers returns the agent's result, whether the agent
// stops by itself or its context ends.
func TestRunWithDrivers(t *testing.T) {
	t.Parallel()
	failed := errors.New("agent failed")
	tests := []struct {
		name  string
		agent func(ctx context.Context, r *running) error
		want  error
	}{
		{"agent fails", func(ctx context.Context, r *running) error {
			for !r.started.Load() {
				time.Sleep(time.Millisecond)
			}
			return failed
		}, failed},
		{"context ends", func(ctx context.Context, r *running) error {
			<-ctx.Done()
			return nil
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := &running{Driver: fake.New("qemu")}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.want == nil {
				go func() { // the box stops once the driver runs
					for !r.started.Load() {
						time.Sleep(time.Millisecond)
					}
					cancel()
				}()
			}
			err := runWithDrivers(ctx, func(ctx context.Context) error { return tt.agent(ctx, r) },
				runnersOf([]runtime.Driver{fake.New("process"), r}), slog.New(slog.NewTextHandler(io.Discard, nil)))
			if !errors.Is(err, tt.want) {
				t.Fatalf("runWithDrivers = %v, want %v", err, tt.want)
			}
			if !r.started.Load() || !r.ended.Load() {
				t.Fatalf("the driver's Run started %v, ended %v; want both before runWithDrivers returns", r.started.Load(), r.ended.Load())
			}
		})
	}
}
