package httpapi

import (
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console/rollout"
	"github.com/edgebox/edgebox/errdefs"
)

// duration reads an API duration: "" is def.
func duration(what, s string, def time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errdefs.Invalid("%s %q: use a duration such as 30s, 5m or 1h", what, truncate(s, 40))
	}
	return d, nil
}

// rolloutRequest turns the API's request into the rollout package's,
// with the defaults of what was left out.
func rolloutRequest(q api.RolloutRequest) (rollout.Request, error) {
	d := rollout.DefaultSettings
	waves, err := rollout.ParseWaves(q.Waves)
	if err != nil {
		return rollout.Request{}, err
	}
	gate, err := duration("gate", q.Gate, d.Gate)
	if err != nil {
		return rollout.Request{}, err
	}
	timeout, err := duration("box timeout", q.BoxTimeout, d.BoxTimeout)
	if err != nil {
		return rollout.Request{}, err
	}
	fp := d.FailurePercent
	if q.FailurePercent != nil {
		fp = *q.FailurePercent
	}
	return rollout.Request{App: q.App, From: q.From, To: q.To,
		Scope: rollout.Scope{Regions: q.Regions, Site: q.Site, Selector: q.Selector, Boxes: q.Boxes},
		Settings: rollout.Settings{Waves: waves, Gate: gate, BoxTimeout: timeout, MaxUnavailable: q.MaxUnavailable,
			FailurePercent: fp, RevertAll: q.RevertAll}}, nil
}

func wavesView(ws []rollout.Size) []string {
	out := make([]string, 0, len(ws))
	for _, w := range ws {
		if w.Percent > 0 {
			out = append(out, strconv.FormatFloat(w.Percent, 'f', -1, 64)+"%")
		} else {
			out = append(out, strconv.Itoa(w.Boxes))
		}
	}
	return out
}

// rolloutView shows r; with boxes, its groups' boxes too.
func rolloutView(r rollout.Rollout, boxes bool) api.Rollout {
	m := r.Machine
	st := m.Settings
	v := api.Rollout{ID: r.ID, App: r.App, From: r.From, To: r.To, Scope: r.Scope.String(), State: string(r.State),
		Reason: r.Reason, CreatedAt: r.CreatedAt, CreatedBy: r.CreatedBy, UpdatedAt: r.UpdatedAt, Group: m.Region,
		Settings: api.RolloutSettings{Waves: wavesView(st.Waves), Gate: st.Gate.String(), BoxTimeout: st.BoxTimeout.String(),
			MaxUnavailable: st.MaxUnavailable, FailurePercent: st.FailurePercent, RevertAll: st.RevertAll}}
	if p := r.Prefetch; p != nil {
		v.Prefetch = &api.RolloutPrefetch{Image: p.Image, Asked: p.Asked, OnDisk: p.OnDisk, Failed: p.Failed}
	}
	for _, a := range r.Approvals {
		v.Approvals = append(v.Approvals, api.RolloutApproval{By: a.By, At: a.At, Stage: a.Stage})
	}
	p := &v.Progress
	for _, g := range m.Regions {
		gv := api.RolloutGroup{Name: g.Name, Wave: g.Wave, Waves: len(g.Ends)}
		wave := 0
		for i, b := range g.Boxes {
			for wave < len(g.Ends) && i >= g.Ends[wave] {
				wave++
			}
			p.Total++
			switch b.Phase {
			case rollout.Waiting:
				p.Waiting++
			case rollout.Held:
				p.Held++
			case rollout.Updating:
				p.Updating++
			case rollout.Gating:
				p.Gating++
			case rollout.Done:
				p.Done++
			case rollout.Failed:
				p.Failed++
			}
			if b.Reverted {
				p.Reverted++
			}
			if boxes {
				gv.Boxes = append(gv.Boxes, api.RolloutBox{ID: b.ID, Site: b.Site, Wave: wave, Phase: string(b.Phase),
					Reason: b.Reason, Since: b.Since, Reverted: b.Reverted})
			}
		}
		if boxes {
			v.Groups = append(v.Groups, gv)
		}
	}
	if boxes {
		for _, sk := range r.Skipped {
			v.Skipped = append(v.Skipped, api.RolloutSkipped{Box: sk.Box, Reason: sk.Reason})
		}
	}
	return v
}

func (s *server) createRollout(c *gin.Context) {
	var q api.RolloutRequest
	if !bindJSON(c, &q) {
		return
	}
	req, err := rolloutRequest(q)
	if err != nil {
		fail(c, err)
		return
	}
	r, err := s.Rollouts.Create(c.Request.Context(), caller(c), req)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusCreated, rolloutView(r, true))
}

