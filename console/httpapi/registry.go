package httpapi

import (
	"errors"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/auth"
	"github.com/edgebox/edgebox/images/registry"
)

// registry serves the OCI registry to operators, who log in with an API
// token (docker login / crane auth login with any user name and the token
// as password, or a bearer token). Each tenant's repositories live under
// its ID (auth.RepoTenant): a caller sees a repository where its role
// may read, and pushes where it may operate. Manifest pushes and deletes
// go into the audit log of the repository's tenant.
func (s *server) registry(c *gin.Context) {
	var who string
	var tenants map[string]bool
	isTenant := func(string) bool { return false }
	// authorize looks at the request's headers only: a refused caller's
	// body is never read.
	authorize := func(req *http.Request) (registry.Access, error) {
		tok, ok := registry.Credentials(req)
		if !ok {
			return registry.Access{}, errors.New("log in with an edgebox API token: docker login <console> -u edgebox -p <token>")
		}
		rec, err := s.Tokens.Check(req.Context(), tok)
		if err != nil {
			return registry.Access{}, err
		}
		p, err := s.Users.Principal(req.Context(), rec)
		if err != nil {
			return registry.Access{}, err
		}
		// Whether a repository's first segment is a tenant, looked up
		// once a request: most touch one repository.
		tenants = map[string]bool{}
		isTenant = func(id string) bool {
			is, ok := tenants[id]
			if !ok {
				_, err := s.Users.Tenant(req.Context(), id)
				is = err == nil
				tenants[id] = is
			}
			return is
		}
		who = p.User
		role := func(repo string) auth.Role {
			t := auth.RepoTenant(repo, isTenant)
			if r, ok := p.Roles[t]; ok {
				return r
			}
			if p.Roles[auth.ConsoleTenant] == auth.Admin {
				return auth.Admin
			}
			return ""
		}
		return registry.Access{
			Sees:   func(repo string) bool { return role(repo).Can(auth.Read) },
			Writes: func(repo string) bool { return role(repo).Can(auth.Operate) },
		}, nil
	}
	s.Registry.Operators(authorize).ServeHTTP(c.Writer, c.Request)
	m := c.Request.Method
	repo, _, isManifest := strings.Cut(strings.TrimPrefix(c.Request.URL.Path, "/v2/"), "/manifests/")
	if who == "" || (m != http.MethodPut && m != http.MethodDelete) || !isManifest {
		return
	}
	result := "ok"
	if st := c.Writer.Status(); st >= 300 {
		result = "failed: " + http.StatusText(st)
	}
	s.record(c, audit.Entry{TenantID: auth.RepoTenant(repo, isTenant), Actor: who, Remote: c.ClientIP(),
		Action: m + " image manifest", Target: strings.TrimPrefix(c.Request.URL.Path, "/v2/"), Result: result})
}
