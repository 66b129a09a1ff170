package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client calls the console API. Its zero value is not usable; use
// NewClient.
type Client struct {
	base   string
	token  string
	tenant string
	http   *http.Client
	tls    *tls.Config // for WebSockets, which do not go through http
}

// InTenant returns a client whose calls act in tenant, for users who hold
// roles in several; "" acts in the console's choice (the console's own
// tenant when the user holds a role there).
func (c *Client) InTenant(tenant string) *Client {
	cc := *c
	cc.tenant = tenant
	return &cc
}

// NewClient returns a client for the console at baseURL that trusts only
// the CA in caPEM and authenticates with token.
func NewClient(baseURL, token string, caPEM []byte) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("console URL %q must look like https://host:port", baseURL)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("no console CA certificate; run 'edgebox login' first")
	}
	tlsCfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
	tr := &http.Transport{
		TLSClientConfig:     tlsCfg.Clone(),
		ForceAttemptHTTP2:   true,
		TLSHandshakeTimeout: 10 * time.Second,
		Proxy:               http.ProxyFromEnvironment,
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), token: token, tls: tlsCfg,
		http: &http.Client{Transport: tr, Timeout: 60 * time.Second}}, nil
}

// StatusError is a failed call: the HTTP status and the console's message.
type StatusError struct {
	Status  int
	Message string
}

func (e *StatusError) Error() string { return e.Message }

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	return c.doWith(ctx, c.http, method, path, in, out)
}

func (c *Client) doWith(ctx context.Context, hc *http.Client, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	c.authorize(req)
	return c.send(hc, req, out)
}

// authorize adds the client's token and tenant to req.
func (c *Client) authorize(req *http.Request) {
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.tenant != "" {
		req.Header.Set("X-Edgebox-Tenant", c.tenant)
	}
}

// send sends req and reads the answer into out (nil: ignored), or the
// console's error.
func (c *Client) send(hc *http.Client, req *http.Request, out any) error {
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the console at %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return fmt.Errorf("reading the console's answer: %w", err)
	}
	if resp.StatusCode >= 300 {
		var e Error
		if json.Unmarshal(raw, &e) != nil || e.Error == "" {
			e.Error = fmt.Sprintf("console answered %s", resp.Status)
		}
		return &StatusError{Status: resp.StatusCode, Message: e.Error}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("the console's answer is not what this CLI expects (is it another version?): %w", err)
	}
	return nil
}

// Boxes lists boxes.
func (c *Client) Boxes(ctx context.Context) ([]Box, error) {
	var l BoxList
	err := c.do(ctx, http.MethodGet, "/api/v1/boxes", nil, &l)
	return l.Boxes, err
}

// Box gets one box by ID or name.
func (c *Client) Box(ctx context.Context, id string) (Box, error) {
	var b Box
	err := c.do(ctx, http.MethodGet, "/api/v1/boxes/"+url.PathEscape(id), nil, &b)
	return b, err
}

// Label sets labels on a box; an empty value removes one.
func (c *Client) Label(ctx context.Context, id string, labels map[string]string) (Box, error) {
	var b Box
	err := c.do(ctx, http.MethodPost, "/api/v1/boxes/"+url.PathEscape(id)+"/labels", LabelRequest{Labels: labels}, &b)
	return b, err
}

// Approve lets a waiting box in.
func (c *Client) Approve(ctx context.Context, id string) (Box, error) {
	var b Box
	err := c.do(ctx, http.MethodPost, "/api/v1/boxes/"+url.PathEscape(id)+"/approve", nil, &b)
	return b, err
}

// Revoke refuses a box from now on and drops its session.
func (c *Client) Revoke(ctx context.Context, id string) (Box, error) {
	var b Box
	err := c.do(ctx, http.MethodPost, "/api/v1/boxes/"+url.PathEscape(id)+"/revoke", nil, &b)
	return b, err
}

