package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/keys"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Bounds on a wipe's wait and on what a box answers.
const (
	defaultWipeTimeout = 30 * time.Second
	maxWipeTimeout     = 10 * time.Minute
	maxWipeWorkloads   = 256
	maxWipeProblems    = 64
	maxWipeText        = 1024
)

// wipeTimeout reads RevokeRequest.WipeTimeout.
func wipeTimeout(s string) (time.Duration, error) {
	if s == "" {
		return defaultWipeTimeout, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Second || d > maxWipeTimeout {
		return 0, errdefs.Invalid("wipe_timeout %q: give a duration from 1s to 10m, such as \"30s\"", s)
	}
	return d, nil
}

// revokeAndWipe revokes a box at once, so it is refused at its next
// handshake whatever happens, then tells it over the session it still has
// to wipe itself and waits for its answer (at most timeout, even if the
// operator's call ends), records the answer, drops the session and, for
// the keys the box gave back, ends their leases.
func (s *server) revokeAndWipe(c *gin.Context, b fleet.Box, timeout time.Duration) {
	who := caller(c)
	b, err := s.Fleet.RevokeToWipe(c.Request.Context(), who, b.ID)
	if err != nil {
		s.fail(c, err)
		return
	}
	s.Log.Info("box revoked; asking it to wipe itself", "box_id", b.ID, "timeout", timeout)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request.Context()), timeout)
	defer cancel()
	resp, err := s.Agents.Wipe(ctx, b.ID, "revoked by "+who.Name)
	w := wipeResult(resp, err, timeout)
	s.Sessions.Drop(b.ID)
	if b, err = s.Fleet.RecordWipe(context.WithoutCancel(c.Request.Context()), who, b.ID, w); err != nil {
		s.fail(c, err)
		return
	}
	s.Log.Info("box revoked", "box_id", b.ID, "wipe", w.Result)
	if s.Keys != nil {
		for _, id := range w.KeysReleased {
			s.releaseWiped(c.Request.Context(), who, b.ID, id)
		}
	}
	c.JSON(http.StatusOK, s.view(c.Request.Context(), b))
}

// wipeResult turns a box's answer, checked and bounded, or why there is
// none, into the box's record.
func wipeResult(resp *edgeboxv1.WipeResponse, err error, timeout time.Duration) fleet.Wipe {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fleet.Wipe{Result: fmt.Sprintf("not confirmed: timed out after %s", timeout)}
	case err != nil:
		return fleet.Wipe{Result: "not confirmed: " + clip(err.Error())}
	}
	var w fleet.Wipe
	for _, n := range resp.GetWorkloadsRemoved()[:min(len(resp.GetWorkloadsRemoved()), maxWipeWorkloads)] {
		if edgeboxv1.ValidObjectName(n) {
			w.WorkloadsRemoved = append(w.WorkloadsRemoved, n)
		}
	}
	for _, k := range resp.GetKeysReleased()[:min(len(resp.GetKeysReleased()), keys.MaxDevices)] {
		if validKeyID(k) {
			w.KeysReleased = append(w.KeysReleased, k)
		}
	}
	for _, p := range resp.GetProblems()[:min(len(resp.GetProblems()), maxWipeProblems)] {
		w.Problems = append(w.Problems, clip(p))
	}
	switch {
	case resp.GetWiped() && len(w.Problems) == 0:
		w.Confirmed, w.Result = true, fleet.WipeConfirmed
	case len(w.Problems) > 0:
		w.Result = "not confirmed: the box could not finish: " + clip(strings.Join(w.Problems, "; "))
	default:
		w.Result = "not confirmed: the box answered without saying it is wiped"
	}
	return w
}

// clip bounds and cleans a text from a box.
func clip(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, ""))
	if len(s) > maxWipeText {
		s = strings.ToValidUTF8(s[:maxWipeText], "") + "..."
	}
	return s
}

// validKeyID accepts the key IDs keys.ID makes: "k-" and a short text of
// letters, digits and '-'.
func validKeyID(id string) bool {
	if !strings.HasPrefix(id, "k-") || len(id) > 128 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

// releaseWiped ends the lease of a key the wiped box gave back, if the
// key is that box's and still leased.
func (s *server) releaseWiped(ctx context.Context, who audit.Actor, box, id string) {
	k, _, err := s.Keys.Get(ctx, who.TenantID, id)
	if err != nil || k.BoxID != box || k.Holder == "" {
		return
	}
	if _, err := s.Keys.Release(ctx, who, id); err != nil {
		s.Log.Warn("the wiped box gave back a key whose lease could not be ended", "box_id", box, "key", id, "err", err)
	}
}

func wipeView(w *fleet.Wipe) *api.BoxWipe {
	if w == nil {
		return nil
	}
	v := &api.BoxWipe{AskedAt: w.AskedAt, AskedBy: w.AskedBy, Confirmed: w.Confirmed, Result: w.Result,
		WorkloadsRemoved: w.WorkloadsRemoved, KeysReleased: w.KeysReleased, Problems: w.Problems}
	if !w.AnsweredAt.IsZero() {
		at := w.AnsweredAt
		v.AnsweredAt = &at
	}
	return v
}
