package httpapi

import (
	"crypto/subtle"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/auth"
	"github.com/edgebox/edgebox/errdefs"
)

// SessionCookie names the browser session's cookie. The __Host- prefix
// makes browsers keep it to this origin, over HTTPS, on every path.
const SessionCookie = "__Host-edgebox_session"

// TenantHeader names the tenant a call acts in, for callers who hold roles
// in several. Without it, a call acts in the console's own tenant when the
// caller holds a role there, and otherwise in the first of its tenants.
const TenantHeader = "X-Edgebox-Tenant"

// CSRFHeader carries a browser session's CSRF value on every change.
const CSRFHeader = "X-CSRF-Token"

// anyone marks a route any authenticated caller may use, whatever its
// role; manageConsole one for admins of the console's own tenant.
const (
	anyone        auth.Permission = 0
	manageConsole auth.Permission = -1
)

const (
	callerKey = "edgebox.caller"
	accessKey = "edgebox.access"
)

// access is what authenticate found: who calls, in which tenant, with
// which role there, and the browser session if that is how.
type access struct {
	auth.Principal
	Tenant  string
	Role    auth.Role
	Session *auth.Session
}

func accessOf(c *gin.Context) access { return c.MustGet(accessKey).(access) }

func caller(c *gin.Context) audit.Actor { return c.MustGet(callerKey).(audit.Actor) }

func unauthorized(c *gin.Context, msg string) {
	c.Header("WWW-Authenticate", `Bearer realm="edgebox"`)
	c.AbortWithStatusJSON(http.StatusUnauthorized, api.Error{Error: msg})
}

// authenticate finds the caller from a bearer token or a session cookie,
// refuses a session's change that does not carry its CSRF value, and
// picks the tenant the call acts in.
func (s *server) authenticate(c *gin.Context) {
	ctx := c.Request.Context()
	var a access
	if h := c.GetHeader("Authorization"); h != "" {
		tok, ok := strings.CutPrefix(h, "Bearer ")
		if !ok {
			unauthorized(c, "use 'Authorization: Bearer <API token>'")
			return
		}
		rec, err := s.Tokens.Check(ctx, tok)
		if err == nil {
			a.Principal, err = s.Users.Principal(ctx, rec)
		}
		if s.refused(c, err) {
			return
		}
	} else if ck, err := c.Cookie(SessionCookie); err == nil {
		sess, usr, err := s.Users.CheckSession(ctx, ck)
		if s.refused(c, err) {
			return
		}
		if !safeMethod(c.Request.Method) {
			if err := checkCSRF(c.Request, sess.CSRF); err != nil {
				fail(c, err)
				return
			}
		}
		a.Principal = auth.Principal{User: usr.Name, Via: "session", Roles: usr.Roles}
		a.Session = &sess
	} else {
		unauthorized(c, "this call needs an API token ('Authorization: Bearer <token>'; run 'edgebox login') or a browser session")
		return
	}
	if err := s.pickTenant(c, &a); err != nil {
		fail(c, err)
		return
	}
	c.Set(accessKey, a)
	c.Set(callerKey, audit.Actor{TenantID: a.Tenant, Name: a.User, Remote: c.ClientIP()})
}

// refused answers a call whose credential check failed: 401 for a
// credential that is not (or no longer) good, the usual error else. It
// reports whether it answered.
func (s *server) refused(c *gin.Context, err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, errdefs.ErrPermission):
		unauthorized(c, err.Error())
	default:
		s.fail(c, err)
	}
	return true
}

// parseTokenTTL reads the lifetime asked of a new API token, from the
// request's field: a Go duration from 1m to ten years; "" is none.
func parseTokenTTL(field, v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < time.Minute || d > 10*365*24*time.Hour {
		return 0, errdefs.Invalid("%s %q: use a Go duration from 1m to 87600h", field, truncate(v, 32))
	}
	return d, nil
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// checkCSRF refuses a browser's change that another site could have made:
// it must carry the session's CSRF value, and come from the console's own
// origin when the browser says where it comes from.
func checkCSRF(r *http.Request, want string) error {
	refused := errdefs.Permission("cross-site request refused: a change from a browser needs the page's CSRF token")
	if checkOrigin(r) != nil {
		return refused
	}
	got := r.Header.Get(CSRFHeader)
	if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		return refused
	}
	return nil
}

