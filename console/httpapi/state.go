package httpapi

import (
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console/desired"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// maxSpecBytes bounds one desired object's spec.
const maxSpecBytes = 256 << 10

func (s *server) boxState(c *gin.Context) {
	b, ok := s.findBox(c)
	if !ok {
		return
	}
	ctx := c.Request.Context()
	objs, rev, err := s.Desired.Live(ctx, b.ID)
	if err != nil {
		s.fail(c, err)
		return
	}
	acked, err := s.Desired.Acked(ctx, b.ID)
	if err != nil {
		s.fail(c, err)
		return
	}
	sts, err := s.Desired.Statuses(ctx, b.ID)
	if err != nil {
		s.fail(c, err)
		return
	}
	evs, err := s.Desired.Events(ctx, b.ID)
	if err != nil {
		s.fail(c, err)
		return
	}
	out := api.BoxState{BoxID: b.ID, Revision: rev, Acked: acked, Objects: []api.DesiredObject{},
		Statuses: make([]api.ObjectStatus, 0, len(sts)), Events: make([]api.Event, 0, len(evs))}
	for _, o := range objs {
		spec, err := desired.SpecJSON(o)
		if err != nil {
			s.fail(c, err)
			return
		}
		out.Objects = append(out.Objects, api.DesiredObject{Kind: o.Kind, Name: o.Name, Revision: o.Revision, Spec: spec})
	}
	for _, st := range sts {
		out.Statuses = append(out.Statuses, statusView(st))
	}
	for _, e := range evs {
		out.Events = append(out.Events, api.Event{Time: time.Unix(0, e.TimeUnixNano).UTC(), Kind: e.Kind, Name: e.Name,
			Reason: e.Reason, Message: e.Message, Warning: e.Warning})
	}
	c.JSON(http.StatusOK, out)
}

// statusView is what a box reported of one object, as the API shows it.
func statusView(st *edgeboxv1.ObjectStatus) api.ObjectStatus {
	return api.ObjectStatus{Kind: st.GetKind(), Name: st.GetName(), ObservedRevision: st.GetObservedRevision(),
		Phase: st.GetPhase(), Message: st.GetMessage(), UpdatedAt: time.Unix(0, st.GetUpdatedUnixNano()).UTC(),
		Release: st.GetRelease(), Health: st.GetHealth(),
		Address: st.GetAddress(), Ports: slices.Clone(st.GetPorts()), EgressRefused: st.GetEgressRefused(), Restarts: st.GetRestarts()}
}

func (s *server) putDesired(c *gin.Context) {
	b, ok := s.findBox(c)
	if !ok {
		return
	}
	kind, name := c.Param("kind"), c.Param("name")
	raw, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, maxSpecBytes))
	if err != nil {
		fail(c, errdefs.Invalid("request body: %v (at most %d KiB)", err, maxSpecBytes>>10))
		return
	}
	o, err := desired.FromJSON(kind, name, raw)
	if err != nil {
		fail(c, err)
		return
	}
	rev, err := s.Desired.PutBy(c.Request.Context(), caller(c), b.ID, o)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, api.Revision{Revision: rev})
}

func (s *server) deleteDesired(c *gin.Context) {
	b, ok := s.findBox(c)
	if !ok {
		return
	}
	kind, name := c.Param("kind"), c.Param("name")
	if err := edgeboxv1.CheckKey(kind, name); err != nil {
		fail(c, errdefs.Wrap(errdefs.ErrInvalid, err))
		return
	}
	rev, err := s.Desired.DeleteBy(c.Request.Context(), caller(c), b.ID, kind, name)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, api.Revision{Revision: rev})
}
