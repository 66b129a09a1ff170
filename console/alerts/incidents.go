package alerts

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/edgebox/edgebox/console/store"
)

// State is where an incident stands.
type State string

const (
	// Pending: the condition holds, not yet for its rule's minutes.
	Pending State = "pending"
	// Firing: it held long enough; the webhooks were told, unless a
	// silence covered it.
	Firing State = "firing"
	// Resolved: the condition no longer holds.
	Resolved State = "resolved"
)

// Incident is one condition of one thing, from when it began to hold to
// when it ended: it is notified once when it fires and once when it is
// resolved.
type Incident struct {
	ID       string `json:"id"`
	TenantID string `json:"tenant_id"`
	Kind     Kind   `json:"kind"`
	// Subject is what it is about ("box bx-…", "key …", "workload robot
	// on bx-…", "rollout …"); Summary says what holds now.
	Subject string `json:"subject"`
	Summary string `json:"summary"`
	// Box, BoxName, Site and Region place it, where it has a box.
	Box     string `json:"box,omitempty"`
	BoxName string `json:"box_name,omitempty"`
	Site    string `json:"site,omitempty"`
	Region  string `json:"region,omitempty"`
	State   State  `json:"state"`
	// Since is when the condition was first seen; FiredAt when the
	// incident fired; ResolvedAt when it ended.
	Since      time.Time `json:"since"`
	FiredAt    time.Time `json:"fired_at,omitzero"`
	ResolvedAt time.Time `json:"resolved_at,omitzero"`
	// Silenced: a silence covers it now (SilencedBy names it).
	Silenced   bool   `json:"silenced,omitempty"`
	SilencedBy string `json:"silenced_by,omitempty"`
	// Notified: the webhooks were told it fired, so they will be told
	// when it is resolved.
	Notified bool `json:"notified,omitempty"`
	// cond is the condition's key, which stays the same while it holds.
	Cond string `json:"cond"`
}

// condition is one thing holding one rule's condition now.
type condition struct {
	kind                       Kind
	key                        string // the same while it holds: kind and what it is about
	subject, summary           string
	box, boxName, site, region string
}

// The store's layout under alerts/:
//
//	alerts/rules/TENANT              Rules
//	alerts/open/TENANT/COND          Incident, pending or firing (COND: hash of its condition's key)
//	alerts/resolved/TENANT/NANOS-ID  Incident, resolved (the newest keepResolved a tenant)
//	alerts/silences/TENANT/ID        Silence
//	alerts/outbox/NANOS-ID           notice, until a webhook took it
func openPrefix(tenant string) string     { return "alerts/open/" + tenant + "/" }
func resolvedPrefix(tenant string) string { return "alerts/resolved/" + tenant + "/" }

const outboxPrefix = "alerts/outbox/"

// keepResolved is how many resolved incidents a tenant keeps.
const keepResolved = 500

func condID(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:12])
}

func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Open returns the tenant's incidents that are pending or firing, firing
// first, then the oldest first.
func (s *Service) Open(ctx context.Context, tenant string) ([]Incident, error) {
	kvs, _, err := s.cfg.Store.Range(ctx, openPrefix(tenant), 0)
	if err != nil {
		return nil, err
	}
	out := make([]Incident, 0, len(kvs))
	for _, kv := range kvs {
		var in Incident
		if err := json.Unmarshal(kv.Value, &in); err != nil {
			return nil, fmt.Errorf("alerts: %s: %w", kv.Key, err)
		}
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool {
		if (out[i].State == Firing) != (out[j].State == Firing) {
			return out[i].State == Firing
		}
		return out[i].Since.Before(out[j].Since)
	})
	return out, nil
}

// Resolved returns the tenant's resolved incidents, the latest first, at
// most limit of them.
func (s *Service) Resolved(ctx context.Context, tenant string, limit int) ([]Incident, error) {
	kvs, _, err := s.cfg.Store.Range(ctx, resolvedPrefix(tenant), 0)
	if err != nil {
		return nil, err
	}
	var out []Incident
	for i := len(kvs) - 1; i >= 0 && len(out) < limit; i-- {
		var in Incident
		if err := json.Unmarshal(kvs[i].Value, &in); err != nil {
			return nil, fmt.Errorf("alerts: %s: %w", kvs[i].Key, err)
		}
		out = append(out, in)
	}
	return out, nil
}

