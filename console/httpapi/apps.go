package httpapi

import (
	"context"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"google.golang.org/grpc"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console/apps"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Agents reaches the agents on the boxes.
type Agents interface {
	// Logs asks a box for the end of a workload's output.
	Logs(ctx context.Context, box, workload string, tail uint32) (*edgeboxv1.LogsResponse, error)
	// Wipe asks a box to wipe itself (AgentService.Wipe) and waits for its
	// answer until ctx ends. Without an answer, the error says why in a
	// few words ("box offline", …), or is context.DeadlineExceeded.
	Wipe(ctx context.Context, box, reason string) (*edgeboxv1.WipeResponse, error)
	// Conn is a gRPC connection to a box's AgentService, for file
	// copies; the caller closes it.
	Conn(box string) (*grpc.ClientConn, error)
}

func appView(a apps.App) api.App {
	return api.App{Name: a.Name, Description: a.Description, CreatedAt: a.CreatedAt, CreatedBy: a.CreatedBy}
}

func releaseView(r apps.Release) api.Release {
	return api.Release{App: r.App, ReleaseSpec: specView(r.Spec), Tag: r.Tag, CreatedAt: r.CreatedAt, CreatedBy: r.CreatedBy}
}

func pinView(p apps.Pin) *api.Pin {
	return &api.Pin{App: p.App, Scope: p.Scope, Target: p.Target, Version: p.Version, At: p.At, By: p.By}
}

func (s *server) listApps(c *gin.Context) {
	all, err := s.Apps.Apps(c.Request.Context(), caller(c).TenantID)
	if err != nil {
		s.fail(c, err)
		return
	}
	out := api.AppList{Apps: make([]api.App, 0, len(all))}
	for _, a := range all {
		out.Apps = append(out.Apps, appView(a))
	}
	c.JSON(http.StatusOK, out)
}

func (s *server) createApp(c *gin.Context) {
	var req api.App
	if !bindJSON(c, &req) {
		return
	}
	a, err := s.Apps.CreateApp(c.Request.Context(), caller(c), req.Name, req.Description)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusCreated, appView(a))
}

func (s *server) getApp(c *gin.Context) {
	a, err := s.Apps.App(c.Request.Context(), caller(c).TenantID, c.Param("app"))
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, appView(a))
}

func (s *server) deleteApp(c *gin.Context) {
	if err := s.Apps.DeleteApp(c.Request.Context(), caller(c), c.Param("app")); err != nil {
		s.fail(c, err)
		return
	}
	c.Status(http.StatusNoContent)
}

func (s *server) listReleases(c *gin.Context) {
	rels, err := s.Apps.Releases(c.Request.Context(), caller(c).TenantID, c.Param("app"))
	if err != nil {
		s.fail(c, err)
		return
	}
	out := api.ReleaseList{Releases: make([]api.Release, 0, len(rels))}
	for _, r := range rels {
		out.Releases = append(out.Releases, releaseView(r))
	}
	c.JSON(http.StatusOK, out)
}

func (s *server) createRelease(c *gin.Context) {
	var req api.ReleaseSpec
	if !bindJSON(c, &req) {
		return
	}
	r, err := s.Apps.CreateRelease(c.Request.Context(), caller(c), c.Param("app"), specFrom(req))
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusCreated, releaseView(r))
}

func (s *server) listPins(c *gin.Context) {
	who := caller(c)
	if _, err := s.Apps.App(c.Request.Context(), who.TenantID, c.Param("app")); err != nil {
		s.fail(c, err)
		return
	}
	pins, err := s.Apps.Pins(c.Request.Context(), who.TenantID, c.Param("app"))
	if err != nil {
		s.fail(c, err)
		return
	}
	out := api.PinList{Pins: make([]api.Pin, 0, len(pins))}
	for _, p := range pins {
		out.Pins = append(out.Pins, *pinView(p))
	}
	c.JSON(http.StatusOK, out)
}

// pinTarget turns a box name into its ID; regions and sites are names.
func (s *server) pinTarget(c *gin.Context) (scope, target string, ok bool) {
	scope, target = c.Param("scope"), c.Param("target")
	if scope == apps.ScopeBox {
		b, ok := s.lookupBox(c, target)
		return scope, b.ID, ok
	}
	return scope, target, true
}