// checkOrigin refuses a request a browser says comes from another site
// (Sec-Fetch-Site, Origin); a request that says nothing (a CLI, an older
// browser) passes.
func checkOrigin(r *http.Request) error {
	refused := errdefs.Permission("cross-site request refused")
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return refused
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return refused
		}
	}
	return nil
}

// pickTenant sets the tenant a call acts in and the caller's role there. A
// tenant the caller holds no role in does not exist as far as it can
// tell, unless it administers the console: then it is an admin there.
func (s *server) pickTenant(c *gin.Context, a *access) error {
	t := c.GetHeader(TenantHeader)
	if t == "" {
		t = c.Param("tenant") // a path that names it: a box's web pages, whose links carry no query
	}
	if t == "" && c.Request.Method == http.MethodGet {
		t = c.Query("tenant") // a browser's EventSource sets no headers
	}
	if t == "" {
		t = auth.ConsoleTenant
		if _, ok := a.Roles[t]; !ok {
			if ts := (auth.User{Roles: a.Roles}).Tenants(); len(ts) > 0 {
				t = ts[0]
			}
		}
	}
	a.Tenant = t
	if r, ok := a.Roles[t]; ok {
		a.Role = r
		return nil
	}
	if a.Roles[auth.ConsoleTenant] == auth.Admin {
		if _, err := s.Users.Tenant(c.Request.Context(), t); err != nil {
			return err
		}
		a.Role = auth.Admin
		return nil
	}
	return errdefs.NotFound("no tenant %q", truncate(t, 64))
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// need refuses callers whose role in the call's tenant lacks p.
func need(p auth.Permission) gin.HandlerFunc {
	return func(c *gin.Context) {
		a := accessOf(c)
		switch {
		case p == anyone:
			return
		case p == manageConsole:
			if a.Roles[auth.ConsoleTenant] == auth.Admin {
				return
			}
			fail(c, errdefs.Permission("only admins of the console's own tenant may do this"))
		case !a.Role.Can(p):
			fail(c, errdefs.Permission("your role in tenant %s (%s) may not do this: it needs %s", a.Tenant, a.Role, p))
		}
	}
}

// login checks a user's password and starts a browser session, or makes
// an API token when asked for one. Guessing is slowed per user and per
// client address (auth.Throttle), and every failure is audited.
func (s *server) login(c *gin.Context) {
	// A login from another site would log the browser in as someone else
	// (login CSRF): a browser's login must come from the console's own
	// page, as JSON, which another site's form cannot send.
	if err := checkOrigin(c.Request); err != nil || !strings.HasPrefix(c.ContentType(), "application/json") {
		fail(c, errdefs.Permission("cross-site login refused: log in from the console's own page, with a JSON body"))
		return
	}
	var req api.LoginRequest
	if !bindJSON(c, &req) {
		return
	}
	ctx := c.Request.Context()
	ip := c.ClientIP()
	name := strings.ToLower(strings.TrimSpace(req.User))
	if err := auth.CheckUserName(name); err != nil {
		fail(c, err)
		return
	}
	if !s.mayGuess(c, name) {
		return
	}
	ttl, err := parseTokenTTL("token_ttl", req.TokenTTL)
	if err != nil {
		fail(c, err)
		return
	}
	usr, err := s.Users.Authenticate(ctx, name, req.Password)
	if errors.Is(err, errdefs.ErrPermission) {
		s.Throttle.Failed(name, ip)
		s.auditLogin(c, name, "failed: wrong user name or password")
		unauthorized(c, err.Error())
		return
	} else if err != nil {
		s.fail(c, err)
		return
	}
	s.Throttle.Succeeded(name, ip)
	me := api.Me{User: usr.Name, Roles: rolesView(usr.Roles)}
	if req.TokenName != "" {
		tok, err := s.makeToken(c, auth.Principal{User: usr.Name, UserID: usr.ID, Roles: usr.Roles}, req.TokenName, ttl)
		if err != nil {
			fail(c, err)
			return
		}
		me.Token, me.ExpiresAt = tok.Token, tok.ExpiresAt
	} else {
		ck, sess, err := s.Users.StartSession(ctx, usr, ip, s.SessionTTL)
		if err != nil {
			s.fail(c, err)
			return
		}
		http.SetCookie(c.Writer, &http.Cookie{Name: SessionCookie, Value: ck, Path: "/", Secure: true, HttpOnly: true,
			SameSite: http.SameSiteStrictMode, Expires: sess.ExpiresAt})
		me.CSRF, me.ExpiresAt = sess.CSRF, sess.ExpiresAt
		s.auditLogin(c, usr.Name, "ok")
	}
	c.JSON(http.StatusOK, me)
}

// mayGuess reports whether user may be guessed at from this client now;
// while the password throttle holds it back, it answers 429 with when to
// come back.
func (s *server) mayGuess(c *gin.Context, user string) bool {
	wait := s.Throttle.Wait(user, c.ClientIP())
	if wait <= 0 {
		return true
	}
	secs := int((wait + time.Second - 1) / time.Second)
	c.Header("Retry-After", strconv.Itoa(secs))
	c.AbortWithStatusJSON(http.StatusTooManyRequests, api.Error{Error: "too many wrong passwords: try again in " + strconv.Itoa(secs) + " s"})
	return false
}

// auditLogin records a login in every tenant the user holds a role in,
// and in the console's own, where an unknown user's attempts go.
func (s *server) auditLogin(c *gin.Context, name, result string) {
	tenants := []string{auth.ConsoleTenant}
	if usr, _, err := s.Users.Get(c.Request.Context(), name); err == nil {
		for _, t := range usr.Tenants() {
			if t != auth.ConsoleTenant {
				tenants = append(tenants, t)
			}
		}
	}
	for _, t := range tenants {
		s.record(c, audit.Entry{TenantID: t, Actor: name, Remote: c.ClientIP(), Action: "user.login", Target: name, Result: result})
	}
}

func rolesView(m map[string]auth.Role) map[string]string {
	out := make(map[string]string, len(m))
	for t, r := range m {
		out[t] = string(r)
	}
	return out
}

func (s *server) me(c *gin.Context) {
	a := accessOf(c)
	me := api.Me{User: a.User, Roles: rolesView(a.Roles), Tenant: a.Tenant, Role: string(a.Role)}
	if a.Session != nil {
		me.CSRF, me.ExpiresAt = a.Session.CSRF, a.Session.ExpiresAt
	}
	c.JSON(http.StatusOK, me)
}

// logout ends the caller's browser session.
func (s *server) logout(c *gin.Context) {
	a := accessOf(c)
	if a.Session == nil {
		fail(c, errdefs.Invalid("log out ends a browser session; an API token is revoked with 'edgebox apitoken rm'"))
		return
	}
	ck, _ := c.Cookie(SessionCookie)
	if err := s.Users.EndSession(c.Request.Context(), ck); err != nil {
		s.fail(c, err)
		return
	}
	http.SetCookie(c.Writer, &http.Cookie{Name: SessionCookie, Value: "", Path: "/", Secure: true, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, MaxAge: -1})
	c.Status(http.StatusNoContent)
}

// logoutEverywhere ends every browser session of the caller.
func (s *server) logoutEverywhere(c *gin.Context) {
	if !asUser(c) {
		return
	}
	if err := s.Users.LogOutEverywhere(c.Request.Context(), caller(c), accessOf(c).User); err != nil {
		s.fail(c, err)
		return
	}
	c.Status(http.StatusNoContent)
}
