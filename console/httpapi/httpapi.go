// Package httpapi is the console's HTTP API under /api/v1, served with gin
// on the console's one public port. Every call but enrollment, the CA and
// the health check needs a bearer API token; every error is JSON with a
// message written for the operator; every mutating call is audited.
package httpapi

import (
	"context"
	"encoding/csv"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console/agentrel"
	"github.com/edgebox/edgebox/console/alerts"
	"github.com/edgebox/edgebox/console/apps"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/auth"
	"github.com/edgebox/edgebox/console/boxvitals"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/console/dist"
	"github.com/edgebox/edgebox/console/events"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/keys"
	"github.com/edgebox/edgebox/console/pki"
	"github.com/edgebox/edgebox/console/presence"
	"github.com/edgebox/edgebox/console/rollout"
	"github.com/edgebox/edgebox/console/sessions"
	"github.com/edgebox/edgebox/console/sitehealth"
	"github.com/edgebox/edgebox/enroll"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/images/registry"
	"github.com/edgebox/edgebox/scripts"
)

// Sessions is the console's view of live tunnels.
type Sessions interface {
	Presence(boxID string) presence.Status
	// Drop closes a box's session and all its streams at once.
	Drop(boxID string) bool
}

// Replicas forwards a call for a box whose tunnel another console
// replica holds to that replica.
type Replicas interface {
	// Forward serves r on the replica that holds box's tunnel when
	// another does, and reports whether it did.
	Forward(w http.ResponseWriter, r *http.Request, box string) bool
	// ForwardTo serves r on the replica named, when it is another that
	// runs, and reports whether it did.
	ForwardTo(w http.ResponseWriter, r *http.Request, replica string) bool
}

// NewLatency is the API's latency histogram,
// edgebox_api_request_seconds by method, route (its pattern, such as
// /api/v1/boxes/:id) and status class, registered with reg.
func NewLatency(reg prometheus.Registerer) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "edgebox", Subsystem: "api", Name: "request_seconds",
		Help:    "Time to answer an API call, by method, route and status class.",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}}, []string{"method", "route", "code"})
	reg.MustRegister(h)
	return h
}

// timed records each call's time in h. Routes nothing matched count as
// one route, so a scan of random paths adds no series.
func timed(h *prometheus.HistogramVec) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		c.Next()
		route := c.FullPath()
		if route == "" {
			route = "unmatched"
		}
		if strings.HasPrefix(route, "/v2/") {
			route = "/v2/*path"
		}
		code := strconv.Itoa(c.Writer.Status()/100) + "xx"
		method := c.Request.Method
		switch method {
		case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions:
		default:
			method = "other" // any word is a method: no series for each
		}
		h.WithLabelValues(method, route, code).Observe(time.Since(start).Seconds())
	}
}

// Sites is site health as the API shows it.
type Sites interface {
	Health(ctx context.Context, b fleet.Box) (state sitehealth.State, detail string)
	// RanUntil is the latest time its site's votes show box running.
	RanUntil(box string) time.Time
}

// Deps are the parts the API serves.
type Deps struct {
	Fleet    *fleet.Fleet
	Audit    *audit.Log
	Tokens   *auth.Tokens
	Users    *auth.Users
	Throttle *auth.Throttle
	// SessionTTL is how long a browser session lasts.
	SessionTTL time.Duration
	PKI        *pki.Authority
	Sessions   Sessions
	// Replicas forwards calls that need a box's tunnel to the console
	// replica that holds it; nil when the console runs alone.
	Replicas Replicas
	// Sites judges boxes without a tunnel by their site's votes; nil
	// judges none.
	Sites Sites
	// Vitals are the boxes' latest figures of themselves; nil shows none.
	Vitals interface {
		Get(box string) (boxvitals.Report, bool)
	}
	// Latency, when set, times every call (NewLatency).
	Latency   *prometheus.HistogramVec
	Desired   *desired.State
	Downloads *dist.Dir
	// Registry is the console's OCI registry, served at /v2/ to operators.
	Registry *registry.Registry
	// RegistryHosts are the names images give the console's registry.
	RegistryHosts []string
	Apps          *apps.Apps
	Agents        Agents
	Keys          *keys.Registry
	Rollouts      *rollout.Service
	AgentReleases *agentrel.Service
	// RemoteSessions brokers shells and commands on boxes.
	RemoteSessions *sessions.Broker
	// Alerts keeps the tenants' alert rules, incidents and silences.
	Alerts     *alerts.Service
	ConsoleURL string
	// ConsoleAlso are the console's other addresses (host:port) new
	// enrollment tokens name; see Config.AlsoAddrs.
	ConsoleAlso []string
	BoxCertTTL  time.Duration
	Metrics     http.Handler
	// Events tells web pages what changed; nil serves no event stream.
	Events *events.Hub
	// WebUI serves the web console on every path that is not the API's
	// or the registry's; nil serves none.
	WebUI http.Handler
	Log   *slog.Logger
}

