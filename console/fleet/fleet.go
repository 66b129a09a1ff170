// Package fleet is the console's record of boxes and enrollment tokens:
// who a box is, where it sits (region, site, labels), whether it is
// approved or revoked, and the tokens that let new boxes in. Every record
// belongs to a tenant. Records live in bbolt (see console/db); revocations
// are also kept in memory so the tunnel can check them at every handshake
// without a disk read.
package fleet

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/db"
	"github.com/edgebox/edgebox/enroll"
	"github.com/edgebox/edgebox/errdefs"
)

// DefaultTenant owns everything until tenants are managed.
const DefaultTenant = "default"

// BoxState is where a box stands with the console.
type BoxState string

const (
	StatePending  BoxState = "pending"  // enrolled, waiting for approval
	StateApproved BoxState = "approved" // may work
	StateRevoked  BoxState = "revoked"  // refused at every handshake
)

// Box is the console's record of one box.
type Box struct {
	ID           string            `json:"id"`
	TenantID     string            `json:"tenant_id"`
	Name         string            `json:"name"`
	Region       string            `json:"region"`
	Site         string            `json:"site"`
	Labels       map[string]string `json:"labels,omitempty"`
	State        BoxState          `json:"state"`
	Hostname     string            `json:"hostname,omitempty"`
	OS           string            `json:"os,omitempty"`
	Arch         string            `json:"arch,omitempty"`
	OSVersion    string            `json:"os_version,omitempty"`
	AgentVersion string            `json:"agent_version,omitempty"`
	Capability   uint32            `json:"capability_version,omitempty"`
	CPUs         uint32            `json:"cpus,omitempty"`
	MemoryBytes  uint64            `json:"memory_bytes,omitempty"`
	EnrolledAt   time.Time         `json:"enrolled_at"`
	TokenID      string            `json:"token_id,omitempty"`
	CertNotAfter time.Time         `json:"cert_not_after"`
	LastSeen     time.Time         `json:"last_seen,omitzero"`
	// Wipe is set when the box was revoked with a wipe (wipe.go).
	Wipe *Wipe `json:"wipe,omitempty"`
}

// EnrollToken is the console's record of an enrollment token. The secret
// itself is never stored, only its SHA-256.
type EnrollToken struct {
	ID              string            `json:"id"`
	TenantID        string            `json:"tenant_id"`
	Region          string            `json:"region"`
	Site            string            `json:"site"`
	Labels          map[string]string `json:"labels,omitempty"`
	RequireApproval bool              `json:"require_approval"`
	Uses            int               `json:"uses"` // allowed
	Used            int               `json:"used"` // so far
	ExpiresAt       time.Time         `json:"expires_at"`
	CreatedAt       time.Time         `json:"created_at"`
	CreatedBy       string            `json:"created_by"`
	Revoked         bool              `json:"revoked"`
	SecretHash      []byte            `json:"secret_hash"`
}

// Fleet reads and changes boxes and tokens. It is safe for concurrent use.
type Fleet struct {
	db  *bolt.DB
	now func() time.Time

	mu      sync.RWMutex        // guards revoked
	revoked map[string]struct{} // box IDs refused at handshake
}

// New loads the revocation set and returns a Fleet.
func New(bdb *bolt.DB, now func() time.Time) (*Fleet, error) {
	if now == nil {
		now = time.Now
	}
	f := &Fleet{db: bdb, now: now, revoked: make(map[string]struct{})}
	err := bdb.View(func(tx *bolt.Tx) error {
		return tx.Bucket(db.Boxes).ForEach(func(k, v []byte) error {
			var b Box
			if err := json.Unmarshal(v, &b); err != nil {
				return fmt.Errorf("fleet: box %s: %w", k, err)
			}
			if b.State == StateRevoked {
				f.revoked[b.ID] = struct{}{}
			}
			return nil
		})
	})
	return f, err
}

