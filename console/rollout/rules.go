package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
)

// Rules are a tenant's rules for its rollouts: which approvals a rollout
// needs, and when each region's or site's boxes may be updated.
type Rules struct {
	// ApproveStart: a rollout waits for a second user's approval before
	// it starts.
	ApproveStart bool `json:"approve_start,omitempty"`
	// ApproveFirstWave: a rollout waits for a second user's approval once
	// its first wave is through.
	ApproveFirstWave bool `json:"approve_first_wave,omitempty"`
	// Regions and Sites hold maintenance policies by name; a site's
	// policy, where there is one, is the one its boxes follow.
	Regions map[string]Policy `json:"regions,omitempty"`
	Sites   map[string]Policy `json:"sites,omitempty"`
	// Calendar is the tenant's holidays, used by every policy that has
	// none of its own.
	Calendar Calendar `json:"calendar,omitzero"`
	// UpdatedAt and UpdatedBy say who set the rules last.
	UpdatedAt time.Time `json:"updated_at,omitzero"`
	UpdatedBy string    `json:"updated_by,omitempty"`
}

// maxPolicies bounds the policies one tenant's rules hold.
const maxPolicies = 1000

func rulesKey(tenant string) string { return "rollout-rules/" + tenant }

// policyFor returns the policy box b follows, with the tenant's calendar
// where it has none, and whether it has one.
func (r Rules) policyFor(b fleet.Box) (Policy, bool) {
	p, ok := r.Sites[b.Site]
	if !ok {
		p, ok = r.Regions[b.Region]
	}
	if ok && len(p.Calendar.Holidays)+len(p.Calendar.ExtraWorkdays) == 0 {
		p.Calendar = r.Calendar
	}
	return p, ok
}

// Validate says what is wrong with r: a bad name, or a policy that is
// wrong or never opens within 14 days (with the tenant's calendar).
func (r Rules) Validate() error {
	if len(r.Regions)+len(r.Sites) > maxPolicies {
		return errdefs.Invalid("rollout rules: at most %d maintenance policies", maxPolicies)
	}
	if len(r.Calendar.Holidays)+len(r.Calendar.ExtraWorkdays) > maxDates {
		return errdefs.Invalid("rollout rules: at most %d calendar dates", maxDates)
	}
	for _, d := range append(append([]string{}, r.Calendar.Holidays...), r.Calendar.ExtraWorkdays...) {
		if _, err := time.Parse(time.DateOnly, d); err != nil {
			return errdefs.Invalid("calendar date %q: use YYYY-MM-DD", trunc(d))
		}
	}
	check := func(scope string, m map[string]Policy) error {
		for name := range m {
			if err := fleet.ValidatePlace(scope, name); err != nil || name == "" {
				return errdefs.Invalid("maintenance policy of %s %q: not a valid %s name", scope, trunc(name), scope)
			}
			one := Rules{Calendar: r.Calendar, Regions: map[string]Policy{}, Sites: map[string]Policy{}}
			one.Regions[name], one.Sites[name] = m[name], m[name]
			p, _ := one.policyFor(fleet.Box{Region: name, Site: name})
			if err := p.Validate(); err != nil {
				return errdefs.Invalid("%s %s: %v", scope, name, err)
			}
		}
		return nil
	}
	if err := check("region", r.Regions); err != nil {
		return err
	}
	return check("site", r.Sites)
}

// GetRules returns tenant's rollout rules; a tenant that set none has
// the zero Rules: no approvals, no windows.
func (s *Service) GetRules(ctx context.Context, tenant string) (Rules, error) {
	var r Rules
	kv, err := s.s.Get(ctx, rulesKey(tenant))
	if errors.Is(err, store.ErrNotFound) {
		return r, nil
	} else if err != nil {
		return r, err
	}
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		return r, err
	}
	return r, nil
}

// SetRules replaces the caller's tenant's rollout rules. Running
// rollouts follow the new windows from their next tick; the approvals
// apply to rollouts created from now on.
func (s *Service) SetRules(ctx context.Context, who audit.Actor, r Rules) (Rules, error) {
	if err := r.Validate(); err != nil {
		return Rules{}, err
	}
	r.UpdatedAt, r.UpdatedBy = s.now().UTC(), who.Name
	raw, err := json.Marshal(r)
	if err != nil {
		return Rules{}, err
	}
	detail := "no approvals"
	switch {
	case r.ApproveStart && r.ApproveFirstWave:
		detail = "approval to start and after the first wave"
	case r.ApproveStart:
		detail = "approval to start"
	case r.ApproveFirstWave:
		detail = "approval after the first wave"
	}
	if n := len(r.Regions) + len(r.Sites); n > 0 {
		detail += ", maintenance policies for " + plural(len(r.Regions), "region") + " and " + plural(len(r.Sites), "site")
	}
	if _, err := s.s.Txn(ctx, store.Txn{Then: []store.Op{{Key: rulesKey(who.TenantID), Value: raw},
		audit.Op(s.now(), who.Did("rollout.rules", who.TenantID, detail))}}); err != nil {
		return Rules{}, err
	}
	return r, nil
}