type server struct{ Deps }

// New returns the API handler.
func New(d Deps) http.Handler {
	gin.SetMode(gin.ReleaseMode)
	s := &server{d}
	r := gin.New()
	// The caller's address is the connection's: no header a caller
	// sends can change it (the login throttle and the audit count on
	// it). A call another replica forwards carries its caller's address
	// in a header the replica listener alone reads.
	r.SetTrustedProxies(nil)
	r.Use(gin.Recovery())
	if d.Latency != nil {
		r.Use(timed(d.Latency))
	}
	r.HandleMethodNotAllowed = true
	r.NoRoute(func(c *gin.Context) {
		p := c.Request.URL.Path
		if d.WebUI != nil && !strings.HasPrefix(p, "/api/") && !strings.HasPrefix(p, "/v2/") {
			d.WebUI.ServeHTTP(c.Writer, c.Request)
			return
		}
		fail(c, errdefs.NotFound("no such API path %s", p))
	})
	r.NoMethod(func(c *gin.Context) {
		c.AbortWithStatusJSON(http.StatusMethodNotAllowed, api.Error{Error: "method " + c.Request.Method + " not allowed here"})
	})
	r.GET("/healthz", func(c *gin.Context) { c.String(http.StatusOK, "ok\n") })
	r.GET("/api/v1/ca", s.ca)
	r.POST(enroll.Path, s.enroll)
	r.GET("/install.sh", s.installScript)
	r.GET("/install.ps1", s.installScript)
	r.GET("/dl/:file", s.download)
	if d.Registry != nil {
		r.Any("/v2/*path", s.registry)
	}

	r.POST("/api/v1/login", s.login)

	a := r.Group("/", s.authenticate, s.auditFailures)
	for _, rt := range s.routes() {
		a.Handle(rt.method, rt.path, need(rt.perm), rt.h)
	}
	return r
}

// route is one authenticated API route and what a caller's role must
// allow for it.
type route struct {
	method, path string
	perm         auth.Permission
	h            gin.HandlerFunc
}