// RevokeWith revokes a box as Revoke does; with r.Wipe, the box is first
// told to wipe itself, and the call waits up to r.WipeTimeout for its
// answer, which the returned box's Wipe records.
func (c *Client) RevokeWith(ctx context.Context, id string, r RevokeRequest) (Box, error) {
	var b Box
	hc := c.http
	if r.Wipe {
		wait := 30 * time.Second
		if r.WipeTimeout != "" {
			d, err := time.ParseDuration(r.WipeTimeout)
			if err != nil {
				return b, fmt.Errorf("wipe timeout %q: %v", r.WipeTimeout, err)
			}
			wait = d
		}
		// The console answers once the box did, or the wait ran out.
		long := *c.http
		long.Timeout = max(long.Timeout, wait+30*time.Second)
		hc = &long
	}
	err := c.doWith(ctx, hc, http.MethodPost, "/api/v1/boxes/"+url.PathEscape(id)+"/revoke", r, &b)
	return b, err
}

// CreateToken creates an enrollment token.
func (c *Client) CreateToken(ctx context.Context, r TokenRequest) (CreatedToken, error) {
	var t CreatedToken
	err := c.do(ctx, http.MethodPost, "/api/v1/tokens", r, &t)
	return t, err
}

// Tokens lists enrollment tokens.
func (c *Client) Tokens(ctx context.Context) ([]Token, error) {
	var l TokenList
	err := c.do(ctx, http.MethodGet, "/api/v1/tokens", nil, &l)
	return l.Tokens, err
}

// RevokeToken stops a token from enrolling more boxes.
func (c *Client) RevokeToken(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/api/v1/tokens/"+url.PathEscape(id), nil, nil)
}

// Audit lists the newest audit entries, oldest first.
func (c *Client) Audit(ctx context.Context, limit int, target string) ([]AuditEntry, error) {
	return c.AuditQuery(ctx, AuditQuery{Limit: limit, Target: target})
}

// AuditQuery picks audit entries: the newest Limit (at most 1,000) of
// those matching, oldest first.
type AuditQuery struct {
	Limit                 int
	Target, Actor, Action string // Action: a prefix
	Since, Until          time.Time
}

// AuditQuery lists the audit entries q picks.
func (c *Client) AuditQuery(ctx context.Context, aq AuditQuery) ([]AuditEntry, error) {
	q := url.Values{}
	if aq.Limit > 0 {
		q.Set("limit", strconv.Itoa(aq.Limit))
	}
	for k, v := range map[string]string{"target": aq.Target, "actor": aq.Actor, "action": aq.Action} {
		if v != "" {
			q.Set(k, v)
		}
	}
	for k, v := range map[string]time.Time{"since": aq.Since, "until": aq.Until} {
		if !v.IsZero() {
			q.Set(k, v.Format(time.RFC3339Nano))
		}
	}
	var l AuditList
	err := c.do(ctx, http.MethodGet, "/api/v1/audit?"+q.Encode(), nil, &l)
	return l.Entries, err
}

// BoxState reads a box's desired state and its status.
func (c *Client) BoxState(ctx context.Context, box string) (BoxState, error) {
	var s BoxState
	err := c.do(ctx, http.MethodGet, "/api/v1/boxes/"+url.PathEscape(box)+"/state", nil, &s)
	return s, err
}

// PutDesired writes one desired object of a box; spec is the kind's spec
// in protobuf JSON. It returns the box revision of the change.
func (c *Client) PutDesired(ctx context.Context, box, kind, name string, spec json.RawMessage) (uint64, error) {
	var r Revision
	err := c.do(ctx, http.MethodPut, desiredPath(box, kind, name), spec, &r)
	return r.Revision, err
}

// DeleteDesired deletes one desired object of a box.
func (c *Client) DeleteDesired(ctx context.Context, box, kind, name string) (uint64, error) {
	var r Revision
	err := c.do(ctx, http.MethodDelete, desiredPath(box, kind, name), nil, &r)
	return r.Revision, err
}

func desiredPath(box, kind, name string) string {
	return "/api/v1/boxes/" + url.PathEscape(box) + "/desired/" + url.PathEscape(kind) + "/" + url.PathEscape(name)
}

// CreateApp adds an app.
func (c *Client) CreateApp(ctx context.Context, name, description string) (App, error) {
	var a App
	err := c.do(ctx, http.MethodPost, "/api/v1/apps", App{Name: name, Description: description}, &a)
	return a, err
}