func (s *server) deploy(c *gin.Context) {
	var req api.DeployRequest
	if !bindJSON(c, &req) {
		return
	}
	scope, target, ok := s.pinTarget(c)
	if !ok {
		return
	}
	app := c.Param("app")
	p, out, err := s.Apps.Deploy(c.Request.Context(), caller(c), app, req.Version, scope, target)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, api.DeployResult{Pin: pinView(p), Changed: nonNil(out.Changed), Problems: out.Problems})
}

// previewDeploy says what a deploy would do, and does nothing.
func (s *server) previewDeploy(c *gin.Context) {
	scope, target, ok := s.pinTarget(c)
	if !ok {
		return
	}
	im, err := s.Apps.Preview(c.Request.Context(), caller(c).TenantID, c.Param("app"), c.Query("version"), scope, target)
	if err != nil {
		s.fail(c, err)
		return
	}
	out := api.DeployPreview{Boxes: make([]api.PreviewBox, 0, len(im.Boxes)), Already: im.Already, Kept: len(im.Kept)}
	for _, b := range im.Boxes {
		pb := api.PreviewBox{ID: b.ID, Name: b.Name, Online: s.Sessions.Presence(b.ID).Online, MissingKeys: im.MissingKeys[b.ID]}
		if !pb.Online {
			out.Offline++
		}
		if len(pb.MissingKeys) > 0 {
			out.NoKey++
		}
		out.Boxes = append(out.Boxes, pb)
	}
	c.JSON(http.StatusOK, out)
}

func (s *server) undeploy(c *gin.Context) {
	scope, target, ok := s.pinTarget(c)
	if !ok {
		return
	}
	app := c.Param("app")
	out, err := s.Apps.Undeploy(c.Request.Context(), caller(c), app, scope, target)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, api.DeployResult{Changed: nonNil(out.Changed), Problems: out.Problems})
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func (s *server) appStatus(c *gin.Context) {
	ctx := c.Request.Context()
	who := caller(c)
	app := c.Param("app")
	if _, err := s.Apps.App(ctx, who.TenantID, app); err != nil {
		s.fail(c, err)
		return
	}
	boxes, err := s.Fleet.Boxes(c.Request.Context(), who.TenantID)
	if err != nil {
		s.fail(c, err)
		return
	}
	out := api.AppStatus{App: app, Boxes: []api.AppBoxStatus{}}
	for _, b := range boxes {
		objs, _, err := s.Desired.Live(ctx, b.ID)
		if err != nil {
			s.fail(c, err)
			return
		}
		row := api.AppBoxStatus{BoxID: b.ID, BoxName: b.Name, Online: s.Sessions.Presence(b.ID).Online}
		found := false
		for _, o := range objs {
			if w := o.GetWorkload(); w != nil && o.GetName() == app {
				row.DesiredRelease, found = w.GetRelease(), true
			}
		}
		sts, err := s.Desired.Statuses(ctx, b.ID)
		if err != nil {
			s.fail(c, err)
			return
		}
		for _, st := range sts {
			if st.GetKind() == edgeboxv1.KindWorkload && st.GetName() == app {
				v := statusView(st)
				row.RunningRelease, row.Phase, row.Message, row.Health, row.UpdatedAt = v.Release, v.Phase, v.Message, v.Health, v.UpdatedAt
				row.Address, row.Ports, row.EgressRefused, row.Restarts = v.Address, v.Ports, v.EgressRefused, v.Restarts
				found = true
			}
		}
		if found {
			out.Boxes = append(out.Boxes, row)
		}
	}
	sort.Slice(out.Boxes, func(i, j int) bool { return out.Boxes[i].BoxName < out.Boxes[j].BoxName })
	c.JSON(http.StatusOK, out)
}

func (s *server) workloadLogs(c *gin.Context) {
	b, ok := s.findBox(c)
	if !ok {
		return
	}
	name := c.Param("name")
	if !edgeboxv1.ValidObjectName(name) {
		fail(c, errdefs.Invalid("workload name %q is not valid", name))
		return
	}
	tail := 200
	if t := c.Query("tail"); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil || n < 0 || n > 10000 {
			fail(c, errdefs.Invalid("tail %q: use a number of lines from 0 to 10000", t))
			return
		}
		tail = n
	}
	if !s.Sessions.Presence(b.ID).Online {
		fail(c, errdefs.Unavailable("box %s is offline; its logs stay on the box until it is back", b.Name))
		return
	}
	ctx, cancel := context.WithTimeout(c.Request.Context(), 20*time.Second)
	defer cancel()
	resp, err := s.Agents.Logs(ctx, b.ID, name, uint32(tail))
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, api.Logs{Text: string(resp.GetText()), Truncated: resp.GetTruncated()})
}