// routes lists every authenticated route. A route's permission is checked
// before its handler runs; the handler then sees only the call's tenant.
func (s *server) routes() []route {
	const v1 = "/api/v1"
	return []route{
		{"GET", "/metrics", manageConsole, gin.WrapH(s.Metrics)},
		{"GET", "/debug/pprof/:name", manageConsole, func(c *gin.Context) {
			switch c.Param("name") {
			case "profile": // CPU, for ?seconds=N
				pprof.Profile(c.Writer, c.Request)
				return
			case "trace": // the execution trace, for ?seconds=N
				pprof.Trace(c.Writer, c.Request)
				return
			}
			pprof.Handler(c.Param("name")).ServeHTTP(c.Writer, c.Request)
		}},

		{"GET", v1 + "/me", anyone, s.me},
		{"GET", v1 + "/events", auth.Read, s.events},
		{"POST", v1 + "/me/password", anyone, s.changeOwnPassword},
		{"POST", v1 + "/logout", anyone, s.logout},
		{"POST", v1 + "/logout/everywhere", anyone, s.logoutEverywhere},
		{"GET", v1 + "/apitokens", anyone, s.listAPITokens},
		{"POST", v1 + "/apitokens", anyone, s.createAPIToken},
		{"DELETE", v1 + "/apitokens/:id", anyone, s.revokeAPIToken},
		{"GET", v1 + "/tenants", anyone, s.listTenants},
		{"POST", v1 + "/tenants", manageConsole, s.createTenant},

		{"GET", v1 + "/users", auth.Administer, s.listUsers},
		{"POST", v1 + "/users", auth.Administer, s.createUser},
		{"PUT", v1 + "/users/:name/role", auth.Administer, s.setRole},
		{"PUT", v1 + "/users/:name/password", auth.Administer, s.setPassword},
		{"DELETE", v1 + "/users/:name", auth.Administer, s.deleteUser},
		{"GET", v1 + "/users/:name/apitokens", auth.Administer, s.listUserTokens},
		{"DELETE", v1 + "/users/:name/apitokens/:id", auth.Administer, s.revokeUserToken},

		{"GET", v1 + "/boxes", auth.Read, s.listBoxes},
		{"GET", v1 + "/boxes/:id", auth.Read, s.getBox},
		{"POST", v1 + "/boxes/:id/labels", auth.Operate, s.labelBox},
		{"POST", v1 + "/boxes/:id/approve", auth.Operate, s.approveBox},
		{"POST", v1 + "/boxes/:id/revoke", auth.Administer, s.live(s.revokeBox)},
		{"GET", v1 + "/boxes/:id/state", auth.Read, s.boxState},
		{"PUT", v1 + "/boxes/:id/desired/:kind/:name", auth.Operate, s.putDesired},
		{"DELETE", v1 + "/boxes/:id/desired/:kind/:name", auth.Operate, s.deleteDesired},
		{"GET", v1 + "/boxes/:id/workloads/:name/logs", auth.Read, s.live(s.workloadLogs)},
		{"GET", v1 + "/boxes/:id/exec", auth.Maintain, s.live(s.openSession)},
		{"GET", v1 + "/boxes/:id/forward", auth.Maintain, s.live(s.openForward)},
		{"GET", v1 + "/boxes/:id/workloads/:name/screen", auth.Maintain, s.live(s.openScreen)},
		{"POST", v1 + "/boxes/:id/session-requests", auth.Maintain, s.live(s.askSession)},
		{"GET", v1 + "/boxes/:id/web/:port/*path", auth.Maintain, s.live(s.boxWeb)},
		{"HEAD", v1 + "/boxes/:id/web/:port/*path", auth.Maintain, s.live(s.boxWeb)},
		// The same, in a tenant the path names: a page's own links and
		// subresources keep it, where a query would be lost.
		{"GET", v1 + "/tenants/:tenant/boxes/:id/web/:port/*path", auth.Maintain, s.live(s.boxWeb)},
		{"HEAD", v1 + "/tenants/:tenant/boxes/:id/web/:port/*path", auth.Maintain, s.live(s.boxWeb)},
		{"GET", v1 + "/boxes/:id/files", auth.Maintain, s.live(s.readFile)},
		{"GET", v1 + "/boxes/:id/files/stat", auth.Maintain, s.live(s.statFile)},
		{"PUT", v1 + "/boxes/:id/files", auth.Maintain, s.live(s.writeFile)},

		{"GET", v1 + "/sessions", auth.Read, s.listSessions},
		{"GET", v1 + "/sessions/:sid", auth.Read, s.getSession},
		{"POST", v1 + "/sessions/:sid/end", auth.Maintain, s.sessionsReplica(s.endSession)},
		{"GET", v1 + "/sessions/:sid/recording", auth.Audit, s.sessionRecording},
		{"GET", v1 + "/sessions/:sid/recording/verify", auth.Audit, s.verifySession},
		{"POST", v1 + "/sessions/:sid/approve", auth.Maintain, s.sessionsReplica(s.approveSession)},
		{"GET", v1 + "/sessions/:sid/watch", auth.Maintain, s.sessionsReplica(s.watchSession)},
		{"GET", v1 + "/session-rules", auth.Read, s.getSessionRules},
		{"PUT", v1 + "/session-rules", auth.Administer, s.setSessionRules},

		{"GET", v1 + "/apps", auth.Read, s.listApps},
		{"POST", v1 + "/apps", auth.Operate, s.createApp},
		{"GET", v1 + "/apps/:app", auth.Read, s.getApp},
		{"DELETE", v1 + "/apps/:app", auth.Operate, s.deleteApp},
		{"GET", v1 + "/apps/:app/releases", auth.Read, s.listReleases},
		{"POST", v1 + "/apps/:app/releases", auth.Operate, s.createRelease},
		{"GET", v1 + "/apps/:app/pins", auth.Read, s.listPins},
		{"PUT", v1 + "/apps/:app/pins/:scope/:target", auth.Operate, s.deploy},
		{"GET", v1 + "/apps/:app/pins/:scope/:target/preview", auth.Operate, s.previewDeploy},
		{"DELETE", v1 + "/apps/:app/pins/:scope/:target", auth.Operate, s.undeploy},
		{"GET", v1 + "/apps/:app/status", auth.Read, s.appStatus},

		{"GET", v1 + "/rollouts", auth.Read, s.listRollouts},
		{"POST", v1 + "/rollouts", auth.Operate, s.createRollout},
		{"GET", v1 + "/rollouts/:id", auth.Read, s.getRollout},
		{"POST", v1 + "/rollouts/:id/:action", auth.Operate, s.rolloutAction},
		{"GET", v1 + "/rollout-rules", auth.Read, s.getRolloutRules},
		{"PUT", v1 + "/rollout-rules", auth.Administer, s.setRolloutRules},

		{"GET", v1 + "/agent-releases", auth.Read, s.listAgentReleases},
		{"GET", v1 + "/agent-releases/:version", auth.Read, s.getAgentRelease},
		{"PUT", v1 + "/agent-releases/:version/binaries/:os/:arch", manageConsole, s.uploadAgentRelease},
		{"GET", v1 + "/agent-pins", auth.Read, s.listAgentPins},
		{"PUT", v1 + "/agent-pins/:scope/:target", auth.Operate, s.pinAgent},
		{"DELETE", v1 + "/agent-pins/:scope/:target", auth.Operate, s.unpinAgent},

		{"GET", v1 + "/keys", auth.Read, s.listKeys},
		{"GET", v1 + "/keys/:key", auth.Read, s.getKey},
		{"POST", v1 + "/keys/:key/labels", auth.Operate, s.labelKey},
		{"POST", v1 + "/keys/:key/lease", auth.Operate, s.leaseKey},
		{"POST", v1 + "/keys/:key/release", auth.Operate, s.releaseKey},
		{"GET", v1 + "/keys/:key/history", auth.Read, s.keyHistory},

		{"GET", v1 + "/tokens", auth.Administer, s.listTokens},
		{"POST", v1 + "/tokens", auth.Administer, s.createToken},
		{"DELETE", v1 + "/tokens/:id", auth.Administer, s.revokeToken},

		{"GET", v1 + "/audit", auth.Audit, s.listAudit},

		{"GET", v1 + "/alerts", auth.Read, s.listAlerts},
		{"GET", v1 + "/alert-rules", auth.Read, s.getAlertRules},
		{"PUT", v1 + "/alert-rules", auth.Administer, s.setAlertRules},
		{"POST", v1 + "/alert-rules/test", auth.Administer, s.testAlertRules},
		{"GET", v1 + "/silences", auth.Read, s.listSilences},
		{"POST", v1 + "/silences", auth.Operate, s.createSilence},
		{"DELETE", v1 + "/silences/:id", auth.Operate, s.deleteSilence},
	}
}