// evaluate brings the tenant's incidents in line with the conditions
// that hold now: it opens, fires, silences and resolves them, and puts
// the notices their webhooks are owed in the outbox in the same
// transaction as the change, so a notice is neither lost nor doubled by
// a crash. A change that meets another writer's waits for the next round.
func (s *Service) evaluate(ctx context.Context, tenant string) (counts map[[2]string]int, err error) {
	rules, _, err := s.rules(ctx, tenant)
	if err != nil {
		return nil, err
	}
	conds, err := s.conditions(ctx, tenant, rules)
	if err != nil {
		return nil, err
	}
	kvs, _, err := s.cfg.Store.Range(ctx, openPrefix(tenant), 0)
	if err != nil {
		return nil, err
	}
	silences, stale, err := s.silences(ctx, tenant)
	if err != nil {
		return nil, err
	}
	if len(stale) > 0 { // silences that ended a day ago go
		ops := make([]store.Op, len(stale))
		for i, k := range stale {
			ops[i] = store.Op{Key: k, Delete: true}
		}
		if _, err := s.cfg.Store.Txn(ctx, store.Txn{Then: ops}); err != nil {
			return nil, err
		}
	}
	now := s.cfg.Now().UTC()
	counts = map[[2]string]int{}
	open := map[string]store.KV{}
	for _, kv := range kvs {
		open[kv.Key] = kv
	}
	resolvedAny := false
	for _, c := range conds {
		key := openPrefix(tenant) + condID(c.key)
		kv, had := open[key]
		delete(open, key)
		var in Incident
		if had {
			if err := json.Unmarshal(kv.Value, &in); err != nil {
				return nil, fmt.Errorf("alerts: %s: %w", kv.Key, err)
			}
		} else {
			in = Incident{ID: newID(), TenantID: tenant, Kind: c.kind, Cond: c.key, State: Pending, Since: now}
		}
		in.Subject, in.Summary = c.subject, c.summary
		in.Box, in.BoxName, in.Site, in.Region = c.box, c.boxName, c.site, c.region
		rule, _ := rules.rule(c.kind)
		if in.State == Pending && now.Sub(in.Since) >= time.Duration(rule.ForMinutes)*time.Minute {
			in.State, in.FiredAt = Firing, now
		}
		var notices []notice
		if in.State == Firing {
			sil, ok := covering(silences, in, now)
			in.Silenced, in.SilencedBy = ok, sil.ID
			if !in.Silenced && !in.Notified {
				in.Notified = true
				notices = noticesFor(rules, in, "firing", now)
			}
		}
		counts[[2]string{string(in.Kind), string(in.State)}]++
		raw, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		if had && bytes.Equal(raw, kv.Value) {
			continue
		}
		ops := []store.Op{{Key: key, Value: raw}}
		if err := s.commit(ctx, store.Cmp{Key: key, ModRevision: kv.ModRevision}, ops, notices); err != nil {
			return nil, err
		}
	}
	// What no longer holds is resolved.
	for key, kv := range open {
		var in Incident
		if err := json.Unmarshal(kv.Value, &in); err != nil {
			return nil, fmt.Errorf("alerts: %s: %w", kv.Key, err)
		}
		ops := []store.Op{{Key: key, Delete: true}}
		var notices []notice
		if in.State == Firing {
			in.State, in.ResolvedAt = Resolved, now
			raw, err := json.Marshal(in)
			if err != nil {
				return nil, err
			}
			ops = append(ops, store.Op{Key: fmt.Sprintf("%s%020d-%s", resolvedPrefix(tenant), now.UnixNano(), in.ID), Value: raw})
			if in.Notified {
				notices = noticesFor(rules, in, "resolved", now)
			}
			resolvedAny = true
		}
		if err := s.commit(ctx, store.Cmp{Key: key, ModRevision: kv.ModRevision}, ops, notices); err != nil {
			return nil, err
		}
	}
	if resolvedAny {
		if err := s.trimResolved(ctx, tenant); err != nil {
			return nil, err
		}
	}
	return counts, nil
}

// commit writes ops and notices at once if guard holds; when it does
// not, another writer got there first, and the next round looks again.
func (s *Service) commit(ctx context.Context, guard store.Cmp, ops []store.Op, notices []notice) error {
	for _, n := range notices {
		raw, err := json.Marshal(n)
		if err != nil {
			return err
		}
		ops = append(ops, store.Op{Key: outboxPrefix + n.Key, Value: raw})
	}
	res, err := s.cfg.Store.Txn(ctx, store.Txn{If: []store.Cmp{guard}, Then: ops})
	if err != nil {
		return err
	}
	if res.Succeeded && len(notices) > 0 {
		s.wakeOutbox()
	}
	return nil
}

func (s *Service) trimResolved(ctx context.Context, tenant string) error {
	kvs, _, err := s.cfg.Store.Range(ctx, resolvedPrefix(tenant), 0)
	if err != nil || len(kvs) <= keepResolved {
		return err
	}
	var ops []store.Op
	for _, kv := range kvs[:len(kvs)-keepResolved] {
		ops = append(ops, store.Op{Key: kv.Key, Delete: true})
	}
	_, err = s.cfg.Store.Txn(ctx, store.Txn{Then: ops})
	return err
}