// Apps lists the apps.
func (c *Client) Apps(ctx context.Context) ([]App, error) {
	var l AppList
	err := c.do(ctx, http.MethodGet, "/api/v1/apps", nil, &l)
	return l.Apps, err
}

// DeleteApp removes an app that is deployed nowhere.
func (c *Client) DeleteApp(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, appPath(name), nil, nil)
}

// CreateRelease adds a release to an app.
func (c *Client) CreateRelease(ctx context.Context, app string, spec ReleaseSpec) (Release, error) {
	var r Release
	err := c.do(ctx, http.MethodPost, appPath(app)+"/releases", spec, &r)
	return r, err
}

// Releases lists an app's releases, oldest first.
func (c *Client) Releases(ctx context.Context, app string) ([]Release, error) {
	var l ReleaseList
	err := c.do(ctx, http.MethodGet, appPath(app)+"/releases", nil, &l)
	return l.Releases, err
}

// Pins lists where an app is deployed.
func (c *Client) Pins(ctx context.Context, app string) ([]Pin, error) {
	var l PinList
	err := c.do(ctx, http.MethodGet, appPath(app)+"/pins", nil, &l)
	return l.Pins, err
}

// Deploy pins app@version on a scope ("region", "site" or "box").
func (c *Client) Deploy(ctx context.Context, app, version, scope, target string) (DeployResult, error) {
	var r DeployResult
	err := c.do(ctx, http.MethodPut, pinPath(app, scope, target), DeployRequest{Version: version}, &r)
	return r, err
}

// Undeploy removes app's pin on a scope.
func (c *Client) Undeploy(ctx context.Context, app, scope, target string) (DeployResult, error) {
	var r DeployResult
	err := c.do(ctx, http.MethodDelete, pinPath(app, scope, target), nil, &r)
	return r, err
}

// AppStatus reports, per box, the desired and running release of app.
func (c *Client) AppStatus(ctx context.Context, app string) (AppStatus, error) {
	var s AppStatus
	err := c.do(ctx, http.MethodGet, appPath(app)+"/status", nil, &s)
	return s, err
}

// Logs fetches the last tail lines of a workload on a box.
func (c *Client) Logs(ctx context.Context, box, workload string, tail int) (Logs, error) {
	var l Logs
	path := "/api/v1/boxes/" + url.PathEscape(box) + "/workloads/" + url.PathEscape(workload) + "/logs?tail=" + strconv.Itoa(tail)
	err := c.do(ctx, http.MethodGet, path, nil, &l)
	return l, err
}

func appPath(app string) string { return "/api/v1/apps/" + url.PathEscape(app) }

func pinPath(app, scope, target string) string {
	return appPath(app) + "/pins/" + url.PathEscape(scope) + "/" + url.PathEscape(target)
}

// Keys lists keys, of one box and with the given labels when set.
func (c *Client) Keys(ctx context.Context, box string, labels map[string]string) ([]Key, error) {
	q := url.Values{}
	if box != "" {
		q.Set("box", box)
	}
	for k, v := range labels {
		q.Add("label", k+"="+v)
	}
	var l KeyList
	err := c.do(ctx, http.MethodGet, "/api/v1/keys?"+q.Encode(), nil, &l)
	return l.Keys, err
}

// LabelKey sets labels of a key; an empty value removes a label.
func (c *Client) LabelKey(ctx context.Context, id string, labels map[string]string) (Key, error) {
	var k Key
	err := c.do(ctx, http.MethodPost, keyPath(id)+"/labels", LabelRequest{Labels: labels}, &k)
	return k, err
}

// Lease leases a key to a workload on its box.
func (c *Client) Lease(ctx context.Context, id, workload string) (Key, error) {
	return c.Attach(ctx, id, workload, "")
}

// Attach leases a key to a workload on box (ID or name), which may be
// another box than the key's: the key is then used from there.
func (c *Client) Attach(ctx context.Context, id, workload, box string) (Key, error) {
	var k Key
	err := c.do(ctx, http.MethodPost, keyPath(id)+"/lease", LeaseRequest{Workload: workload, Box: box}, &k)
	return k, err
}