// Status maps the error vocabulary to HTTP; it is the only place that does.
// An error's kind is its outermost one (errdefs.Kind).
func Status(err error) int {
	switch errdefs.Kind(err) {
	case errdefs.ErrNotFound:
		return http.StatusNotFound
	case errdefs.ErrConflict:
		return http.StatusConflict
	case errdefs.ErrInvalid:
		return http.StatusBadRequest
	case errdefs.ErrPermission:
		return http.StatusForbidden
	case errdefs.ErrUnavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

func (s *server) fail(c *gin.Context, err error) { fail(c, err); s.logInternal(c, err) }

func (s *server) logInternal(c *gin.Context, err error) {
	if Status(err) == http.StatusInternalServerError {
		s.Log.Error("API call failed", "path", c.FullPath(), "err", err)
	}
}

func fail(c *gin.Context, err error) {
	code := Status(err)
	msg := err.Error()
	if code == http.StatusInternalServerError {
		msg = "the console failed to do this; its log says why"
	}
	c.AbortWithStatusJSON(code, api.Error{Error: msg})
}

// auditFailures records refused or failed mutating calls; successful ones
// are audited by the change itself, in the same transaction.
func (s *server) auditFailures(c *gin.Context) {
	c.Next()
	if c.Request.Method == http.MethodGet || c.Writer.Status() < 400 {
		return
	}
	who := caller(c)
	msg := c.Errors.String()
	if msg == "" {
		msg = http.StatusText(c.Writer.Status())
	}
	s.record(c, audit.Entry{TenantID: who.TenantID, Actor: who.Name, Remote: who.Remote,
		Action: c.Request.Method + " " + c.FullPath(), Target: c.Param("id"), Result: "failed: " + msg})
}

func (s *server) ca(c *gin.Context) {
	c.Data(http.StatusOK, "application/x-pem-file", s.PKI.CAPEM())
}

func (s *server) enroll(c *gin.Context) {
	req, tok, csr, err := enroll.DecodeRequest(http.MaxBytesReader(c.Writer, c.Request.Body, enroll.MaxRequestBytes))
	if err != nil {
		fail(c, err)
		return
	}
	if tok.CAHash != s.PKI.CAHash() {
		fail(c, errdefs.Permission("this enrollment token was made by another console"))
		return
	}
	box, cert, err := s.Fleet.Enroll(c.Request.Context(), fleet.Enrollment{
		Token: tok, Hostname: req.Hostname, Name: req.Name, Labels: req.Labels, Remote: c.ClientIP(),
		Issue: func(id string) ([]byte, time.Time, error) { return s.PKI.SignBox(csr, id, s.BoxCertTTL) },
	})
	if err != nil {
		s.fail(c, err)
		return
	}
	s.Log.Info("box enrolled", "box_id", box.ID, "name", box.Name, "state", box.State)
	c.JSON(http.StatusOK, enroll.Response{BoxID: box.ID, Name: box.Name, CertificatePEM: string(cert),
		CAPEM: string(s.PKI.CAPEM()), Pending: box.State == fleet.StatePending})
}

func (s *server) view(ctx context.Context, b fleet.Box) api.Box {
	p := s.Sessions.Presence(b.ID)
	v := api.Box{ID: b.ID, Name: b.Name, TenantID: b.TenantID, Region: b.Region, Site: b.Site, Labels: b.Labels,
		State: string(b.State), Online: p.Online, Hostname: b.Hostname, OS: b.OS, Arch: b.Arch,
		OSVersion: b.OSVersion, AgentVersion: b.AgentVersion, Capability: b.Capability, CPUs: b.CPUs,
		MemoryBytes: b.MemoryBytes, EnrolledAt: b.EnrolledAt, CertNotAfter: b.CertNotAfter, Wipe: wipeView(b.Wipe)}
	switch {
	case s.Sites != nil && b.State == fleet.StateApproved:
		st, detail := s.Sites.Health(ctx, b)
		v.Health, v.HealthDetail = string(st), detail
		if at := s.Sites.RanUntil(b.ID); !at.IsZero() {
			at = at.UTC()
			v.RanUntil = &at
		}
	case p.Online:
		v.Health = string(sitehealth.Online)
	}
	if s.Vitals != nil {
		if r, ok := s.Vitals.Get(b.ID); ok {
			x := r.Vitals
			at := r.At.UTC()
			v.Vitals = &api.BoxVitals{CPUPercent: float64(x.GetCpuPercent()), MemoryUsedBytes: x.GetMemoryUsedBytes(),
				MemoryTotalBytes: x.GetMemoryTotalBytes(), DiskUsedBytes: x.GetDiskUsedBytes(), DiskTotalBytes: x.GetDiskTotalBytes(),
				TemperatureCelsius: float64(x.GetTemperatureCelsius()), UptimeSeconds: x.GetUptimeSeconds(), ReportedAt: at}
		}
	}
	if p.Online {
		v.RTTMillis = float64(p.RTT.Microseconds()) / 1000
		v.Address, v.Replica = p.Address, p.Replica
		if !p.ConnectedAt.IsZero() {
			at := p.ConnectedAt.UTC()
			v.ConnectedAt = &at
		}
	}
	seen := b.LastSeen
	if p.LastSeen.After(seen) {
		seen = p.LastSeen
	}
	if !seen.IsZero() {
		seen = seen.UTC()
		v.LastSeen = &seen
	}
	return v
}

// findBox accepts a box ID or a unique name in the path's :id.
// live serves a call that needs the box's tunnel (logs, sessions, files,
// a box's web pages) where the tunnel is: on the replica that holds it,
// when another does.
func (s *server) live(h gin.HandlerFunc) gin.HandlerFunc {
	if s.Replicas == nil {
		return h
	}
	return func(c *gin.Context) {
		b, ok := s.findBox(c)
		if !ok {
			return
		}
		if s.Replicas.Forward(c.Writer, c.Request, b.ID) {
			c.Abort()
			return
		}
		c.Set(foundBox, b) // the handler's findBox reads no record again
		h(c)
	}
}

// foundBox is the gin key of the box live found.
const foundBox = "edgebox.box"

// sessionsReplica serves a call about a live remote session on the
// replica the session runs on, when another one runs it: its end, its
// approval and watching it need the session itself.
func (s *server) sessionsReplica(h gin.HandlerFunc) gin.HandlerFunc {
	if s.Replicas == nil {
		return h
	}
	return func(c *gin.Context) {
		r, err := s.RemoteSessions.Get(c.Request.Context(), caller(c).TenantID, c.Param("sid"))
		if err == nil && r.Live() && s.Replicas.ForwardTo(c.Writer, c.Request, r.Replica) {
			c.Abort()
			return
		}
		h(c)
	}
}

func (s *server) findBox(c *gin.Context) (fleet.Box, bool) {
	if b, ok := c.Get(foundBox); ok {
		return b.(fleet.Box), true
	}
	return s.lookupBox(c, c.Param("id"))
}

// lookupBox finds a box by ID or unique name, answering the call when
// there is none.
func (s *server) lookupBox(c *gin.Context, ref string) (fleet.Box, bool) {
	who := caller(c)
	b, err := s.Fleet.Box(c.Request.Context(), who.TenantID, ref)
	if err == nil {
		return b, true
	}
	all, lerr := s.Fleet.Boxes(c.Request.Context(), who.TenantID)
	if lerr != nil {
		s.fail(c, lerr)
		return fleet.Box{}, false
	}
	var match []fleet.Box
	for _, b := range all {
		if b.Name == ref {
			match = append(match, b)
		}
	}
	switch len(match) {
	case 1:
		return match[0], true
	case 0:
		fail(c, errdefs.NotFound("no box with ID or name %q", ref))
	default:
		fail(c, errdefs.Conflict("%d boxes are named %q; use the box ID", len(match), ref))
	}
	return fleet.Box{}, false
}

func (s *server) listBoxes(c *gin.Context) {
	all, err := s.Fleet.Boxes(c.Request.Context(), caller(c).TenantID)
	if err != nil {
		s.fail(c, err)
		return
	}
	out := api.BoxList{Boxes: make([]api.Box, 0, len(all))}
	for _, b := range all {
		out.Boxes = append(out.Boxes, s.view(c.Request.Context(), b))
	}
	c.JSON(http.StatusOK, out)
}

func (s *server) getBox(c *gin.Context) {
	if b, ok := s.findBox(c); ok {
		c.JSON(http.StatusOK, s.view(c.Request.Context(), b))
	}
}

func bindJSON(c *gin.Context, v any) bool {
	c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, 64<<10)
	if err := c.ShouldBindJSON(v); err != nil {
		fail(c, errdefs.Invalid("request body: %w", err))
		return false
	}
	return true
}

func (s *server) labelBox(c *gin.Context) {
	var req api.LabelRequest
	if !bindJSON(c, &req) {
		return
	}
	b, ok := s.findBox(c)
	if !ok {
		return
	}
	b, err := s.Fleet.Label(c.Request.Context(), caller(c), b.ID, req.Labels)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, s.view(c.Request.Context(), b))
}

