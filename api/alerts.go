package api

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Incident is one condition of one thing under a tenant's alert rules,
// from when it began to hold to when it ended.
type Incident struct {
	ID   string `json:"id"`
	Kind string `json:"kind"` // box-offline, box-down, key-broken, workload-unhealthy, rollout-stopped, cert-expiry
	// Subject is what it is about; Summary what holds now.
	Subject string `json:"subject"`
	Summary string `json:"summary"`
	Box     string `json:"box,omitempty"`
	BoxName string `json:"box_name,omitempty"`
	Site    string `json:"site,omitempty"`
	Region  string `json:"region,omitempty"`
	// State: pending (not held for its rule's minutes yet), firing or
	// resolved.
	State      string    `json:"state"`
	Since      time.Time `json:"since"`
	FiredAt    time.Time `json:"fired_at,omitzero"`
	ResolvedAt time.Time `json:"resolved_at,omitzero"`
	// Silenced: a silence (SilencedBy) keeps it from the webhooks now.
	Silenced   bool   `json:"silenced,omitempty"`
	SilencedBy string `json:"silenced_by,omitempty"`
	// Notified: the webhooks were told it fired.
	Notified bool `json:"notified,omitempty"`
}

// AlertList is a tenant's open incidents, firing first, and the ones it
// resolved last when asked for.
type AlertList struct {
	Open     []Incident `json:"open"`
	Resolved []Incident `json:"resolved,omitempty"`
}

// AlertRules are a tenant's alert rules and the webhooks its alerts go
// to.
type AlertRules struct {
	Rules    []AlertRule `json:"rules,omitempty"`
	Webhooks []Webhook   `json:"webhooks,omitempty"`
	// UpdatedAt and UpdatedBy say who set them last.
	UpdatedAt time.Time `json:"updated_at,omitzero"`
	UpdatedBy string    `json:"updated_by,omitempty"`
}

// AlertRule raises an incident for each thing of its kind that holds its
// condition for ForMinutes.
type AlertRule struct {
	Kind       string `json:"kind"`
	ForMinutes int    `json:"for_minutes,omitempty"`
	// Days is, for cert-expiry, how close to its end a box certificate is
	// worth an alert; 14 when 0.
	Days int `json:"days,omitempty"`
}

// Webhook is where alerts are posted as JSON, each signed with
// X-Edgebox-Signature: sha256=HMAC-SHA256(secret, body) when it has a
// secret. The secret is written, never read back (HasSecret); an update
// that names the URL without a secret keeps the one it had.
type Webhook struct {
	URL       string `json:"url"`
	Secret    string `json:"secret,omitempty"`
	HasSecret bool   `json:"has_secret,omitempty"`
}

// WebhookTests say what each webhook answered to a test notice.
type WebhookTests struct {
	Webhooks []WebhookTest `json:"webhooks"`
}

// WebhookTest is one webhook's answer: Error is empty when it took it.
type WebhookTest struct {
	URL   string `json:"url"`
	Error string `json:"error,omitempty"`
}

// Silence keeps the incidents it matches (its kind, box by ID or name,
// site: those it names) from the webhooks until Until.
type Silence struct {
	ID        string    `json:"id"`
	Kind      string    `json:"kind,omitempty"`
	Box       string    `json:"box,omitempty"`
	Site      string    `json:"site,omitempty"`
	Until     time.Time `json:"until"`
	Comment   string    `json:"comment,omitempty"`
	CreatedBy string    `json:"created_by,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// SilenceRequest asks for a silence For a duration ("2h").
type SilenceRequest struct {
	Kind    string `json:"kind,omitempty"`
	Box     string `json:"box,omitempty"`
	Site    string `json:"site,omitempty"`
	For     string `json:"for"`
	Comment string `json:"comment,omitempty"`
}

// SilenceList is a tenant's silences that have not ended.
type SilenceList struct {
	Silences []Silence `json:"silences"`
}

// Alerts returns the tenant's open incidents and the last resolved ones
// (at most 500).
func (c *Client) Alerts(ctx context.Context, resolved int) (AlertList, error) {
	var out AlertList
	p := "/api/v1/alerts"
	if resolved > 0 {
		p += "?resolved=" + strconv.Itoa(resolved)
	}
	err := c.do(ctx, http.MethodGet, p, nil, &out)
	return out, err
}

// GetAlertRules returns the tenant's alert rules.
func (c *Client) GetAlertRules(ctx context.Context) (AlertRules, error) {
	var out AlertRules
	err := c.do(ctx, http.MethodGet, "/api/v1/alert-rules", nil, &out)
	return out, err
}

// SetAlertRules replaces the tenant's alert rules.
func (c *Client) SetAlertRules(ctx context.Context, r AlertRules) (AlertRules, error) {
	var out AlertRules
	err := c.do(ctx, http.MethodPut, "/api/v1/alert-rules", r, &out)
	return out, err
}

// TestWebhooks posts a test notice to each of the tenant's webhooks.
func (c *Client) TestWebhooks(ctx context.Context) (WebhookTests, error) {
	var out WebhookTests
	err := c.do(ctx, http.MethodPost, "/api/v1/alert-rules/test", nil, &out)
	return out, err
}

// Silences returns the tenant's silences that have not ended.
func (c *Client) Silences(ctx context.Context) (SilenceList, error) {
	var out SilenceList
	err := c.do(ctx, http.MethodGet, "/api/v1/silences", nil, &out)
	return out, err
}

// Silence adds a silence.
func (c *Client) Silence(ctx context.Context, r SilenceRequest) (Silence, error) {
	var out Silence
	err := c.do(ctx, http.MethodPost, "/api/v1/silences", r, &out)
	return out, err
}

// Unsilence ends a silence now.
func (c *Client) Unsilence(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/api/v1/silences/"+url.PathEscape(id), nil, nil)
}
