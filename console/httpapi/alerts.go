package httpapi

import (
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console/alerts"
	"github.com/edgebox/edgebox/errdefs"
)

// listAlerts answers the tenant's open incidents and, with ?resolved=N,
// the N it resolved last (at most 500).
func (s *server) listAlerts(c *gin.Context) {
	ctx, tenant := c.Request.Context(), caller(c).TenantID
	n := 0
	if v := c.Query("resolved"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 0 || n > 500 {
			fail(c, errdefs.Invalid("resolved: a count from 0 to 500, not %q", v))
			return
		}
	}
	open, err := s.Alerts.Open(ctx, tenant)
	if err != nil {
		s.fail(c, err)
		return
	}
	out := api.AlertList{Open: make([]api.Incident, 0, len(open))}
	for _, in := range open {
		out.Open = append(out.Open, incidentView(in))
	}
	if n > 0 {
		res, err := s.Alerts.Resolved(ctx, tenant, n)
		if err != nil {
			s.fail(c, err)
			return
		}
		for _, in := range res {
			out.Resolved = append(out.Resolved, incidentView(in))
		}
	}
	c.JSON(http.StatusOK, out)
}

func incidentView(in alerts.Incident) api.Incident {
	return api.Incident{ID: in.ID, Kind: string(in.Kind), Subject: in.Subject, Summary: in.Summary, Box: in.Box, BoxName: in.BoxName,
		Site: in.Site, Region: in.Region, State: string(in.State), Since: in.Since, FiredAt: in.FiredAt, ResolvedAt: in.ResolvedAt,
		Silenced: in.Silenced, SilencedBy: in.SilencedBy, Notified: in.Notified}
}

func (s *server) getAlertRules(c *gin.Context) {
	r, err := s.Alerts.GetRules(c.Request.Context(), caller(c).TenantID)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, r)
}

func (s *server) setAlertRules(c *gin.Context) {
	var r alerts.Rules
	if !bindJSON(c, &r) {
		return
	}
	out, err := s.Alerts.SetRules(c.Request.Context(), caller(c), r)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, out)
}

// testAlertRules posts a test notice to each of the tenant's webhooks now
// and answers what each said.
func (s *server) testAlertRules(c *gin.Context) {
	res, err := s.Alerts.Test(c.Request.Context(), caller(c))
	if err != nil {
		s.fail(c, err)
		return
	}
	out := api.WebhookTests{Webhooks: make([]api.WebhookTest, 0, len(res))}
	for _, r := range res {
		out.Webhooks = append(out.Webhooks, api.WebhookTest{URL: r.URL, Error: r.Error})
	}
	c.JSON(http.StatusOK, out)
}

func (s *server) listSilences(c *gin.Context) {
	sils, err := s.Alerts.Silences(c.Request.Context(), caller(c).TenantID)
	if err != nil {
		s.fail(c, err)
		return
	}
	out := api.SilenceList{Silences: make([]api.Silence, 0, len(sils))}
	for _, sil := range sils {
		out.Silences = append(out.Silences, silenceView(sil))
	}
	c.JSON(http.StatusOK, out)
}

func silenceView(sil alerts.Silence) api.Silence {
	return api.Silence{ID: sil.ID, Kind: string(sil.Kind), Box: sil.Box, Site: sil.Site, Until: sil.Until, Comment: sil.Comment,
		CreatedBy: sil.CreatedBy, CreatedAt: sil.CreatedAt}
}

func (s *server) createSilence(c *gin.Context) {
	var req api.SilenceRequest
	if !bindJSON(c, &req) {
		return
	}
	d, err := time.ParseDuration(req.For)
	if err != nil {
		fail(c, errdefs.Invalid("for: a duration such as 2h or 30m, not %q", req.For))
		return
	}
	sil, err := s.Alerts.Silence(c.Request.Context(), caller(c),
		alerts.Silence{Kind: alerts.Kind(req.Kind), Box: req.Box, Site: req.Site, Comment: req.Comment}, d)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusCreated, silenceView(sil))
}

func (s *server) deleteSilence(c *gin.Context) {
	if err := s.Alerts.Unsilence(c.Request.Context(), caller(c), c.Param("id")); err != nil {
		s.fail(c, err)
		return
	}
	c.Status(http.StatusNoContent)
}