func (s *server) approveBox(c *gin.Context) {
	b, ok := s.findBox(c)
	if !ok {
		return
	}
	b, err := s.Fleet.Approve(c.Request.Context(), caller(c), b.ID)
	if err != nil {
		s.fail(c, err)
		return
	}
	if s.Apps != nil {
		// The apps pinned where the box stands, at once; the periodic
		// sync catches up if this fails.
		if _, err := s.Apps.SyncBox(c.Request.Context(), b); err != nil {
			s.Log.Warn("approved box's apps not written yet", "box_id", b.ID, "err", err)
		}
	}
	if s.AgentReleases != nil {
		if err := s.AgentReleases.SyncBox(c.Request.Context(), b); err != nil {
			s.Log.Warn("approved box's agent version not written yet", "box_id", b.ID, "err", err)
		}
	}
	c.JSON(http.StatusOK, s.view(c.Request.Context(), b))
}

func (s *server) revokeBox(c *gin.Context) {
	var req api.RevokeRequest
	if c.Request.ContentLength != 0 && !bindJSON(c, &req) {
		return
	}
	timeout, err := wipeTimeout(req.WipeTimeout)
	if err != nil {
		fail(c, err)
		return
	}
	b, ok := s.findBox(c)
	if !ok {
		return
	}
	if req.Wipe {
		s.revokeAndWipe(c, b, timeout)
		return
	}
	b, err = s.Fleet.Revoke(c.Request.Context(), caller(c), b.ID)
	if err != nil {
		s.fail(c, err)
		return
	}
	s.Sessions.Drop(b.ID)
	s.Log.Info("box revoked", "box_id", b.ID)
	c.JSON(http.StatusOK, s.view(c.Request.Context(), b))
}

