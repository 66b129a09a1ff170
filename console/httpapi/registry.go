package httpapi

import (
	"errors"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/images/registry"
)

// registry serves the OCI registry to operators, who log in with an API
// token (docker login / crane auth login with any user name and the token
// as password, or a bearer token). Manifest pushes and deletes go into the
// audit log.
func (s *server) registry(c *gin.Context) {
	var who string
	var tenant string
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
		who, tenant = rec.Name, rec.TenantID
		// An operator's token sees every repository; a tenant's token
		// will see its tenant's (Access.Sees).
		return registry.Access{}, nil
	}
	s.Registry.Operators(authorize).ServeHTTP(c.Writer, c.Request)
	m := c.Request.Method
	if who == "" || (m != http.MethodPut && m != http.MethodDelete) || !strings.Contains(c.Request.URL.Path, "/manifests/") {
		return
	}
	result := "ok"
	if st := c.Writer.Status(); st >= 300 {
		result = "failed: " + http.StatusText(st)
	}
	s.record(c, audit.Entry{TenantID: tenant, Actor: who, Remote: c.ClientIP(),
		Action: m + " image manifest", Target: strings.TrimPrefix(c.Request.URL.Path, "/v2/"), Result: result})
}
