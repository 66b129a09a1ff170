package httpapi

import (
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console/agentrel"
)

func agentReleaseView(r agentrel.Release) api.AgentRelease {
	v := api.AgentRelease{Version: r.Version, Binaries: map[string]api.AgentReleaseBinary{}, CreatedAt: r.CreatedAt, CreatedBy: r.CreatedBy}
	v.Probation = r.Probation.String()
	if r.Probation == 0 {
		v.Probation = "10m0s (the default)"
	}
	for p, b := range r.Binaries {
		v.Binaries[p] = api.AgentReleaseBinary{SHA256: b.SHA256, Size: b.Size}
	}
	return v
}

// uploadAgentRelease takes one platform's binary of an agent release, as
// the request body.
func (s *server) uploadAgentRelease(c *gin.Context) {
	probation, err := duration("probation", c.Query("probation"), 0)
	if err != nil {
		fail(c, err)
		return
	}
	rel, err := s.AgentReleases.Upload(c.Request.Context(), caller(c), c.Param("version"), c.Param("os")+"/"+c.Param("arch"), probation, c.Request.Body)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, agentReleaseView(rel))
}

func (s *server) listAgentReleases(c *gin.Context) {
	all, err := s.AgentReleases.Releases(c.Request.Context())
	if err != nil {
		s.fail(c, err)
		return
	}
	out := api.AgentReleaseList{Releases: make([]api.AgentRelease, 0, len(all))}
	for _, r := range all {
		out.Releases = append(out.Releases, agentReleaseView(r))
	}
	c.JSON(http.StatusOK, out)
}

func (s *server) getAgentRelease(c *gin.Context) {
	r, err := s.AgentReleases.Release(c.Request.Context(), c.Param("version"))
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, agentReleaseView(r))
}

func (s *server) listAgentPins(c *gin.Context) {
	pins, err := s.AgentReleases.Pins(c.Request.Context(), caller(c).TenantID)
	if err != nil {
		s.fail(c, err)
		return
	}
	out := api.AgentPinList{Pins: make([]api.AgentPin, 0, len(pins))}
	for _, p := range pins {
		out.Pins = append(out.Pins, api.AgentPin{Scope: p.Scope, Target: p.Target, Version: p.Version, At: p.At, By: p.By})
	}
	c.JSON(http.StatusOK, out)
}

func (s *server) pinAgent(c *gin.Context) {
	var req api.AgentPin
	if !bindJSON(c, &req) {
		return
	}
	if err := s.AgentReleases.Pin(c.Request.Context(), caller(c), req.Version, c.Param("scope"), c.Param("target")); err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, api.AgentPin{Scope: c.Param("scope"), Target: c.Param("target"), Version: req.Version, At: time.Now().UTC(), By: caller(c).Name})
}

func (s *server) unpinAgent(c *gin.Context) {
	if err := s.AgentReleases.Unpin(c.Request.Context(), caller(c), c.Param("scope"), c.Param("target")); err != nil {
		s.fail(c, err)
		return
	}
	c.Status(http.StatusNoContent)
}