func tokenView(t fleet.EnrollToken) api.Token {
	return api.Token{ID: t.ID, Region: t.Region, Site: t.Site, Labels: t.Labels, RequireApproval: t.RequireApproval,
		Uses: t.Uses, Used: t.Used, ExpiresAt: t.ExpiresAt, CreatedAt: t.CreatedAt, CreatedBy: t.CreatedBy, Revoked: t.Revoked}
}

func (s *server) createToken(c *gin.Context) {
	var req api.TokenRequest
	if !bindJSON(c, &req) {
		return
	}
	spec := fleet.TokenSpec{Region: req.Region, Site: req.Site, Labels: req.Labels, Uses: req.Uses,
		RequireApproval: req.RequireApproval, TTL: 24 * time.Hour}
	if spec.Uses == 0 {
		spec.Uses = 1
	}
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		if err != nil {
			fail(c, errdefs.Invalid("ttl %q is not a duration like 24h or 90m", req.TTL))
			return
		}
		spec.TTL = d
	}
	tok, rec, err := s.Fleet.CreateToken(c.Request.Context(), caller(c), spec, s.ConsoleURL, s.PKI.CAHash(), s.PKI.KeyPin())
	if err != nil {
		s.fail(c, err)
		return
	}
	tok.Also = s.ConsoleAlso
	text := tok.String()
	c.JSON(http.StatusCreated, api.CreatedToken{Token: tokenView(rec), Text: text,
		EnrollCommand: "edgebox-agent enroll " + text,
		InstallLinux:  scripts.LinuxCommand(s.pins(), text), InstallWindows: scripts.WindowsCommand(s.pins(), text)})
}

