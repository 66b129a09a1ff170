package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestEtcdErrorsOfAQuorumLost: which errors mean that etcd does not
// answer (a read then asks a member for its copy, a write says so), and
// which that it has lost its quorum, as the client hands them over:
// converted to rpctypes' values, as gRPC statuses, wrapped.
func TestEtcdErrorsOfAQuorumLost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		err         error
		unavailable bool
		lostQuorum  bool
		timedOut    bool
	}{
		{"no leader", rpctypes.ErrNoLeader, true, true, false},
		{"no leader, a gRPC status", rpctypes.ErrGRPCNoLeader, true, true, false},
		{"no leader, wrapped", fmt.Errorf("txn: %w", rpctypes.ErrNoLeader), true, true, false},
		{"proposal lost with the leader", rpctypes.ErrTimeoutDueToLeaderFail, true, true, false},
		{"leader cut off from its followers", rpctypes.ErrTimeoutDueToConnectionLost, true, true, false},
		{"request timed out", rpctypes.ErrTimeout, true, false, true},
		{"our deadline", context.DeadlineExceeded, true, false, true},
		{"a gRPC deadline", status.Error(codes.DeadlineExceeded, "context deadline exceeded"), true, false, true},
		{"unreachable", status.Error(codes.Unavailable, "connection refused"), true, false, false},
		{"member stopping", rpctypes.ErrStopped, true, false, false},
		{"compacted", rpctypes.ErrCompacted, false, false, false},
		{"too large", rpctypes.ErrRequestTooLarge, false, false, false},
		{"cancelled", context.Canceled, false, false, false},
		{"anything else", errors.New("boom"), false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := unavailable(tc.err); got != tc.unavailable {
				t.Errorf("unavailable(%v) = %v", tc.err, got)
			}
			if got := lostQuorum(tc.err); got != tc.lostQuorum {
				t.Errorf("lostQuorum(%v) = %v", tc.err, got)
			}
			if got := timedOut(tc.err); got != tc.timedOut {
				t.Errorf("timedOut(%v) = %v", tc.err, got)
			}
		})
	}
}

// TestStaleReadsProbeAndLogOnce: a read waits 2 s for a linearizable
// answer (2/5 of a shorter deadline); while reads are stale, one read a
// second tries for 500 ms and the others take the member's copy at once;
// each change is logged once however many reads see it.
func TestStaleReadsProbeAndLogOnce(t *testing.T) {
	t.Parallel()
	r := newReads()
	var logs bytes.Buffer
	r.log = slog.New(slog.NewTextHandler(&logs, nil)) // written under r.mu
	ctx := func(d time.Duration) context.Context {
		c, cancel := context.WithTimeout(context.Background(), d)
		t.Cleanup(cancel)
		return c
	}
	if share, ok := r.linearizable(ctx(time.Minute), time.Now()); !ok || share != linearShare {
		t.Errorf("current reads: %v, %v; want %v", share, ok, linearShare)
	}
	if share, ok := r.linearizable(ctx(time.Second), time.Now()); !ok || share > 400*time.Millisecond || share < 300*time.Millisecond {
		t.Errorf("a read with 1 s: %v, %v; want about 400 ms", share, ok)
	}

	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { r.set(true, errors.New("etcdserver: no leader")) })
	}
	wg.Wait()
	now := time.Now()
	if _, ok := r.linearizable(ctx(time.Minute), now); ok {
		t.Error("a stale read just after reads went stale tries linearizable")
	}
	later := now.Add(probeEvery + 100*time.Millisecond)
	if share, ok := r.linearizable(ctx(time.Minute), later); !ok || share != probeShare {
		t.Errorf("the probe a second later: %v, %v; want %v", share, ok, probeShare)
	}
	if _, ok := r.linearizable(ctx(time.Minute), later); ok {
		t.Error("two probes in the same second")
	}
	for range 8 {
		wg.Go(func() { r.set(false, nil) })
	}
	wg.Wait()
	if share, ok := r.linearizable(ctx(time.Minute), later); !ok || share != linearShare {
		t.Errorf("current again: %v, %v; want %v", share, ok, linearShare)
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
		t.Errorf("reads going stale logged %d times, want once:\n%s", n, logs.String())
	}
	if n := strings.Count(logs.String(), "level=INFO"); n != 1 {
		t.Errorf("reads current again logged %d times, want once:\n%s", n, logs.String())
	}
}
