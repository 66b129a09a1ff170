package httpapi

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/auth"
	"github.com/edgebox/edgebox/errdefs"
)

// asUser answers a legacy token's call to a route about the caller's own
// user, and reports whether the call may go on.
func asUser(c *gin.Context) bool {
	if accessOf(c).Legacy {
		fail(c, errdefs.Permission("a token from before users has no user; log in as a user ('edgebox login --user')"))
		return false
	}
	return true
}

func userView(u auth.User) api.User {
	return api.User{Name: u.Name, Roles: rolesView(u.Roles), CreatedAt: u.CreatedAt}
}

// listUsers lists the users who hold a role in the caller's tenant, with
// their roles in the tenants the caller administers only.
func (s *server) listUsers(c *gin.Context) {
	a := accessOf(c)
	all, err := s.Users.List(c.Request.Context(), a.Tenant)
	if err != nil {
		s.fail(c, err)
		return
	}
	out := make([]api.User, 0, len(all))
	for _, u := range all {
		v := userView(u)
		for t := range v.Roles {
			if !administers(a, t) {
				delete(v.Roles, t)
			}
		}
		out = append(out, v)
	}
	c.JSON(http.StatusOK, out)
}

// administers reports whether the caller is an admin of tenant.
func administers(a access, tenant string) bool {
	return a.Roles[tenant] == auth.Admin || a.Roles[auth.ConsoleTenant] == auth.Admin
}

func (s *server) createUser(c *gin.Context) {
	var req api.UserRequest
	if !bindJSON(c, &req) {
		return
	}
	a := accessOf(c)
	u, err := s.Users.Create(c.Request.Context(), caller(c), strings.ToLower(strings.TrimSpace(req.Name)), req.Password, a.Tenant, auth.Role(req.Role))
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusCreated, userView(u))
}

// tenantUser finds a user who holds a role in the caller's tenant; any
// other is not there as far as this tenant's admin can tell.
func (s *server) tenantUser(c *gin.Context) (auth.User, bool) {
	a := accessOf(c)
	u, _, err := s.Users.Get(c.Request.Context(), c.Param("name"))
	if err == nil {
		if _, ok := u.Roles[a.Tenant]; ok || a.Roles[auth.ConsoleTenant] == auth.Admin {
			return u, true
		}
		err = errdefs.NotFound("no user %q", c.Param("name"))
	}
	s.fail(c, err)
	return auth.User{}, false
}

// setRole gives a user a role in the caller's tenant, or takes it away.
// An admin may give a role to a user of another tenant by name: that is
// how one person comes to work for several.
func (s *server) setRole(c *gin.Context) {
	var req api.RoleRequest
	if !bindJSON(c, &req) {
		return
	}
	a := accessOf(c)
	if c.Param("name") == a.User && req.Role != string(auth.Admin) {
		fail(c, errdefs.Invalid("you cannot take your own admin role away; another admin can"))
		return
	}
	u, err := s.Users.SetRole(c.Request.Context(), caller(c), c.Param("name"), a.Tenant, auth.Role(req.Role))
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, userView(u))
}

// deleteUser takes the user's role in the caller's tenant away, and
// deletes the user when that was its last.
func (s *server) deleteUser(c *gin.Context) {
	u, ok := s.tenantUser(c)
	if !ok {
		return
	}
	a := accessOf(c)
	if u.Name == a.User {
		fail(c, errdefs.Invalid("you cannot delete yourself; another admin can"))
		return
	}
	if _, err := s.Users.RemoveRole(c.Request.Context(), caller(c), u.Name, a.Tenant); err != nil {
		s.fail(c, err)
		return
	}
	c.Status(http.StatusNoContent)
}

// setPassword sets another user's password: the caller must administer
// every tenant the user works in, or it could take over their accounts.
func (s *server) setPassword(c *gin.Context) {
	var req api.PasswordRequest
	if !bindJSON(c, &req) {
		return
	}
	u, ok := s.tenantUser(c)
	if !ok {
		return
	}
	a := accessOf(c)
	for t := range u.Roles {
		if !administers(a, t) {
			fail(c, errdefs.Permission("user %q also works in a tenant you do not administer; its admins or the user can change the password", u.Name))
			return
		}
	}
	if err := s.Users.SetPassword(c.Request.Context(), caller(c), u.Name, req.Password); err != nil {
		s.fail(c, err)
		return
	}
	c.Status(http.StatusNoContent)
}

// changeOwnPassword changes the caller's password, given the old one.
func (s *server) changeOwnPassword(c *gin.Context) {
	var req api.PasswordRequest
	if !asUser(c) || !bindJSON(c, &req) {
		return
	}
	a := accessOf(c)
	ctx := c.Request.Context()
	// Guessing the old password is guessing a password: the login's
	// throttle holds here too.
	if !s.mayGuess(c, a.User) {
		return
	}
	if _, err := s.Users.Authenticate(ctx, a.User, req.Old); errors.Is(err, errdefs.ErrPermission) {
		s.Throttle.Failed(a.User, c.ClientIP())
		fail(c, errdefs.Permission("the old password is wrong"))
		return
	} else if err != nil {
		s.fail(c, err)
		return
	}
	if err := s.Users.SetPassword(ctx, caller(c), a.User, req.Password); err != nil {
		s.fail(c, err)
		return
	}
	c.Status(http.StatusNoContent)
}