func (s *server) listTokens(c *gin.Context) {
	all, err := s.Fleet.Tokens(c.Request.Context(), caller(c).TenantID)
	if err != nil {
		s.fail(c, err)
		return
	}
	out := api.TokenList{Tokens: make([]api.Token, 0, len(all))}
	for _, t := range all {
		out.Tokens = append(out.Tokens, tokenView(t))
	}
	c.JSON(http.StatusOK, out)
}

func (s *server) revokeToken(c *gin.Context) {
	if err := s.Fleet.RevokeToken(c.Request.Context(), caller(c), c.Param("id")); err != nil {
		s.fail(c, err)
		return
	}
	c.Status(http.StatusNoContent)
}

// listAudit lists the newest audit entries of the caller's tenant,
// filtered by target, actor, action (a prefix) and time (since, until, in
// RFC 3339); format=csv answers a CSV file instead of JSON.
func (s *server) listAudit(c *gin.Context) {
	q := audit.Query{TenantID: caller(c).TenantID, Target: c.Query("target"), Actor: c.Query("actor"), Action: c.Query("action")}
	q.Limit, _ = strconv.Atoi(c.Query("limit"))
	for _, b := range []struct {
		name string
		to   *time.Time
	}{{"since", &q.Since}, {"until", &q.Until}} {
		if v := c.Query(b.name); v != "" {
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				fail(c, errdefs.Invalid("%s %q: use an RFC 3339 time such as 2026-11-24T09:00:00+08:00", b.name, truncate(v, 40)))
				return
			}
			*b.to = t
		}
	}
	entries, err := s.Audit.List(c.Request.Context(), q)
	if err != nil {
		s.fail(c, err)
		return
	}
	out := api.AuditList{Entries: make([]api.AuditEntry, 0, len(entries))}
	for _, e := range entries {
		out.Entries = append(out.Entries, api.AuditEntry{Seq: e.Seq, Time: e.Time, Actor: e.Actor, Action: e.Action,
			Target: e.Target, Remote: e.Remote, Result: e.Result, Detail: e.Detail})
	}
	if c.Query("format") == "csv" {
		writeAuditCSV(c, out.Entries)
		return
	}
	c.JSON(http.StatusOK, out)
}

