//go:build linux

package integration

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/testenv"
)

// writeTimeout is how long one write may take before the test calls it
// hung: a write during a replica's restart must fail, not wait.
const writeTimeout = 15 * time.Second

// attempt is one write of the robot's release to a box.
type attempt struct {
	release string
	rev     uint64 // the box revision the API confirmed; 0 when err
	err     error
	at      time.Time
	took    time.Duration
}

// TestRollingRestartOfReplicas restarts the three replicas of the
// documented deployment one at a time, as docs/ha.md's upgrade does
// (SIGTERM, start again on the same addresses and data, wait until HAProxy
// routes to it and every box is online, then the next), while a writer
// changes the boxes' desired state through HAProxy every 50 ms (issue 18).
//
//   - A write that fails during a restart fails within 15 s with a 5xx or
//     a broken connection: it never hangs, and never answers 4xx.
//   - No confirmed write is lost: each box's confirmed revisions only
//     grow, and its desired state ends at its last confirmed write (or at
//     a later write whose answer was lost on the way, which may have
//     landed).
//   - No box is left out of sync: each box acks that state within 60 s.
func TestRollingRestartOfReplicas(t *testing.T) {
	t.Parallel()
	ha := startReplicas(t, 3)
	boxes := ha.enrollBoxes(t, 4, "roll-box")
	ids := make([]string, len(boxes))
	for i, b := range boxes {
		ids[i] = b.ID()
	}
	var held map[string]string
	testenv.WaitFor(t, 60*time.Second, "every box online, each held by a replica", func() bool {
		var ok bool
		held, ok = holders(t, ha.admin, len(boxes))
		return ok
	})

	// The writer: box after box, one write at a time, each box through
	// a client of its own, so that HAProxy spreads their connections
	// over the replicas and each restart breaks some of them. attempts
	// belongs to the writer until writerDone closes.
	writers := make([]*api.Client, len(boxes))
	for i := range writers {
		writers[i] = ha.client(t, ha.public)
	}
	attempts := map[string][]attempt{}
	quit, writerDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(writerDone)
		for n := 0; ; n++ {
			select {
			case <-quit:
				return
			case <-time.After(50 * time.Millisecond):
			}
			i := n % len(boxes)
			a := attempt{release: strconv.Itoa(n), at: time.Now()}
			wctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
			a.rev, a.err = writers[i].PutDesired(wctx, ids[i], "Workload", "robot", spec("robot", a.release, "process"))
			cancel()
			a.took = time.Since(a.at)
			attempts[ids[i]] = append(attempts[ids[i]], a)
		}
	}()
	stopWriter := sync.OnceFunc(func() { close(quit); <-writerDone })
	t.Cleanup(stopWriter)
	time.Sleep(time.Second) // writes confirmed before the first restart

	for i, r := range ha.reps {
		oldID := r.id(t)
		before := heldCount(held, oldID)
		start := time.Now()
		if err := r.stop(syscall.SIGTERM); err != nil {
			t.Errorf("replica %d (%s) on SIGTERM: %v\n%s", i, oldID, err, r.log())
		}
		stopped := time.Since(start)
		r.start(t)
		started := time.Since(start) - stopped
		newID := r.id(t)
		routed := ha.waitRouted(t, i, 30*time.Second)
		live := map[string]bool{}
		for _, r := range ha.reps {
			live[r.id(t)] = true
		}
		testenv.WaitFor(t, 60*time.Second, fmt.Sprintf("every box online on a running replica after replica %d's restart", i), func() bool {
			by, ok := holders(t, ha.admin, len(boxes))
			if !ok {
				return false
			}
			for _, id := range by {
				if !live[id] {
					return false
				}
			}
			held = by
			return true
		})
		t.Logf("replica %d (%s, %d boxes): SIGTERM at %s, stopped in %v, started again as %s in %v, routed to %v later, every box online %v after the stop; boxes held now: %s",
			i, oldID, before, start.Format("15:04:05.000"), stopped.Round(time.Millisecond), newID, started.Round(time.Millisecond), routed.Round(time.Millisecond),
			time.Since(start).Round(time.Millisecond), heldSummary(t, ha, held))
	}
	time.Sleep(time.Second) // writes confirmed after the last restart
	stopWriter()
	writerStopped := time.Now()

	// What the writer saw.
	last := map[string]attempt{}   // each box's last confirmed write
	later := map[string][]string{} // releases of failed writes after it
	var confirmed, failed int
	kinds := map[string]int{}
	var slowest time.Duration
	var longestGap time.Duration // between two confirmed writes, any box
	var prevOK time.Time
	all := slices.Concat(slices.Collect(maps.Values(attempts))...)
	slices.SortFunc(all, func(a, b attempt) int { return a.at.Compare(b.at) })
	for _, a := range all {
		slowest = max(slowest, a.took)
		if a.err == nil {
			if !prevOK.IsZero() {
				longestGap = max(longestGap, a.at.Sub(prevOK))
			}
			prevOK = a.at
		}
	}
	for _, id := range ids {
		for _, a := range attempts[id] {
			if a.err == nil {
				confirmed++
				if l, ok := last[id]; ok && a.rev <= l.rev {
					t.Errorf("box %s: the write of release %s was confirmed at revision %d, after the write of release %s at revision %d", id, a.release, a.rev, l.release, l.rev)
				}
				last[id], later[id] = a, nil
				continue
			}
			failed++
			later[id] = append(later[id], a.release)
			kind, ok := writeFailure(a.err)
			kinds[kind]++
			t.Logf("box %s: the write of release %s at %s failed after %v: %s (%v)",
				id, a.release, a.at.Format("15:04:05.000"), a.took.Round(time.Millisecond), kind, a.err)
			if !ok {
				t.Errorf("box %s: the write of release %s failed after %v with %v (%T): want a 5xx or a broken connection within %v",
					id, a.release, a.took.Round(time.Millisecond), a.err, a.err, writeTimeout)
			}
		}
		if _, ok := last[id]; !ok {
			t.Fatalf("box %s: no write was confirmed", id)
		}
	}
	t.Logf("writes: %d confirmed, %d failed %v; slowest %v; longest time without a confirmed write %v",
		confirmed, failed, kinds, slowest.Round(time.Millisecond), longestGap.Round(time.Millisecond))

	// Each box's desired state is its last confirmed write, or a later one
	// whose answer was lost; and the box acks it.
	want := map[string]uint64{} // the revision each box must ack
	for _, id := range ids {
		l := last[id]
		var st api.BoxState
		testenv.WaitFor(t, 30*time.Second, "the state of box "+id, func() bool {
			var err error
			st, err = readState(ha.admin, id)
			return err == nil
		})
		var robot *api.DesiredObject
		for _, o := range st.Objects {
			if o.Kind == "Workload" && o.Name == "robot" {
				robot = &o
			}
		}
		if robot == nil {
			t.Errorf("box %s has no robot; the last confirmed write is release %s at revision %d", id, l.release, l.rev)
			continue
		}
		var w struct {
			Release string `json:"release"`
		}
		if err := json.Unmarshal(robot.Spec, &w); err != nil {
			t.Fatalf("box %s: robot's spec %s: %v", id, robot.Spec, err)
		}
		switch {
		case w.Release == l.release && robot.Revision == l.rev:
		case slices.Contains(later[id], w.Release) && robot.Revision > l.rev:
			t.Logf("box %s: a write whose answer was lost (release %s) landed, at revision %d, after the last confirmed one (release %s, revision %d)",
				id, w.Release, robot.Revision, l.release, l.rev)
		default:
			t.Errorf("box %s: a confirmed write was lost: the robot is at release %s, revision %d; the last confirmed write was release %s at revision %d (later writes that failed: %v)",
				id, w.Release, robot.Revision, l.release, l.rev, later[id])
		}
		want[id] = max(l.rev, robot.Revision)
	}
	deadline := time.Now().Add(60 * time.Second)
	for len(want) > 0 {
		for _, id := range slices.Sorted(maps.Keys(want)) {
			if st, err := readState(ha.admin, id); err == nil && st.Acked >= want[id] {
				delete(want, id)
			} else if time.Now().After(deadline) {
				t.Errorf("box %s did not ack revision %d within 60 s: acked %d, revision %d, error %v", id, want[id], st.Acked, st.Revision, err)
				delete(want, id)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("every box acked its state %v after the writer stopped", time.Since(writerStopped).Round(time.Millisecond))
}

// readState reads a box's desired state, within writeTimeout.
func readState(c *api.Client, box string) (api.BoxState, error) {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	return c.BoxState(ctx, box)
}

// writeFailure names the kind of a failed write for the log, and says
// whether it is one a restart may cause: a 5xx, or a connection that was
// refused or broke. A call that ran out of time hung; a certificate the
// client does not trust, or an answer it cannot read, is no restart's.
func writeFailure(err error) (string, bool) {
	var se *api.StatusError
	var ne net.Error
	var oe *net.OpError
	var cve *tls.CertificateVerificationError
	var jse *json.SyntaxError
	var jte *json.UnmarshalTypeError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "hung", false
	case errors.As(err, &se):
		return fmt.Sprintf("%d %s", se.Status, se.Message), se.Status >= 500
	case errors.As(err, &cve), errors.As(err, &jse), errors.As(err, &jte):
		return err.Error(), false
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused", true
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "connection reset", true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed", true
	case errors.As(err, &oe):
		return "connection: " + oe.Op + ": " + oe.Err.Error(), true
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		err = e
	}
	return "connection: " + err.Error(), true
}

// heldCount is how many boxes replica holds.
func heldCount(held map[string]string, replica string) int {
	n := 0
	for _, r := range held {
		if r == replica {
			n++
		}
	}
	return n
}

// heldSummary is how many boxes each replica holds, for the log.
func heldSummary(t *testing.T, ha *haDeployment, held map[string]string) string {
	var b strings.Builder
	for i, r := range ha.reps {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "replica %d: %d", i, heldCount(held, r.id(t)))
	}
	return b.String()
}