// Release ends a key's lease.
func (c *Client) Release(ctx context.Context, id string) (Key, error) {
	var k Key
	err := c.do(ctx, http.MethodPost, keyPath(id)+"/release", nil, &k)
	return k, err
}

// KeyHistory returns a key's history, oldest first.
func (c *Client) KeyHistory(ctx context.Context, id string) (KeyHistory, error) {
	var h KeyHistory
	err := c.do(ctx, http.MethodGet, keyPath(id)+"/history", nil, &h)
	return h, err
}

func keyPath(id string) string { return "/api/v1/keys/" + url.PathEscape(id) }

// Login checks a user's password and returns a new API token of that
// user, named name, ending after ttl ("" never). The client needs no token
// for it.
func (c *Client) Login(ctx context.Context, user, password, name, ttl string) (Me, error) {
	var me Me
	err := c.do(ctx, http.MethodPost, "/api/v1/login", LoginRequest{User: user, Password: password, TokenName: name, TokenTTL: ttl}, &me)
	return me, err
}

// Me says who the client's token belongs to, and its roles.
func (c *Client) Me(ctx context.Context) (Me, error) {
	var me Me
	err := c.do(ctx, http.MethodGet, "/api/v1/me", nil, &me)
	return me, err
}

// ChangePassword changes the caller's own password.
func (c *Client) ChangePassword(ctx context.Context, old, password string) error {
	return c.do(ctx, http.MethodPost, "/api/v1/me/password", PasswordRequest{Old: old, Password: password}, nil)
}

// LogOutEverywhere ends every browser session of the caller.
func (c *Client) LogOutEverywhere(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/api/v1/logout/everywhere", nil, nil)
}

// Users lists the users of the client's tenant.
func (c *Client) Users(ctx context.Context) ([]User, error) {
	var out []User
	err := c.do(ctx, http.MethodGet, "/api/v1/users", nil, &out)
	return out, err
}

// CreateUser makes a user with a role in the client's tenant.
func (c *Client) CreateUser(ctx context.Context, r UserRequest) (User, error) {
	var u User
	err := c.do(ctx, http.MethodPost, "/api/v1/users", r, &u)
	return u, err
}

// SetRole sets a user's role in the client's tenant; "" takes it away.
func (c *Client) SetRole(ctx context.Context, name, role string) (User, error) {
	var u User
	err := c.do(ctx, http.MethodPut, "/api/v1/users/"+url.PathEscape(name)+"/role", RoleRequest{Role: role}, &u)
	return u, err
}

// SetPassword sets another user's password.
func (c *Client) SetPassword(ctx context.Context, name, password string) error {
	return c.do(ctx, http.MethodPut, "/api/v1/users/"+url.PathEscape(name)+"/password", PasswordRequest{Password: password}, nil)
}

// DeleteUser takes a user's role in the client's tenant away, and deletes
// the user when it was its last.
func (c *Client) DeleteUser(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/api/v1/users/"+url.PathEscape(name), nil, nil)
}

// APITokens lists the caller's API tokens.
func (c *Client) APITokens(ctx context.Context) ([]APIToken, error) {
	var out []APIToken
	err := c.do(ctx, http.MethodGet, "/api/v1/apitokens", nil, &out)
	return out, err
}

// CreateAPIToken makes an API token of the caller's.
func (c *Client) CreateAPIToken(ctx context.Context, r APITokenRequest) (APIToken, error) {
	var t APIToken
	err := c.do(ctx, http.MethodPost, "/api/v1/apitokens", r, &t)
	return t, err
}

// RevokeAPIToken ends one of the caller's API tokens.
func (c *Client) RevokeAPIToken(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/api/v1/apitokens/"+url.PathEscape(id), nil, nil)
}

// Tenants lists the tenants the caller works in.
func (c *Client) Tenants(ctx context.Context) ([]Tenant, error) {
	var out []Tenant
	err := c.do(ctx, http.MethodGet, "/api/v1/tenants", nil, &out)
	return out, err
}

