package alerts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
)

// Kind is what an alert rule watches.
type Kind string

// The kinds of rule.
const (
	// BoxOffline: the box has no tunnel, whatever its site says of it
	// (disconnected-running, down or unknown).
	BoxOffline Kind = "box-offline"
	// BoxDown: the box has no tunnel and its site's majority does not
	// hear it either.
	BoxDown Kind = "box-down"
	// KeyBroken: a UKEY stopped answering (stuck), or the box gave up
	// power-cycling it (broken).
	KeyBroken Kind = "key-broken"
	// WorkloadUnhealthy: a workload's probes fail, or it failed.
	WorkloadUnhealthy Kind = "workload-unhealthy"
	// RolloutStopped: a rollout was stopped by its failure policy.
	RolloutStopped Kind = "rollout-stopped"
	// CertExpiry: a box's certificate ends within the rule's days (a
	// box renews its own while it runs; one that did not is in trouble).
	CertExpiry Kind = "cert-expiry"
)

// Kinds are the kinds of rule, in the order they are shown.
var Kinds = []Kind{BoxOffline, BoxDown, KeyBroken, WorkloadUnhealthy, RolloutStopped, CertExpiry}

// Rules are a tenant's alert rules and where its alerts go.
type Rules struct {
	Rules    []Rule    `json:"rules,omitempty"`
	Webhooks []Webhook `json:"webhooks,omitempty"`
	// UpdatedAt and UpdatedBy say who set the rules last.
	UpdatedAt time.Time `json:"updated_at,omitzero"`
	UpdatedBy string    `json:"updated_by,omitempty"`
}

// Rule raises an incident for each thing its kind watches that holds
// its condition for ForMinutes.
type Rule struct {
	Kind       Kind `json:"kind"`
	ForMinutes int  `json:"for_minutes,omitempty"`
	// Days is, for cert-expiry, how close to its end a certificate is
	// worth an alert; 14 when 0.
	Days int `json:"days,omitempty"`
}

// Webhook is where a tenant's alerts are posted, as JSON. With a secret,
// each post carries X-Edgebox-Signature: sha256=HMAC-SHA256(secret, body).
type Webhook struct {
	URL string `json:"url"`
	// Secret is written, never read back: reads say HasSecret. A rules
	// update that names a webhook's URL without a secret keeps its old one.
	Secret    string `json:"secret,omitempty"`
	HasSecret bool   `json:"has_secret,omitempty"`
}

// Bounds on a tenant's rules.
const (
	MaxWebhooks   = 10
	maxURL        = 2048
	maxSecret     = 256
	maxForMinutes = 7 * 24 * 60
	defaultDays   = 14
)

func rulesKey(tenant string) string { return "alerts/rules/" + tenant }

// Validate says what is wrong with r.
func (r Rules) Validate() error {
	seen := map[Kind]bool{}
	for i, rule := range r.Rules {
		known := false
		for _, k := range Kinds {
			known = known || rule.Kind == k
		}
		if !known {
			return errdefs.Invalid("alert rule %d: unknown kind %q; the kinds are %s", i+1, rule.Kind, kindList())
		}
		if seen[rule.Kind] {
			return errdefs.Invalid("alert rule %d: a second rule of kind %s; one a kind", i+1, rule.Kind)
		}
		seen[rule.Kind] = true
		if rule.ForMinutes < 0 || rule.ForMinutes > maxForMinutes {
			return errdefs.Invalid("alert rule %s: for_minutes must be 0 to %d (a week)", rule.Kind, maxForMinutes)
		}
		if rule.Days != 0 && rule.Kind != CertExpiry {
			return errdefs.Invalid("alert rule %s: days is for cert-expiry only", rule.Kind)
		}
		if rule.Days < 0 || rule.Days > 365 {
			return errdefs.Invalid("alert rule %s: days must be 1 to 365", rule.Kind)
		}
	}
	if len(r.Webhooks) > MaxWebhooks {
		return errdefs.Invalid("at most %d webhooks", MaxWebhooks)
	}
	urls := map[string]bool{}
	for i, w := range r.Webhooks {
		if err := validateURL(w.URL); err != nil {
			return errdefs.Invalid("webhook %d: %v", i+1, err)
		}
		if urls[w.URL] {
			return errdefs.Invalid("webhook %d: %s is listed twice", i+1, w.URL)
		}
		urls[w.URL] = true
		if len(w.Secret) > maxSecret {
			return errdefs.Invalid("webhook %d: the secret is longer than %d bytes", i+1, maxSecret)
		}
	}
	return nil
}