var (
	labelKeyRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?$`)
	placeRE    = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

// ValidatePlace checks a region or site name.
func ValidatePlace(what, s string) error {
	if !placeRE.MatchString(s) {
		return errdefs.Invalid("%s %q: use 1-63 lower-case letters, digits and '-'", what, s)
	}
	return nil
}

// ValidateLabels checks label keys and values.
func ValidateLabels(l map[string]string) error {
	if len(l) > 32 {
		return errdefs.Invalid("at most 32 labels")
	}
	for k, v := range l {
		if !labelKeyRE.MatchString(k) {
			return errdefs.Invalid("label key %q: use lower-case letters, digits, '.', '_', '/', '-'", k)
		}
		if len(v) > 128 || strings.ContainsAny(v, "\n\r\x00") {
			return errdefs.Invalid("label %s: value must be one line of at most 128 characters", k)
		}
	}
	return nil
}

// TokenSpec is what an operator asks for when creating a token.
type TokenSpec struct {
	Region, Site    string
	Labels          map[string]string
	TTL             time.Duration
	Uses            int
	RequireApproval bool
}

// Validate checks the spec.
func (s TokenSpec) Validate() error {
	if err := ValidatePlace("region", s.Region); err != nil {
		return err
	}
	if err := ValidatePlace("site", s.Site); err != nil {
		return err
	}
	if s.TTL < time.Minute || s.TTL > 30*24*time.Hour {
		return errdefs.Invalid("token lifetime %v: use 1m to 720h", s.TTL)
	}
	if s.Uses < 1 || s.Uses > 10000 {
		return errdefs.Invalid("token uses %d: use 1 to 10000", s.Uses)
	}
	return ValidateLabels(s.Labels)
}

// CreateToken records a new token and returns it; only then is its secret
// ever known.
func (f *Fleet) CreateToken(who audit.Actor, spec TokenSpec, consoleURL string, caHash, keyPin [32]byte) (enroll.Token, EnrollToken, error) {
	if err := spec.Validate(); err != nil {
		return enroll.Token{}, EnrollToken{}, err
	}
	tok := enroll.Token{ConsoleURL: consoleURL, CAHash: caHash, KeyPin: keyPin,
		ID: make([]byte, enroll.IDLen), Secret: make([]byte, enroll.SecretLen)}
	rand.Read(tok.ID)
	rand.Read(tok.Secret)
	h := tok.SecretHash()
	now := f.now()
	rec := EnrollToken{
		ID: tok.IDString(), TenantID: who.TenantID, Region: spec.Region, Site: spec.Site,
		Labels: spec.Labels, RequireApproval: spec.RequireApproval, Uses: spec.Uses,
		ExpiresAt: now.Add(spec.TTL).UTC(), CreatedAt: now.UTC(), CreatedBy: who.Name, SecretHash: h[:],
	}
	err := f.db.Update(func(tx *bolt.Tx) error {
		if err := put(tx, db.Tokens, rec.ID, rec); err != nil {
			return err
		}
		return audit.AppendTx(tx, now, audit.Entry{TenantID: who.TenantID, Actor: who.Name, Remote: who.Remote,
			Action: "token.create", Target: rec.ID, Result: "ok",
			Detail: fmt.Sprintf("region=%s site=%s uses=%d ttl=%s approval=%t", spec.Region, spec.Site, spec.Uses, spec.TTL, spec.RequireApproval)})
	})
	return tok, rec, err
}

// Tokens lists a tenant's tokens, newest first.
func (f *Fleet) Tokens(tenant string) ([]EnrollToken, error) {
	var out []EnrollToken
	err := f.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(db.Tokens).ForEach(func(k, v []byte) error {
			var t EnrollToken
			if err := json.Unmarshal(v, &t); err != nil {
				return err
			}
			if t.TenantID == tenant {
				out = append(out, t)
			}
			return nil
		})
	})
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out, err
}

// RevokeToken stops a token from enrolling more boxes.
func (f *Fleet) RevokeToken(who audit.Actor, id string) error {
	return f.db.Update(func(tx *bolt.Tx) error {
		var t EnrollToken
		if err := get(tx, db.Tokens, id, &t); err != nil || t.TenantID != who.TenantID {
			return errdefs.NotFound("no token %q", id)
		}
		t.Revoked = true
		if err := put(tx, db.Tokens, id, t); err != nil {
			return err
		}
		return audit.AppendTx(tx, f.now(), audit.Entry{TenantID: who.TenantID, Actor: who.Name, Remote: who.Remote,
			Action: "token.revoke", Target: id, Result: "ok"})
	})
}

// Enrollment is what Enroll needs besides the token.
type Enrollment struct {
	Token    enroll.Token
	Hostname string
	Name     string
	Labels   map[string]string // asked for by the box; the token's win
	Remote   string
	// Issue signs the certificate for the new box ID; it runs inside the
	// transaction so a token use and a certificate go together.
	Issue func(boxID string) (certPEM []byte, notAfter time.Time, err error)
}

// Enroll spends one use of a token and records a new box. The errors say,
// for the person at the box, why a token was refused.
func (f *Fleet) Enroll(e Enrollment) (Box, []byte, error) {
	var box Box
	var cert []byte
	now := f.now()
	// A refusal reads as an answer to the person at the box.
	refuse := func(why string) error { return errdefs.Permission("%s", why) }
	err := f.db.Update(func(tx *bolt.Tx) error {
		var t EnrollToken
		if err := get(tx, db.Tokens, e.Token.IDString(), &t); err != nil {
			return refuse("this enrollment token is not known to the console; create a new one with 'edgebox token create'")
		}
		switch {
		case !e.Token.SecretMatches(t.SecretHash):
			return refuse("this enrollment token is not valid; copy it again or create a new one")
		case t.Revoked:
			return refuse("this enrollment token was revoked; create a new one with 'edgebox token create'")
		case !now.Before(t.ExpiresAt):
			return refuse(fmt.Sprintf("this enrollment token expired at %s; create a new one with 'edgebox token create'", t.ExpiresAt.Format(time.RFC3339)))
		case t.Used >= t.Uses:
			return refuse(fmt.Sprintf("this enrollment token was already used (%d of %d uses); create a new one with 'edgebox token create'", t.Used, t.Uses))
		}
		t.Used++
		if err := put(tx, db.Tokens, t.ID, t); err != nil {
			return err
		}
		id := newBoxID()
		name := e.Name
		if name == "" {
			name = sanitizeName(e.Hostname, id)
		}
		certPEM, notAfter, err := e.Issue(id)
		if err != nil {
			return err
		}
		labels := make(map[string]string, len(e.Labels)+len(t.Labels))
		for k, v := range e.Labels {
			labels[k] = v
		}
		for k, v := range t.Labels {
			labels[k] = v
		}
		if err := ValidateLabels(labels); err != nil {
			return err
		}
		if len(labels) == 0 {
			labels = nil
		}
		box = Box{ID: id, TenantID: t.TenantID, Name: name, Region: t.Region, Site: t.Site,
			Labels: labels, State: StateApproved, Hostname: e.Hostname, EnrolledAt: now.UTC(),
			TokenID: t.ID, CertNotAfter: notAfter.UTC()}
		if t.RequireApproval {
			box.State = StatePending
		}
		cert = certPEM
		if err := put(tx, db.Boxes, id, box); err != nil {
			return err
		}
		return audit.AppendTx(tx, now, audit.Entry{TenantID: t.TenantID, Actor: "box:" + id, Remote: e.Remote,
			Action: "box.enroll", Target: id, Result: "ok",
			Detail: fmt.Sprintf("token=%s name=%s region=%s site=%s state=%s", t.ID, name, t.Region, t.Site, box.State)})
	})
	if err != nil && errors.Is(err, errdefs.ErrPermission) {
		// The enrollment rolled back; its refusal is audited on its own.
		f.db.Update(func(tx *bolt.Tx) error {
			return audit.AppendTx(tx, now, audit.Entry{TenantID: DefaultTenant, Actor: "enroll", Remote: e.Remote,
				Action: "box.enroll", Target: "token:" + e.Token.IDString(), Result: err.Error()})
		})
	}
	return box, cert, err
}

func newBoxID() string {
	b := make([]byte, 10)
	rand.Read(b)
	return "bx-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

func sanitizeName(host, id string) string {
	if enroll.ValidName(host) {
		return host
	}
	return id
}

// Box returns one box of a tenant.
func (f *Fleet) Box(tenant, id string) (Box, error) {
	var b Box
	err := f.db.View(func(tx *bolt.Tx) error { return get(tx, db.Boxes, id, &b) })
	if err != nil || b.TenantID != tenant {
		return Box{}, errdefs.NotFound("no box %q", id)
	}
	return b, nil
}

// BoxByID returns a box whatever its tenant: for what a box itself says,
// whose identity its certificate proved.
func (f *Fleet) BoxByID(id string) (Box, error) {
	var b Box
	if err := f.db.View(func(tx *bolt.Tx) error { return get(tx, db.Boxes, id, &b) }); err != nil {
		return Box{}, errdefs.NotFound("no box %q", id)
	}
	return b, nil
}

// Boxes lists a tenant's boxes by name.
func (f *Fleet) Boxes(tenant string) ([]Box, error) {
	var out []Box
	err := f.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(db.Boxes).ForEach(func(k, v []byte) error {
			var b Box
			if err := json.Unmarshal(v, &b); err != nil {
				return err
			}
			if b.TenantID == tenant {
				out = append(out, b)
			}
			return nil
		})
	})
	sort.Slice(out, func(i, j int) bool {
		return out[i].Name < out[j].Name || out[i].Name == out[j].Name && out[i].ID < out[j].ID
	})
	return out, err
}

// IsApproved reports whether a box is approved: enrolled, out of the
// waiting room and not revoked.
func (f *Fleet) IsApproved(id string) (bool, error) {
	var b Box
	err := f.db.View(func(tx *bolt.Tx) error { return get(tx, db.Boxes, id, &b) })
	if err != nil {
		return false, err
	}
	return b.State == StateApproved, nil
}

// IsRevoked reports whether a box is refused; it reads only memory.
func (f *Fleet) IsRevoked(id string) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	_, ok := f.revoked[id]
	return ok
}

// UpdateBox applies change to a tenant's box and records the action.
func (f *Fleet) UpdateBox(who audit.Actor, id, action, detail string, change func(*Box) error) (Box, error) {
	var b Box
	err := f.db.Update(func(tx *bolt.Tx) error {
		if err := get(tx, db.Boxes, id, &b); err != nil || b.TenantID != who.TenantID {
			return errdefs.NotFound("no box %q", id)
		}
		if err := change(&b); err != nil {
			return err
		}
		if err := put(tx, db.Boxes, id, b); err != nil {
			return err
		}
		return audit.AppendTx(tx, f.now(), audit.Entry{TenantID: who.TenantID, Actor: who.Name, Remote: who.Remote,
			Action: action, Target: id, Result: "ok", Detail: detail})
	})
	if err == nil && b.State == StateRevoked {
		f.mu.Lock()
		f.revoked[id] = struct{}{}
		f.mu.Unlock()
	}
	return b, err
}

// Revoke marks a box revoked: its certificate is refused from now on.
func (f *Fleet) Revoke(who audit.Actor, id string) (Box, error) {
	return f.UpdateBox(who, id, "box.revoke", "", func(b *Box) error {
		b.State = StateRevoked
		return nil
	})
}

// Approve lets a waiting box work.
func (f *Fleet) Approve(who audit.Actor, id string) (Box, error) {
	return f.UpdateBox(who, id, "box.approve", "", func(b *Box) error {
		switch b.State {
		case StateRevoked:
			return errdefs.Conflict("box %s is revoked; enroll it again with a new token", id)
		case StateApproved:
			return errdefs.Conflict("box %s is already approved", id)
		}
		b.State = StateApproved
		return nil
	})
}

// Label sets (value non-empty) or removes (value empty) labels.
func (f *Fleet) Label(who audit.Actor, id string, set map[string]string) (Box, error) {
	detail := make([]string, 0, len(set))
	for k, v := range set {
		detail = append(detail, k+"="+v)
	}
	sort.Strings(detail)
	return f.UpdateBox(who, id, "box.label", strings.Join(detail, ","), func(b *Box) error {
		next := make(map[string]string, len(b.Labels)+len(set))
		for k, v := range b.Labels {
			next[k] = v
		}
		for k, v := range set {
			if v == "" {
				delete(next, k)
			} else {
				next[k] = v
			}
		}
		if err := ValidateLabels(next); err != nil {
			return err
		}
		b.Labels = next
		return nil
	})
}

// Facts are what an agent reports about itself on connect.
type Facts struct {
	Hostname, OS, Arch, OSVersion, AgentVersion string
	Capability                                  uint32
	CPUs                                        uint32
	MemoryBytes                                 uint64
}

// ReportFacts stores what a box said about itself (not audited: it is the
// box's own report, not a change by anyone). Reports from many boxes at
// once (a fleet reconnecting) share one transaction and one fsync.
func (f *Fleet) ReportFacts(id string, facts Facts, seen time.Time) (Box, error) {
	var b Box
	err := f.db.Batch(func(tx *bolt.Tx) error {
		if err := get(tx, db.Boxes, id, &b); err != nil {
			return errdefs.NotFound("no box %q", id)
		}
		b.Hostname, b.OS, b.Arch, b.OSVersion = facts.Hostname, facts.OS, facts.Arch, facts.OSVersion
		b.AgentVersion, b.Capability, b.CPUs, b.MemoryBytes = facts.AgentVersion, facts.Capability, facts.CPUs, facts.MemoryBytes
		b.LastSeen = seen.UTC()
		return put(tx, db.Boxes, id, b)
	})
	return b, err
}

// RecordSeen stores last-seen times for many boxes in one transaction.
func (f *Fleet) RecordSeen(seen map[string]time.Time) error {
	if len(seen) == 0 {
		return nil
	}
	return f.db.Update(func(tx *bolt.Tx) error {
		for id, t := range seen {
			var b Box
			if get(tx, db.Boxes, id, &b) != nil {
				continue
			}
			b.LastSeen = t.UTC()
			if err := put(tx, db.Boxes, id, b); err != nil {
				return err
			}
		}
		return nil
	})
}

// Renewed records a box's new certificate expiry.
func (f *Fleet) Renewed(id string, notAfter time.Time) error {
	return f.db.Update(func(tx *bolt.Tx) error {
		var b Box
		if err := get(tx, db.Boxes, id, &b); err != nil {
			return errdefs.NotFound("no box %q", id)
		}
		b.CertNotAfter = notAfter.UTC()
		if err := put(tx, db.Boxes, id, b); err != nil {
			return err
		}
		return audit.AppendTx(tx, f.now(), audit.Entry{TenantID: b.TenantID, Actor: "box:" + id,
			Action: "box.renew", Target: id, Result: "ok", Detail: "certificate valid until " + notAfter.UTC().Format(time.RFC3339)})
	})
}

func get(tx *bolt.Tx, bucket []byte, key string, v any) error {
	raw := tx.Bucket(bucket).Get([]byte(key))
	if raw == nil {
		return errdefs.ErrNotFound
	}
	return json.Unmarshal(raw, v)
}

func put(tx *bolt.Tx, bucket []byte, key string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return tx.Bucket(bucket).Put([]byte(key), raw)
}
