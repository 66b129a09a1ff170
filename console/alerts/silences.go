package alerts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
)

// Silence keeps the incidents it covers from the webhooks until Until:
// those of its kind, on its box (by ID or name) and in its site, for
// what it names. An incident that fires under a silence is notified when
// the silence ends, if it still fires then; one that ends under it is
// never notified.
type Silence struct {
	ID        string    `json:"id"`
	Kind      Kind      `json:"kind,omitempty"`
	Box       string    `json:"box,omitempty"`
	Site      string    `json:"site,omitempty"`
	Until     time.Time `json:"until"`
	Comment   string    `json:"comment,omitempty"`
	CreatedBy string    `json:"created_by,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// Bounds on silences.
const (
	MaxSilences     = 200
	MaxSilenceFor   = 30 * 24 * time.Hour
	maxComment      = 500
	maxSilenceField = 253
)

func silencesPrefix(tenant string) string { return "alerts/silences/" + tenant + "/" }

func (sil Silence) covers(in Incident, now time.Time) bool {
	if !now.Before(sil.Until) {
		return false
	}
	if sil.Kind != "" && sil.Kind != in.Kind {
		return false
	}
	if sil.Box != "" && sil.Box != in.Box && sil.Box != in.BoxName {
		return false
	}
	return sil.Site == "" || sil.Site == in.Site
}

func covering(sils []Silence, in Incident, now time.Time) (Silence, bool) {
	for _, sil := range sils {
		if sil.covers(in, now) {
			return sil, true
		}
	}
	return Silence{}, false
}

// Silences returns the tenant's silences that have not ended, the one
// that ends first first.
func (s *Service) Silences(ctx context.Context, tenant string) ([]Silence, error) {
	live, _, err := s.silences(ctx, tenant)
	return live, err
}

// silences reads the tenant's silences once: those that have not ended,
// sorted by their end, and the keys of those that ended a day ago or
// more, for the round to drop.
func (s *Service) silences(ctx context.Context, tenant string) (live []Silence, stale []string, err error) {
	kvs, _, err := s.cfg.Store.Range(ctx, silencesPrefix(tenant), 0)
	if err != nil {
		return nil, nil, err
	}
	now := s.cfg.Now()
	live = make([]Silence, 0, len(kvs))
	for _, kv := range kvs {
		var sil Silence
		if err := json.Unmarshal(kv.Value, &sil); err != nil {
			return nil, nil, fmt.Errorf("alerts: %s: %w", kv.Key, err)
		}
		switch {
		case now.Before(sil.Until):
			live = append(live, sil)
		case now.Sub(sil.Until) > 24*time.Hour:
			stale = append(stale, kv.Key)
		}
	}
	sort.Slice(live, func(i, j int) bool { return live[i].Until.Before(live[j].Until) })
	return live, stale, nil
}

// Silence adds a silence to the caller's tenant for d from now. It names
// at least a kind, a box or a site: silencing everything is a rules
// change, not a silence.
func (s *Service) Silence(ctx context.Context, who audit.Actor, sil Silence, d time.Duration) (Silence, error) {
	switch {
	case sil.Kind == "" && sil.Box == "" && sil.Site == "":
		return Silence{}, errdefs.Invalid("a silence names a kind, a box or a site")
	case d <= 0 || d > MaxSilenceFor:
		return Silence{}, errdefs.Invalid("a silence lasts more than 0 and at most %v", MaxSilenceFor)
	case len(sil.Comment) > maxComment:
		return Silence{}, errdefs.Invalid("the comment is longer than %d bytes", maxComment)
	case len(sil.Box) > maxSilenceField:
		return Silence{}, errdefs.Invalid("the box is longer than %d bytes", maxSilenceField)
	}
	if sil.Kind != "" {
		if err := (Rules{Rules: []Rule{{Kind: sil.Kind}}}).Validate(); err != nil {
			return Silence{}, err
		}
	}
	if sil.Site != "" {
		if err := fleet.ValidatePlace("site", sil.Site); err != nil {
			return Silence{}, errdefs.Invalid("%v", err)
		}
	}
	live, err := s.Silences(ctx, who.TenantID)
	if err != nil {
		return Silence{}, err
	}
	if len(live) >= MaxSilences {
		return Silence{}, errdefs.Invalid("the tenant has %d silences, the most it may: end one first", len(live))
	}
	now := s.cfg.Now().UTC()
	sil.ID, sil.CreatedBy, sil.CreatedAt, sil.Until = newID(), who.Name, now, now.Add(d)
	raw, err := json.Marshal(sil)
	if err != nil {
		return Silence{}, err
	}
	e := who.Did("alerts.silence", "silence/"+sil.ID, fmt.Sprintf("kind %q box %q site %q until %s: %s",
		sil.Kind, sil.Box, sil.Site, sil.Until.Format(time.RFC3339), sil.Comment))
	if _, err := s.cfg.Store.Txn(ctx, store.Txn{Then: []store.Op{{Key: silencesPrefix(who.TenantID) + sil.ID, Value: raw}, audit.Op(now, e)}}); err != nil {
		return Silence{}, err
	}
	s.Kick()
	return sil, nil
}

// Unsilence ends a silence of the caller's tenant now; the incidents it
// covered that still fire are notified.
func (s *Service) Unsilence(ctx context.Context, who audit.Actor, id string) error {
	if len(id) > 64 {
		return errdefs.NotFound("no silence %.64q", id)
	}
	key := silencesPrefix(who.TenantID) + id
	kv, err := s.cfg.Store.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return errdefs.NotFound("no silence %q", id)
	} else if err != nil {
		return err
	}
	e := who.Did("alerts.unsilence", "silence/"+id, "")
	res, err := s.cfg.Store.Txn(ctx, store.Txn{If: []store.Cmp{{Key: key, ModRevision: kv.ModRevision}},
		Then: []store.Op{{Key: key, Delete: true}, audit.Op(s.cfg.Now(), e)}})
	if err != nil {
		return err
	}
	if !res.Succeeded {
		return errdefs.Conflict("silence %s changed meanwhile; try again", id)
	}
	s.Kick()
	return nil
}