// writeAuditCSV answers entries as a CSV file. A cell that a spreadsheet
// would take for a formula (=, +, -, @, tab, return) gets a leading
// apostrophe, so a hostile box name cannot run in the auditor's
// spreadsheet.
func writeAuditCSV(c *gin.Context, entries []api.AuditEntry) {
	c.Header("Content-Type", "text/csv; charset=utf-8")
	c.Header("Content-Disposition", `attachment; filename="edgebox-audit.csv"`)
	w := csv.NewWriter(c.Writer)
	cell := func(s string) string {
		if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
			return "'" + s
		}
		return s
	}
	w.Write([]string{"seq", "time", "actor", "action", "target", "remote", "result", "detail"})
	for _, e := range entries {
		w.Write([]string{strconv.FormatUint(e.Seq, 10), e.Time.UTC().Format(time.RFC3339Nano), cell(e.Actor), cell(e.Action),
			cell(e.Target), cell(e.Remote), cell(e.Result), cell(e.Detail)})
	}
	w.Flush()
}

// record appends an audit entry of its own: a refused call, a registry
// push. A lost entry is logged, never dropped in silence; a client that
// went away does not cancel it.
func (s *server) record(c *gin.Context, e audit.Entry) {
	if err := s.Audit.Append(context.WithoutCancel(c.Request.Context()), e); err != nil {
		s.Log.Error("audit entry not written", "action", e.Action, "target", e.Target, "err", err)
	}
}
