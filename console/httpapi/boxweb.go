package httpapi

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/edgebox/edgebox/errdefs"
)

// boxWebCSP confines a box's page served under the console's origin: a
// sandbox without allow-same-origin runs it as an origin of its own, so
// it reaches none of the console's cookies or API.
const boxWebCSP = "sandbox allow-scripts allow-forms allow-popups allow-downloads"

// boxWeb serves a web page of the box itself (127.0.0.1:PORT on the box)
// under /api/v1/boxes/:id/web/:port/ (or /api/v1/tenants/:tenant/boxes/…,
// for a tenant not the caller's first), through the box's tunnel: a
// router's or a robot's local admin page. Reading only (GET, HEAD); the
// console's cookies and tokens are never passed on, the page's cookies
// never set, and each request is audited.
func (s *server) boxWeb(c *gin.Context) {
	b, ok := s.findBox(c)
	if !ok {
		return
	}
	port, err := strconv.Atoi(c.Param("port"))
	if err != nil || port < 1 || port > 65535 {
		fail(c, errdefs.Invalid("port %q: 1 to 65535", truncate(c.Param("port"), 16)))
		return
	}
	who := caller(c)
	if s.refuseFourEyes(c, b, "reach its pages through an approved port forward") {
		return
	}
	if !s.Sessions.Presence(b.ID).Online {
		fail(c, errdefs.Unavailable("box %s is offline", b.Name))
		return
	}
	target := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	prefix := fmt.Sprintf("/api/v1/boxes/%s/web/%d", url.PathEscape(c.Param("id")), port)
	if t := c.Param("tenant"); t != "" {
		prefix = "/api/v1/tenants/" + url.PathEscape(t) + prefix[len("/api/v1"):]
	}
	status, size := 0, 0
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme, r.Out.URL.Host, r.Out.Host = "http", target, target
			r.Out.URL.Path = "/" + strings.TrimPrefix(c.Param("path"), "/")
			r.Out.URL.RawPath = ""
			if q := r.Out.URL.Query(); q.Has("tenant") {
				// The console's own: which tenant the call acts in.
				q.Del("tenant")
				r.Out.URL.RawQuery = q.Encode()
			}
			for _, h := range []string{"Cookie", "Authorization", TenantHeader, CSRFHeader, "Origin", "Referer"} {
				r.Out.Header.Del(h)
			}
			r.Out.Header.Set("X-Forwarded-Prefix", prefix)
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return s.RemoteSessions.DialForward(ctx, b.ID, target)
			},
			DisableKeepAlives:      true,
			ResponseHeaderTimeout:  30 * time.Second,
			MaxResponseHeaderBytes: 64 << 10,
		},
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Del("Set-Cookie")
			resp.Header.Set("Content-Security-Policy", boxWebCSP)
			resp.Header.Set("X-Content-Type-Options", "nosniff")
			resp.Header.Set("Cache-Control", "no-store")
			if loc := resp.Header.Get("Location"); strings.HasPrefix(loc, "/") && !strings.HasPrefix(loc, "//") {
				resp.Header.Set("Location", prefix+loc)
			}
			status = resp.StatusCode
			if resp.ContentLength > 0 {
				size = int(resp.ContentLength)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			status = http.StatusBadGateway
			fail(c, errdefs.Unavailable("box %s: its page at port %d: %v", b.Name, port, err))
		},
	}
	proxy.ServeHTTP(c.Writer, c.Request)
	e := who.Did("box.web", "box/"+b.ID, fmt.Sprintf("%s port %d %s: %d, %d bytes", c.Request.Method, port, truncate(c.Param("path"), 256), status, size))
	if err := s.Audit.Append(context.WithoutCancel(c.Request.Context()), e); err != nil {
		s.Log.Error("a box page's request could not be audited", "box", b.ID, "err", err)
	}
}