func (s *server) listRollouts(c *gin.Context) {
	all, err := s.Rollouts.List(c.Request.Context(), caller(c).TenantID)
	if err != nil {
		s.fail(c, err)
		return
	}
	out := api.RolloutList{Rollouts: make([]api.Rollout, 0, len(all))}
	for _, r := range all {
		out.Rollouts = append(out.Rollouts, rolloutView(r, false))
	}
	c.JSON(http.StatusOK, out)
}

func (s *server) getRollout(c *gin.Context) {
	r, err := s.Rollouts.Get(c.Request.Context(), caller(c).TenantID, c.Param("id"))
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, rolloutView(r, true))
}

func (s *server) rolloutAction(c *gin.Context) {
	var a api.RolloutAction
	if c.Request.ContentLength != 0 && !bindJSON(c, &a) {
		return
	}
	ctx, who, id := c.Request.Context(), caller(c), c.Param("id")
	var r rollout.Rollout
	var err error
	switch c.Param("action") {
	case "pause":
		r, err = s.Rollouts.Pause(ctx, who, id, a.Reason)
	case "resume":
		r, err = s.Rollouts.Resume(ctx, who, id)
	case "abort":
		r, err = s.Rollouts.Abort(ctx, who, id, a.Revert)
	case "approve":
		r, err = s.Rollouts.Approve(ctx, who, id)
	default:
		err = errdefs.NotFound("no rollout action %q: use pause, resume, abort or approve", truncate(c.Param("action"), 40))
	}
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, rolloutView(r, true))
}

func policyIn(p api.UpdatePolicy) rollout.Policy {
	win := func(ws []api.UpdateWindow) []rollout.Window {
		var out []rollout.Window
		for _, w := range ws {
			out = append(out, rollout.Window{Days: rollout.Days(w.Days), From: w.From, To: w.To})
		}
		return out
	}
	return rollout.Policy{Zone: p.Zone, Allow: win(p.Allow), Deny: win(p.Deny),
		Calendar: rollout.Calendar{Holidays: p.Calendar.Holidays, ExtraWorkdays: p.Calendar.ExtraWorkdays}}
}

func policyOut(p rollout.Policy) api.UpdatePolicy {
	win := func(ws []rollout.Window) []api.UpdateWindow {
		var out []api.UpdateWindow
		for _, w := range ws {
			out = append(out, api.UpdateWindow{Days: string(w.Days), From: w.From, To: w.To})
		}
		return out
	}
	return api.UpdatePolicy{Zone: p.Zone, Allow: win(p.Allow), Deny: win(p.Deny),
		Calendar: api.Calendar{Holidays: p.Calendar.Holidays, ExtraWorkdays: p.Calendar.ExtraWorkdays}}
}

func rulesView(r rollout.Rules) api.RolloutRules {
	v := api.RolloutRules{ApproveStart: r.ApproveStart, ApproveFirstWave: r.ApproveFirstWave,
		Calendar:  api.Calendar{Holidays: r.Calendar.Holidays, ExtraWorkdays: r.Calendar.ExtraWorkdays},
		UpdatedAt: r.UpdatedAt, UpdatedBy: r.UpdatedBy}
	if len(r.Regions) > 0 {
		v.Regions = map[string]api.UpdatePolicy{}
		for k, p := range r.Regions {
			v.Regions[k] = policyOut(p)
		}
	}
	if len(r.Sites) > 0 {
		v.Sites = map[string]api.UpdatePolicy{}
		for k, p := range r.Sites {
			v.Sites[k] = policyOut(p)
		}
	}
	return v
}

func (s *server) getRolloutRules(c *gin.Context) {
	r, err := s.Rollouts.GetRules(c.Request.Context(), caller(c).TenantID)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, rulesView(r))
}

func (s *server) setRolloutRules(c *gin.Context) {
	var q api.RolloutRules
	if !bindJSON(c, &q) {
		return
	}
	r := rollout.Rules{ApproveStart: q.ApproveStart, ApproveFirstWave: q.ApproveFirstWave,
		Calendar: rollout.Calendar{Holidays: q.Calendar.Holidays, ExtraWorkdays: q.Calendar.ExtraWorkdays}}
	if len(q.Regions) > 0 {
		r.Regions = map[string]rollout.Policy{}
		for k, p := range q.Regions {
			r.Regions[k] = policyIn(p)
		}
	}
	if len(q.Sites) > 0 {
		r.Sites = map[string]rollout.Policy{}
		for k, p := range q.Sites {
			r.Sites[k] = policyIn(p)
		}
	}
	r, err := s.Rollouts.SetRules(c.Request.Context(), caller(c), r)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, rulesView(r))
}
