package httpapi

import (
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console/keys"
	"github.com/edgebox/edgebox/errdefs"
)

func keyView(k keys.Key) api.Key {
	return api.Key{ID: k.ID, BoxID: k.BoxID, Port: k.Port, VendorID: k.VendorID, ProductID: k.ProductID, Serial: k.Serial,
		Manufacturer: k.Manufacturer, Product: k.Product, Class: k.Class, Switchable: k.Switchable, State: k.State, Broken: k.Broken,
		Labels: k.Labels, Holder: k.Holder, HolderBox: k.HolderBox, LeasedAt: k.LeasedAt, LeasedBy: k.LeasedBy, LastChange: k.LastChange}
}

func (s *server) listKeys(c *gin.Context) {
	f := keys.Filter{Labels: map[string]string{}}
	if box := c.Query("box"); box != "" {
		b, ok := s.lookupBox(c, box)
		if !ok {
			return
		}
		f.Box = b.ID
	}
	for _, l := range c.QueryArray("label") {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			fail(c, errdefs.Invalid("label %q: write name=value", l))
			return
		}
		f.Labels[k] = v
	}
	all, err := s.Keys.List(c.Request.Context(), caller(c).TenantID, f)
	if err != nil {
		s.fail(c, err)
		return
	}
	out := api.KeyList{Keys: make([]api.Key, 0, len(all))}
	for _, k := range all {
		out.Keys = append(out.Keys, keyView(k))
	}
	c.JSON(http.StatusOK, out)
}

func (s *server) getKey(c *gin.Context) {
	k, _, err := s.Keys.Get(c.Request.Context(), caller(c).TenantID, c.Param("key"))
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, keyView(k))
}

func (s *server) labelKey(c *gin.Context) {
	var req api.LabelRequest
	if !bindJSON(c, &req) {
		return
	}
	k, err := s.Keys.Label(c.Request.Context(), caller(c), c.Param("key"), req.Labels)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, keyView(k))
}

func (s *server) leaseKey(c *gin.Context) {
	var req api.LeaseRequest
	if !bindJSON(c, &req) {
		return
	}
	box := ""
	if req.Box != "" {
		b, ok := s.lookupBox(c, req.Box) // another tenant's box is not found
		if !ok {
			return
		}
		box = b.ID
	}
	k, err := s.Keys.Attach(c.Request.Context(), caller(c), c.Param("key"), req.Workload, box)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, keyView(k))
}

func (s *server) releaseKey(c *gin.Context) {
	k, err := s.Keys.Release(c.Request.Context(), caller(c), c.Param("key"))
	if err != nil {
		s.fail(c, err)
		return
	}
	if b, err := s.Fleet.Box(c.Request.Context(), caller(c).TenantID, k.BoxID); err == nil && s.Apps != nil {
		// An app on the box waiting for such a key gets it now.
		s.Apps.SyncBox(c.Request.Context(), b)
	}
	c.JSON(http.StatusOK, keyView(k))
}

func (s *server) keyHistory(c *gin.Context) {
	h, err := s.Keys.History(c.Request.Context(), caller(c).TenantID, c.Param("key"))
	if err != nil {
		s.fail(c, err)
		return
	}
	out := api.KeyHistory{Key: c.Param("key"), Events: make([]api.KeyEvent, 0, len(h))}
	for _, e := range h {
		out.Events = append(out.Events, api.KeyEvent{Time: e.Time, Event: e.Event, Workload: e.Workload, Actor: e.Actor, Detail: e.Detail})
	}
	c.JSON(http.StatusOK, out)
}