func apiTokenView(t auth.TokenInfo) api.APIToken {
	return api.APIToken{ID: t.ID, Name: t.Name, User: t.User, CreatedAt: t.CreatedAt, ExpiresAt: t.ExpiresAt}
}

// makeToken makes an API token for the user p, audited in each tenant
// the user works in, in the token's own transaction.
func (s *server) makeToken(c *gin.Context, p auth.Principal, name string, ttl time.Duration) (api.APIToken, error) {
	user := p.User
	name = strings.TrimSpace(name)
	if name == "" || len(name) > 100 {
		return api.APIToken{}, errdefs.Invalid("an API token needs a name of 1 to 100 bytes")
	}
	rec := auth.APIToken{Name: name, User: user, UserID: p.UserID, CreatedAt: time.Now().UTC()}
	if ttl > 0 {
		rec.ExpiresAt = rec.CreatedAt.Add(ttl)
	}
	var es []audit.Entry
	for _, t := range (auth.User{Roles: p.Roles}).Tenants() {
		es = append(es, audit.Actor{TenantID: t, Name: user, Remote: c.ClientIP()}.Did("apitoken.create", user, name))
	}
	text := auth.NewTokenText()
	if err := s.Tokens.Store(c.Request.Context(), text, rec, es...); err != nil {
		return api.APIToken{}, err
	}
	return api.APIToken{Name: name, User: user, CreatedAt: rec.CreatedAt, ExpiresAt: rec.ExpiresAt, Token: text}, nil
}

func (s *server) listAPITokens(c *gin.Context) {
	if asUser(c) {
		s.writeTokens(c, accessOf(c).User)
	}
}

// writeTokens answers with the API tokens of user.
func (s *server) writeTokens(c *gin.Context, user string) {
	all, err := s.Tokens.List(c.Request.Context(), user)
	if err != nil {
		s.fail(c, err)
		return
	}
	out := make([]api.APIToken, 0, len(all))
	for _, t := range all {
		out = append(out, apiTokenView(t))
	}
	c.JSON(http.StatusOK, out)
}

func (s *server) createAPIToken(c *gin.Context) {
	var req api.APITokenRequest
	if !asUser(c) || !bindJSON(c, &req) {
		return
	}
	ttl, err := parseTokenTTL("ttl", req.TTL)
	if err != nil {
		fail(c, err)
		return
	}
	t, err := s.makeToken(c, accessOf(c).Principal, req.Name, ttl)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusCreated, t)
}

// listUserTokens lists the API tokens of a user of the caller's tenant,
// for its admins.
func (s *server) listUserTokens(c *gin.Context) {
	if u, ok := s.tenantUser(c); ok {
		s.writeTokens(c, u.Name)
	}
}

// revokeUserToken revokes an API token of a user of the caller's tenant.
func (s *server) revokeUserToken(c *gin.Context) {
	u, ok := s.tenantUser(c)
	if !ok {
		return
	}
	if err := s.Tokens.Revoke(c.Request.Context(), u.Name, c.Param("id"), caller(c).Did("apitoken.revoke", u.Name, c.Param("id"))); err != nil {
		s.fail(c, err)
		return
	}
	c.Status(http.StatusNoContent)
}

func (s *server) revokeAPIToken(c *gin.Context) {
	if !asUser(c) {
		return
	}
	a := accessOf(c)
	if err := s.Tokens.Revoke(c.Request.Context(), a.User, c.Param("id"), caller(c).Did("apitoken.revoke", a.User, c.Param("id"))); err != nil {
		s.fail(c, err)
		return
	}
	c.Status(http.StatusNoContent)
}

// listTenants lists the tenants the caller works in; all of them for an
// admin of the console.
func (s *server) listTenants(c *gin.Context) {
	a := accessOf(c)
	all, err := s.Users.Tenants(c.Request.Context())
	if err != nil {
		s.fail(c, err)
		return
	}
	out := []api.Tenant{}
	for _, t := range all {
		if _, ok := a.Roles[t.ID]; ok || a.Roles[auth.ConsoleTenant] == auth.Admin {
			out = append(out, api.Tenant{ID: t.ID, Name: t.Name, CreatedAt: t.CreatedAt})
		}
	}
	c.JSON(http.StatusOK, out)
}

func (s *server) createTenant(c *gin.Context) {
	var req api.Tenant
	if !bindJSON(c, &req) {
		return
	}
	t, err := s.Users.CreateTenant(c.Request.Context(), caller(c), req.ID, req.Name)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusCreated, api.Tenant{ID: t.ID, Name: t.Name, CreatedAt: t.CreatedAt})
}
