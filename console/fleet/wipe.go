package fleet

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/errdefs"
)

// Wipe is what became of the wipe asked for when a box was revoked: the
// box was told, over the session it still had, to remove its workloads,
// give back its keys and erase its desired state and identity.
type Wipe struct {
	AskedAt time.Time `json:"asked_at"`
	AskedBy string    `json:"asked_by"`
	// Confirmed: the box answered that everything is erased.
	Confirmed bool `json:"confirmed"`
	// Result is WipeAsked until the box answers or the wait ends, then
	// WipeConfirmed or "not confirmed: …" saying why.
	Result           string    `json:"result"`
	AnsweredAt       time.Time `json:"answered_at,omitzero"`
	WorkloadsRemoved []string  `json:"workloads_removed,omitempty"`
	KeysReleased     []string  `json:"keys_released,omitempty"`
	Problems         []string  `json:"problems,omitempty"`
}

// Results of a wipe.
const (
	WipeAsked     = "asked"
	WipeConfirmed = "wiped"
)

// RevokeToWipe revokes a box as Revoke does, and records that its wipe was
// asked for; RecordWipe records the box's answer. A box revoked already
// cannot be wiped: its session is gone.
func (f *Fleet) RevokeToWipe(ctx context.Context, who audit.Actor, id string) (Box, error) {
	return f.UpdateBox(ctx, who, id, "box.revoke", "wipe asked", func(b *Box) error {
		if b.State == StateRevoked {
			return errdefs.Conflict("box %s is revoked already: its session is gone, so it cannot be told to wipe itself", id)
		}
		b.State = StateRevoked
		b.Wipe = &Wipe{AskedAt: f.now().UTC(), AskedBy: who.Name, Result: WipeAsked}
		return nil
	})
}

// RecordWipe records what became of a box's wipe in its record and in an
// audit entry ("box.wipe") whose result is the wipe's.
func (f *Fleet) RecordWipe(ctx context.Context, who audit.Actor, id string, w Wipe) (Box, error) {
	return f.update(ctx, id, func(b *Box) (*audit.Entry, error) {
		if b.TenantID != who.TenantID {
			return nil, errdefs.NotFound("no box %q", id)
		}
		if b.Wipe == nil || b.State != StateRevoked {
			return nil, errdefs.Conflict("box %s was not revoked to be wiped", id)
		}
		w := w
		w.AskedAt, w.AskedBy = b.Wipe.AskedAt, b.Wipe.AskedBy
		w.AnsweredAt = f.now().UTC()
		b.Wipe = &w
		e := who.Did("box.wipe", id, w.Detail())
		e.Result = w.Result
		return &e, nil
	})
}

// Detail says in one line what the box did, for the audit log.
func (w Wipe) Detail() string {
	var parts []string
	if len(w.WorkloadsRemoved) > 0 || w.Confirmed {
		parts = append(parts, fmt.Sprintf("workloads removed: %d %s", len(w.WorkloadsRemoved), list(w.WorkloadsRemoved)))
	}
	if len(w.KeysReleased) > 0 || w.Confirmed {
		parts = append(parts, fmt.Sprintf("keys released: %d %s", len(w.KeysReleased), list(w.KeysReleased)))
	}
	if len(w.Problems) > 0 {
		parts = append(parts, "problems: "+strings.Join(w.Problems, "; "))
	}
	d := strings.Join(parts, "; ")
	if len(d) > 1024 {
		d = d[:1021] + "..."
	}
	return d
}

func list(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return "(" + strings.Join(s, ", ") + ")"
}
