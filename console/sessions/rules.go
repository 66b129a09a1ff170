package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
)

// Rules are a tenant's rules for remote sessions.
type Rules struct {
	// FourEyes: a session on a box any of these match needs a second
	// user's approval.
	FourEyes []BoxMatch `json:"four_eyes,omitempty"`
	// ForwardSites and ForwardBoxes allow port forwards from a site's
	// boxes, or one box's, to LAN hosts (see parseAllowEntry).
	ForwardSites map[string][]string `json:"forward_sites,omitempty"`
	ForwardBoxes map[string][]string `json:"forward_boxes,omitempty"`
	UpdatedAt    time.Time           `json:"updated_at,omitzero"`
	UpdatedBy    string              `json:"updated_by,omitempty"`
}

// BoxMatch picks boxes: those with every label it names, in its region
// and site when it names them.
type BoxMatch struct {
	Labels map[string]string `json:"labels,omitempty"`
	Region string            `json:"region,omitempty"`
	Site   string            `json:"site,omitempty"`
}

// maxMatches bounds a tenant's four-eyes matches.
const maxMatches = 100

func rulesKey(tenant string) string { return "session-rules/" + tenant }

// validateRules says what is wrong with r.
func validateRules(r Rules) error {
	if err := validateAllowLists(r); err != nil {
		return err
	}
	if len(r.FourEyes) > maxMatches {
		return errdefs.Invalid("session rules: at most %d four-eyes matches", maxMatches)
	}
	for i, m := range r.FourEyes {
		if len(m.Labels) == 0 && m.Region == "" && m.Site == "" {
			return errdefs.Invalid("four-eyes match %d names nothing: it would match every box; name labels, a region or a site", i+1)
		}
		if err := fleet.ValidateLabels(m.Labels); err != nil {
			return errdefs.Invalid("four-eyes match %d: %v", i+1, err)
		}
		if m.Region != "" {
			if err := fleet.ValidatePlace("region", m.Region); err != nil {
				return errdefs.Invalid("four-eyes match %d: %v", i+1, err)
			}
		}
		if m.Site != "" {
			if err := fleet.ValidatePlace("site", m.Site); err != nil {
				return errdefs.Invalid("four-eyes match %d: %v", i+1, err)
			}
		}
	}
	return nil
}

// matches reports whether m picks the box with these labels, region and
// site.
func matches(m BoxMatch, labels map[string]string, region, site string) bool {
	if (m.Region != "" && m.Region != region) || (m.Site != "" && m.Site != site) {
		return false
	}
	for k, v := range m.Labels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// GetRules returns a tenant's session rules; none set is no four-eyes.
func (b *Broker) GetRules(ctx context.Context, tenant string) (Rules, error) {
	var r Rules
	kv, err := b.cfg.Store.Get(ctx, rulesKey(tenant))
	if errors.Is(err, store.ErrNotFound) {
		return r, nil
	} else if err != nil {
		return r, err
	}
	return r, json.Unmarshal(kv.Value, &r)
}

// SetRules replaces the caller's tenant's session rules; sessions opened
// from now on follow them.
func (b *Broker) SetRules(ctx context.Context, who audit.Actor, r Rules) (Rules, error) {
	if err := validateRules(r); err != nil {
		return Rules{}, err
	}
	r.UpdatedAt, r.UpdatedBy = b.cfg.Now().UTC(), who.Name
	raw, err := json.Marshal(r)
	if err != nil {
		return Rules{}, err
	}
	e := who.Did("session.rules", "session-rules", fmt.Sprintf("%d four-eyes matches, forward allow lists for %d sites and %d boxes",
		len(r.FourEyes), len(r.ForwardSites), len(r.ForwardBoxes)))
	if _, err := b.cfg.Store.Txn(ctx, store.Txn{Then: []store.Op{{Key: rulesKey(who.TenantID), Value: raw}, audit.Op(b.cfg.Now(), e)}}); err != nil {
		return Rules{}, err
	}
	return r, nil
}

// NeedsApproval reports whether req's box is one the tenant's rules
// keep to four eyes.
func (b *Broker) NeedsApproval(ctx context.Context, req Request) (bool, error) {
	r, err := b.GetRules(ctx, req.TenantID)
	if err != nil {
		return false, err
	}
	for _, m := range r.FourEyes {
		if matches(m, req.BoxLabels, req.Region, req.Site) {
			return true, nil
		}
	}
	return false, nil
}