func validateURL(s string) error {
	if len(s) > maxURL {
		return fmt.Errorf("the URL is longer than %d bytes", maxURL)
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("not a URL: %v", err)
	}
	if (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return fmt.Errorf("%q is not an http or https URL with a host", s)
	}
	if u.User != nil {
		return errors.New("the URL carries a password; use the webhook's secret, which signs each post, instead")
	}
	return nil
}

func kindList() string {
	s := make([]string, len(Kinds))
	for i, k := range Kinds {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}

// rule returns the tenant's rule of kind k.
func (r Rules) rule(k Kind) (Rule, bool) {
	for _, rule := range r.Rules {
		if rule.Kind == k {
			if rule.Kind == CertExpiry && rule.Days == 0 {
				rule.Days = defaultDays
			}
			return rule, true
		}
	}
	return Rule{}, false
}

// secret returns the secret of the webhook at u.
func (r Rules) secret(u string) (string, bool) {
	for _, w := range r.Webhooks {
		if w.URL == u {
			return w.Secret, true
		}
	}
	return "", false
}

// redacted is r as reads show it: no secrets, whether each has one.
func (r Rules) redacted() Rules {
	out := r
	out.Webhooks = make([]Webhook, len(r.Webhooks))
	for i, w := range r.Webhooks {
		out.Webhooks[i] = Webhook{URL: w.URL, HasSecret: w.Secret != ""}
	}
	return out
}

// rules reads a tenant's rules, secrets and all, and the key's revision.
func (s *Service) rules(ctx context.Context, tenant string) (Rules, int64, error) {
	var r Rules
	kv, err := s.cfg.Store.Get(ctx, rulesKey(tenant))
	if errors.Is(err, store.ErrNotFound) {
		return r, 0, nil
	} else if err != nil {
		return r, 0, err
	}
	return r, kv.ModRevision, json.Unmarshal(kv.Value, &r)
}

// GetRules returns a tenant's rules, without the webhooks' secrets; none
// set is no alerts.
func (s *Service) GetRules(ctx context.Context, tenant string) (Rules, error) {
	r, _, err := s.rules(ctx, tenant)
	return r.redacted(), err
}

// SetRules replaces the caller's tenant's rules. A webhook named without
// a secret keeps the one it had. The next evaluation follows them:
// incidents of a kind no longer watched are resolved.
func (s *Service) SetRules(ctx context.Context, who audit.Actor, r Rules) (Rules, error) {
	if err := r.Validate(); err != nil {
		return Rules{}, err
	}
	for {
		old, rev, err := s.rules(ctx, who.TenantID)
		if err != nil {
			return Rules{}, err
		}
		for i, w := range r.Webhooks {
			if w.Secret == "" {
				r.Webhooks[i].Secret, _ = old.secret(w.URL)
			}
			r.Webhooks[i].HasSecret = false
		}
		r.UpdatedAt, r.UpdatedBy = s.cfg.Now().UTC(), who.Name
		raw, err := json.Marshal(r)
		if err != nil {
			return Rules{}, err
		}
		e := who.Did("alerts.rules", "alert-rules", fmt.Sprintf("%d rules, %d webhooks", len(r.Rules), len(r.Webhooks)))
		res, err := s.cfg.Store.Txn(ctx, store.Txn{If: []store.Cmp{{Key: rulesKey(who.TenantID), ModRevision: rev}},
			Then: []store.Op{{Key: rulesKey(who.TenantID), Value: raw}, audit.Op(s.cfg.Now(), e)}})
		if err != nil {
			return Rules{}, err
		}
		if res.Succeeded {
			s.Kick()
			return r.redacted(), nil
		}
	}
}