// CreateTenant makes a tenant.
func (c *Client) CreateTenant(ctx context.Context, id, name string) (Tenant, error) {
	var t Tenant
	err := c.do(ctx, http.MethodPost, "/api/v1/tenants", Tenant{ID: id, Name: name}, &t)
	return t, err
}

// CreateRollout starts a rollout.
func (c *Client) CreateRollout(ctx context.Context, r RolloutRequest) (Rollout, error) {
	var out Rollout
	err := c.do(ctx, http.MethodPost, "/api/v1/rollouts", r, &out)
	return out, err
}

// Rollouts lists the tenant's rollouts, newest first, without their
// boxes.
func (c *Client) Rollouts(ctx context.Context) ([]Rollout, error) {
	var l RolloutList
	err := c.do(ctx, http.MethodGet, "/api/v1/rollouts", nil, &l)
	return l.Rollouts, err
}

// Rollout returns one rollout with its boxes.
func (c *Client) Rollout(ctx context.Context, id string) (Rollout, error) {
	var out Rollout
	err := c.do(ctx, http.MethodGet, "/api/v1/rollouts/"+url.PathEscape(id), nil, &out)
	return out, err
}

// RolloutDo pauses, resumes, aborts or approves a rollout (action is
// "pause", "resume", "abort" or "approve").
func (c *Client) RolloutDo(ctx context.Context, id, action string, a RolloutAction) (Rollout, error) {
	var out Rollout
	err := c.do(ctx, http.MethodPost, "/api/v1/rollouts/"+url.PathEscape(id)+"/"+url.PathEscape(action), a, &out)
	return out, err
}

// RolloutRules returns the tenant's rollout rules.
func (c *Client) RolloutRules(ctx context.Context) (RolloutRules, error) {
	var out RolloutRules
	err := c.do(ctx, http.MethodGet, "/api/v1/rollout-rules", nil, &out)
	return out, err
}

// SetRolloutRules replaces the tenant's rollout rules.
func (c *Client) SetRolloutRules(ctx context.Context, r RolloutRules) (RolloutRules, error) {
	var out RolloutRules
	err := c.do(ctx, http.MethodPut, "/api/v1/rollout-rules", r, &out)
	return out, err
}

// UploadAgentRelease uploads version's binary for platform ("linux/amd64")
// from r; probation, when set, is how long boxes run the version on
// trial (a Go duration; the release's first binary sets it).
func (c *Client) UploadAgentRelease(ctx context.Context, version, platform, probation string, r io.Reader) (AgentRelease, error) {
	var out AgentRelease
	goos, goarch, _ := strings.Cut(platform, "/")
	path := "/api/v1/agent-releases/" + url.PathEscape(version) + "/binaries/" + url.PathEscape(goos) + "/" + url.PathEscape(goarch)
	if probation != "" {
		path += "?probation=" + url.QueryEscape(probation)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.base+path, r)
	if err != nil {
		return out, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	c.authorize(req)
	return out, c.send(c.http, req, &out)
}

// AgentReleases lists the agent releases, newest first.
func (c *Client) AgentReleases(ctx context.Context) ([]AgentRelease, error) {
	var l AgentReleaseList
	err := c.do(ctx, http.MethodGet, "/api/v1/agent-releases", nil, &l)
	return l.Releases, err
}

// AgentPins lists the tenant's agent pins.
func (c *Client) AgentPins(ctx context.Context) ([]AgentPin, error) {
	var l AgentPinList
	err := c.do(ctx, http.MethodGet, "/api/v1/agent-pins", nil, &l)
	return l.Pins, err
}

// PinAgent pins the agent of a region, site or box to version.
func (c *Client) PinAgent(ctx context.Context, version, scope, target string) error {
	return c.do(ctx, http.MethodPut, "/api/v1/agent-pins/"+url.PathEscape(scope)+"/"+url.PathEscape(target), AgentPin{Version: version}, nil)
}

// UnpinAgent removes an agent pin.
func (c *Client) UnpinAgent(ctx context.Context, scope, target string) error {
	return c.do(ctx, http.MethodDelete, "/api/v1/agent-pins/"+url.PathEscape(scope)+"/"+url.PathEscape(target), nil, nil)
}
