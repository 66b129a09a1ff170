// Package fleet is the console's record of boxes and enrollment tokens:
// who a box is, where it sits (region, site, labels), whether it is
// approved or revoked, and the tokens that let new boxes in. Every record
// belongs to a tenant and names it; keys do not, so a box is found by its
// ID alone (BoxByID, for what a box says of itself).
//
// Records live on the console's store (console/store), as JSON:
//
//	fleet/boxes/<box id>      -> Box
//	fleet/tokens/<token id>   -> EnrollToken (the secret only hashed)
//	fleet/revoked/<box id>    -> the box's tenant ID; written in the
//	                             transaction that revokes the box
//
// A change is read, then written in one transaction guarded on the
// record's revision, with its audit entry (console/audit); when another
// writer got there first, it is read and tried again. Revocations are also
// kept in memory, so the tunnel checks them at every handshake without a
// store read; Run keeps that set in step with the store's revoked keys, so
// a box revoked through another console sharing the store is refused too.
package fleet

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/store"
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
	// PeerAddrs are where the box takes its site peers' probes (its LAN
	// addresses with the probe port), as its facts say.
	PeerAddrs    []string  `json:"peer_addrs,omitempty"`
	EnrolledAt   time.Time `json:"enrolled_at"`
	TokenID      string    `json:"token_id,omitempty"`
	CertNotAfter time.Time `json:"cert_not_after"`
	LastSeen     time.Time `json:"last_seen,omitzero"`
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
	s   store.Store
	now func() time.Time

	// enrolling is held by the enrollment being written: enrollments
	// spend uses of the same few tokens, so in one console they take
	// turns rather than lose their guarded writes to each other.
	enrolling chan struct{}

	mu sync.RWMutex // guards revoked and rev
	// revoked holds the boxes refused at handshake, each with the store
	// revision that revoked it (or that it was first read at).
	revoked map[string]int64
	// rev is the revision the set is complete up to: the watch goes on
	// from rev+1.
	rev int64

	// OnRevoked, when set before Run, is called with each box the watch
	// finds newly revoked, wherever the revocation was written: a
	// console among replicas ends the tunnel it holds of a box another
	// revoked. It must not block.
	OnRevoked func(id string)
}

// Keys on the store.
const (
	// Prefix holds every key of fleet's.
	Prefix        = "fleet/"
	boxesPrefix   = Prefix + "boxes/"
	tokensPrefix  = Prefix + "tokens/"
	RevokedPrefix = Prefix + "revoked/"
)

// BoxKey, TokenKey and RevokedKey are where a box, an enrollment token and
// a box's revocation are kept.
func BoxKey(id string) string     { return boxesPrefix + id }
func TokenKey(id string) string   { return tokensPrefix + id }
func RevokedKey(id string) string { return RevokedPrefix + id }

// maxTries bounds the retries of a read-modify-write that keeps losing to
// other writers of the same record.
const maxTries = 50

// lost waits before try n+1 of a read-modify-write that lost to another
// writer: a random wait up to 1 ms doubling to 32 ms, so writers that all
// lost to the same commit do not all come back in the next one together.
func lost(ctx context.Context, n int) error {
	t := time.NewTimer(mathrand.N(time.Millisecond << min(n, 5)))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// maxTxnOps is how many records one transaction of RecordSeen writes:
// below etcd's default limit of 128 operations (and 128 guards) per
// transaction.
const maxTxnOps = 100

// New loads the revocation set from s and returns a Fleet; Run keeps the
// set in step with the store. now nil is time.Now.
func New(ctx context.Context, s store.Store, now func() time.Time) (*Fleet, error) {
	if now == nil {
		now = time.Now
	}
	f := &Fleet{s: s, now: now, revoked: make(map[string]int64), enrolling: make(chan struct{}, 1)}
	if err := f.load(ctx); err != nil {
		return nil, err
	}
	return f, nil
}

// load reads the revocation set as the store has it now. A revocation this
// Fleet learned after that read (its own, just written) is kept.
func (f *Fleet) load(ctx context.Context) error {
	kvs, rev, err := f.s.Range(ctx, RevokedPrefix, 0)
	if err != nil {
		return fmt.Errorf("fleet: loading revocations: %w", err)
	}
	next := make(map[string]int64, len(kvs))
	for _, kv := range kvs {
		next[strings.TrimPrefix(kv.Key, RevokedPrefix)] = kv.ModRevision
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, r := range f.revoked {
		if r > rev {
			next[id] = r
		}
	}
	f.revoked, f.rev = next, rev
	return nil
}

// Run keeps the revocation set in step with the store, so that a box
// revoked by another console sharing the store is refused here too. It
// follows a watch from the revision New loaded at; when the watch ends
// (history compacted, an etcd leader lost) it loads the set again and
// watches on, trying again with a growing pause while the store fails. It
// returns nil when ctx ends; an error when the store is closed, or when
// the set could not be brought up to date for StaleAfter.
func (f *Fleet) Run(ctx context.Context) error {
	var failing time.Time // since when nothing worked; zero while it does
	pause := 100 * time.Millisecond
	for {
		f.mu.RLock()
		from := f.rev + 1
		f.mu.RUnlock()
		err := f.follow(ctx, f.s.Watch(ctx, RevokedPrefix, from))
		if err == nil && ctx.Err() == nil {
			// Ended without a word, as a watch does when its store
			// closes: ask the store whether it still works.
			_, err = f.s.Txn(ctx, store.Txn{})
			if err == nil {
				err = errors.New("the watch ended")
			}
		}
		if err == nil || !errors.Is(err, store.ErrCompacted) {
			// Not a compaction, which a load mends at once: pause before
			// trying again, so a failing store is not spun on.
			if ctx.Err() == nil && errors.Is(err, store.ErrClosed) {
				return fmt.Errorf("fleet: watching revocations: %w", err)
			}
			if !sleep(ctx, pause) {
				return nil
			}
			pause = min(2*pause, 5*time.Second)
		}
		if ctx.Err() != nil {
			return nil
		}
		if err := f.load(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, store.ErrClosed) {
				return err
			}
			if failing.IsZero() {
				failing = time.Now()
			} else if time.Since(failing) > StaleAfter {
				return fmt.Errorf("%w (failing for %v: revocations by other consoles are not seen)", err, time.Since(failing).Round(time.Second))
			}
			continue
		}
		failing, pause = time.Time{}, 100*time.Millisecond
	}
}

// StaleAfter is how long Run goes on trying while the store fails, before
// it gives up: the revocation set may miss other consoles' revocations for
// that long.
const StaleAfter = time.Minute

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// follow applies a watch's events until it ends, and returns its error.
func (f *Fleet) follow(ctx context.Context, w <-chan store.WatchResponse) error {
	for resp := range w {
		if resp.Err != nil {
			return resp.Err
		}
		var newly []string
		f.mu.Lock()
		for _, ev := range resp.Events {
			id, rev := strings.TrimPrefix(ev.KV.Key, RevokedPrefix), ev.KV.ModRevision
			switch ev.Type {
			case store.EventPut:
				if _, ok := f.revoked[id]; !ok {
					f.revoked[id] = rev
				}
				newly = append(newly, id)
			case store.EventDelete:
				if f.revoked[id] < rev {
					delete(f.revoked, id)
				}
			}
			f.rev = max(f.rev, rev)
		}
		f.mu.Unlock()
		if f.OnRevoked != nil {
			for _, id := range newly {
				f.OnRevoked(id)
			}
		}
	}
	return nil
}

// markRevoked records a revocation this Fleet wrote at rev.
func (f *Fleet) markRevoked(id string, rev int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.revoked[id]; !ok {
		f.revoked[id] = rev
	}
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
// MaxTokenUses bounds how many boxes one enrollment token may enroll: a
// region's whole fleet, installed from one pasted command.
const MaxTokenUses = 100000

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
	if s.Uses < 1 || s.Uses > MaxTokenUses {
		return errdefs.Invalid("token uses %d: use 1 to %d", s.Uses, MaxTokenUses)
	}
	return ValidateLabels(s.Labels)
}

// CreateToken records a new token and returns it; only then is its secret
// ever known.
func (f *Fleet) CreateToken(ctx context.Context, who audit.Actor, spec TokenSpec, consoleURL string, caHash, keyPin [32]byte) (enroll.Token, EnrollToken, error) {
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
	res, err := f.s.Txn(ctx, store.Txn{
		If: []store.Cmp{{Key: TokenKey(rec.ID)}},
		Then: []store.Op{jsonOp(TokenKey(rec.ID), rec), audit.Op(now, who.Did("token.create", rec.ID,
			fmt.Sprintf("region=%s site=%s uses=%d ttl=%s approval=%t", spec.Region, spec.Site, spec.Uses, spec.TTL, spec.RequireApproval)))},
	})
	switch {
	case err != nil:
		return enroll.Token{}, EnrollToken{}, fmt.Errorf("fleet: creating token: %w", err)
	case !res.Succeeded:
		// 16 random bytes met another token's ID.
		return enroll.Token{}, EnrollToken{}, errdefs.Conflict("token ID %s is taken; try again", rec.ID)
	}
	return tok, rec, nil
}

// Tokens lists a tenant's tokens, newest first.
func (f *Fleet) Tokens(ctx context.Context, tenant string) ([]EnrollToken, error) {
	out, err := listRecords[EnrollToken](ctx, f.s, tokensPrefix, func(t EnrollToken) bool { return t.TenantID == tenant })
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out, err
}

// RevokeToken stops a token from enrolling more boxes.
func (f *Fleet) RevokeToken(ctx context.Context, who audit.Actor, id string) error {
	for try := range maxTries {
		if try > 0 {
			if err := lost(ctx, try); err != nil {
				return err
			}
		}
		var t EnrollToken
		rev, err := get(ctx, f.s, TokenKey(id), &t)
		if errors.Is(err, errdefs.ErrNotFound) || err == nil && t.TenantID != who.TenantID {
			return errdefs.NotFound("no token %q", id)
		} else if err != nil {
			return err
		}
		t.Revoked = true
		res, err := f.s.Txn(ctx, store.Txn{
			If:   []store.Cmp{{Key: TokenKey(id), ModRevision: rev}},
			Then: []store.Op{jsonOp(TokenKey(id), t), audit.Op(f.now(), who.Did("token.revoke", id, ""))},
		})
		if err != nil {
			return fmt.Errorf("fleet: revoking token %s: %w", id, err)
		}
		if res.Succeeded {
			return nil
		}
	}
	return errdefs.Unavailable("token %s is changing too often; try again", id)
}

// Enrollment is what Enroll needs besides the token.
type Enrollment struct {
	Token    enroll.Token
	Hostname string
	Name     string
	Labels   map[string]string // asked for by the box; the token's win
	Remote   string
	// Issue signs the certificate for the new box ID. It may be called
	// more than once when other enrollments spend the same token at the
	// same moment; only the certificate of the box recorded is returned.
	Issue func(boxID string) (certPEM []byte, notAfter time.Time, err error)
}

// Enroll spends one use of a token and records a new box, in one store
// transaction with its audit entry. The errors say, for the person at the
// box, why a token was refused; a refusal is audited on its own.
func (f *Fleet) Enroll(ctx context.Context, e Enrollment) (Box, []byte, error) {
	select {
	case f.enrolling <- struct{}{}:
	case <-ctx.Done():
		return Box{}, nil, ctx.Err()
	}
	now := f.now()
	box, cert, err := f.enroll(ctx, e, now)
	<-f.enrolling
	if err != nil && errors.Is(err, errdefs.ErrPermission) {
		// Nothing was written; the refusal is audited on its own.
		_, aerr := f.s.Txn(ctx, store.Txn{Then: []store.Op{audit.Op(now, audit.Entry{TenantID: DefaultTenant,
			Actor: "enroll", Remote: e.Remote, Action: "box.enroll", Target: "token:" + e.Token.IDString(), Result: err.Error()})}})
		if aerr != nil {
			err = errors.Join(err, fmt.Errorf("fleet: auditing the refusal: %w", aerr))
		}
	}
	return box, cert, err
}

func (f *Fleet) enroll(ctx context.Context, e Enrollment, now time.Time) (Box, []byte, error) {
	// A refusal reads as an answer to the person at the box.
	refuse := func(why string) error { return errdefs.Permission("%s", why) }
	for try := range maxTries {
		if try > 0 {
			if err := lost(ctx, try); err != nil {
				return Box{}, nil, err
			}
		}
		var t EnrollToken
		trev, err := get(ctx, f.s, TokenKey(e.Token.IDString()), &t)
		if errors.Is(err, errdefs.ErrNotFound) {
			return Box{}, nil, refuse("this enrollment token is not known to the console; create a new one with 'edgebox token create'")
		} else if err != nil {
			return Box{}, nil, err
		}
		switch {
		case !e.Token.SecretMatches(t.SecretHash):
			return Box{}, nil, refuse("this enrollment token is not valid; copy it again or create a new one")
		case t.Revoked:
			return Box{}, nil, refuse("this enrollment token was revoked; create a new one with 'edgebox token create'")
		case !now.Before(t.ExpiresAt):
			return Box{}, nil, refuse(fmt.Sprintf("this enrollment token expired at %s; create a new one with 'edgebox token create'", t.ExpiresAt.Format(time.RFC3339)))
		case t.Used >= t.Uses:
			return Box{}, nil, refuse(fmt.Sprintf("this enrollment token was already used (%d of %d uses); create a new one with 'edgebox token create'", t.Used, t.Uses))
		}
		t.Used++
		id := newBoxID()
		name := e.Name
		if name == "" {
			name = sanitizeName(e.Hostname, id)
		}
		labels := make(map[string]string, len(e.Labels)+len(t.Labels))
		for k, v := range e.Labels {
			labels[k] = v
		}
		for k, v := range t.Labels {
			labels[k] = v
		}
		if err := ValidateLabels(labels); err != nil {
			return Box{}, nil, err
		}
		if len(labels) == 0 {
			labels = nil
		}
		certPEM, notAfter, err := e.Issue(id)
		if err != nil {
			return Box{}, nil, err
		}
		box := Box{ID: id, TenantID: t.TenantID, Name: name, Region: t.Region, Site: t.Site,
			Labels: labels, State: StateApproved, Hostname: e.Hostname, EnrolledAt: now.UTC(),
			TokenID: t.ID, CertNotAfter: notAfter.UTC()}
		if t.RequireApproval {
			box.State = StatePending
		}
		res, err := f.s.Txn(ctx, store.Txn{
			If: []store.Cmp{{Key: TokenKey(t.ID), ModRevision: trev}, {Key: BoxKey(id)}},
			Then: []store.Op{jsonOp(TokenKey(t.ID), t), jsonOp(BoxKey(id), box),
				audit.Op(now, audit.Entry{TenantID: t.TenantID, Actor: "box:" + id, Remote: e.Remote,
					Action: "box.enroll", Target: id, Result: "ok",
					Detail: fmt.Sprintf("token=%s name=%s region=%s site=%s state=%s", t.ID, name, t.Region, t.Site, box.State)})},
		})
		if err != nil {
			return Box{}, nil, fmt.Errorf("fleet: enrolling: %w", err)
		}
		if res.Succeeded {
			return box, certPEM, nil
		}
	}
	return Box{}, nil, errdefs.Unavailable("the console is busy enrolling other boxes with this token; try again")
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
func (f *Fleet) Box(ctx context.Context, tenant, id string) (Box, error) {
	b, err := f.BoxByID(ctx, id)
	if err == nil && b.TenantID != tenant {
		return Box{}, errdefs.NotFound("no box %q", id)
	}
	return b, err
}

// BoxByID returns a box whatever its tenant: for what a box itself says,
// whose identity its certificate proved.
func (f *Fleet) BoxByID(ctx context.Context, id string) (Box, error) {
	var b Box
	if _, err := get(ctx, f.s, BoxKey(id), &b); errors.Is(err, errdefs.ErrNotFound) {
		return Box{}, errdefs.NotFound("no box %q", id)
	} else if err != nil {
		return Box{}, err
	}
	return b, nil
}

// Boxes lists a tenant's boxes by name.
func (f *Fleet) Boxes(ctx context.Context, tenant string) ([]Box, error) {
	out, err := listRecords[Box](ctx, f.s, boxesPrefix, func(b Box) bool { return b.TenantID == tenant })
	sort.Slice(out, func(i, j int) bool {
		return out[i].Name < out[j].Name || out[i].Name == out[j].Name && out[i].ID < out[j].ID
	})
	return out, err
}

// IsApproved reports whether a box is approved: enrolled, out of the
// waiting room and not revoked.
func (f *Fleet) IsApproved(ctx context.Context, id string) (bool, error) {
	b, err := f.BoxByID(ctx, id)
	if err != nil {
		return false, err
	}
	return b.State == StateApproved, nil
}

// IsRevoked reports whether a box is refused; it reads only memory. It is
// true as soon as a Revoke of this Fleet returns, and as soon as Run sees
// a revocation written by another console on the same store.
func (f *Fleet) IsRevoked(id string) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	_, ok := f.revoked[id]
	return ok
}

// UpdateBox applies change to a tenant's box and records the action, in
// one store transaction. change may run more than once, when another
// writer changed the box meanwhile.
func (f *Fleet) UpdateBox(ctx context.Context, who audit.Actor, id, action, detail string, change func(*Box) error) (Box, error) {
	return f.update(ctx, id, func(b *Box) (*audit.Entry, error) {
		if b.TenantID != who.TenantID {
			return nil, errdefs.NotFound("no box %q", id)
		}
		if err := change(b); err != nil {
			return nil, err
		}
		e := who.Did(action, id, detail)
		return &e, nil
	})
}

// update reads a box, changes it and writes it back with the audit entry
// change returns (none if nil), unless another writer changed the box
// meanwhile; then it tries again. A box that becomes revoked gets its
// revocation key in the same transaction.
func (f *Fleet) update(ctx context.Context, id string, change func(*Box) (*audit.Entry, error)) (Box, error) {
	for try := range maxTries {
		if try > 0 {
			if err := lost(ctx, try); err != nil {
				return Box{}, err
			}
		}
		var b Box
		rev, err := get(ctx, f.s, BoxKey(id), &b)
		if errors.Is(err, errdefs.ErrNotFound) {
			return Box{}, errdefs.NotFound("no box %q", id)
		} else if err != nil {
			return Box{}, err
		}
		was := b.State
		e, err := change(&b)
		if err != nil {
			return Box{}, err
		}
		ops := []store.Op{jsonOp(BoxKey(id), b)}
		revoking := b.State == StateRevoked && was != StateRevoked
		if revoking {
			ops = append(ops, store.Op{Key: RevokedKey(id), Value: []byte(b.TenantID)})
		}
		if e != nil {
			ops = append(ops, audit.Op(f.now(), *e))
		}
		res, err := f.s.Txn(ctx, store.Txn{If: []store.Cmp{{Key: BoxKey(id), ModRevision: rev}}, Then: ops})
		if err != nil {
			return Box{}, fmt.Errorf("fleet: box %s: %w", id, err)
		}
		if res.Succeeded {
			if revoking {
				f.markRevoked(id, res.Revision)
			}
			return b, nil
		}
	}
	return Box{}, errdefs.Unavailable("box %s is changing too often; try again", id)
}

// Revoke marks a box revoked: its certificate is refused from now on.
func (f *Fleet) Revoke(ctx context.Context, who audit.Actor, id string) (Box, error) {
	return f.UpdateBox(ctx, who, id, "box.revoke", "", func(b *Box) error {
		b.State = StateRevoked
		return nil
	})
}

// Approve lets a waiting box work.
func (f *Fleet) Approve(ctx context.Context, who audit.Actor, id string) (Box, error) {
	return f.UpdateBox(ctx, who, id, "box.approve", "", func(b *Box) error {
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
func (f *Fleet) Label(ctx context.Context, who audit.Actor, id string, set map[string]string) (Box, error) {
	detail := make([]string, 0, len(set))
	for k, v := range set {
		detail = append(detail, k+"="+v)
	}
	sort.Strings(detail)
	return f.UpdateBox(ctx, who, id, "box.label", strings.Join(detail, ","), func(b *Box) error {
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
	PeerAddrs                                   []string
}

func (a Facts) equal(b Facts) bool {
	return a.Hostname == b.Hostname && a.OS == b.OS && a.Arch == b.Arch && a.OSVersion == b.OSVersion &&
		a.AgentVersion == b.AgentVersion && a.Capability == b.Capability && a.CPUs == b.CPUs &&
		a.MemoryBytes == b.MemoryBytes && slices.Equal(a.PeerAddrs, b.PeerAddrs)
}

// ReportFacts stores what a box said about itself (not audited: it is the
// box's own report, not a change by anyone). Reports from many boxes at
// once (a fleet reconnecting) share the store's commits: the bbolt store
// applies every transaction waiting in one write and one fsync.
func (f *Fleet) ReportFacts(ctx context.Context, id string, facts Facts, seen time.Time) (Box, error) {
	// A box that says what the record says changes nothing worth a
	// write: its last-seen time reaches the record with the presence
	// tracker's next batch, within a minute. A fleet reconnecting after a
	// console restart costs the store reads, not a commit per box (on
	// etcd, a Raft proposal each).
	var b Box
	if _, err := get(ctx, f.s, BoxKey(id), &b); err == nil && b.facts().equal(facts) {
		return b, nil
	}
	return f.update(ctx, id, func(b *Box) (*audit.Entry, error) {
		b.Hostname, b.OS, b.Arch, b.OSVersion = facts.Hostname, facts.OS, facts.Arch, facts.OSVersion
		b.AgentVersion, b.Capability, b.CPUs, b.MemoryBytes = facts.AgentVersion, facts.Capability, facts.CPUs, facts.MemoryBytes
		b.PeerAddrs = slices.Clone(facts.PeerAddrs)
		b.LastSeen = seen.UTC()
		return nil, nil
	})
}

// facts are what the box last said about itself.
func (b Box) facts() Facts {
	return Facts{Hostname: b.Hostname, OS: b.OS, Arch: b.Arch, OSVersion: b.OSVersion, AgentVersion: b.AgentVersion,
		Capability: b.Capability, CPUs: b.CPUs, MemoryBytes: b.MemoryBytes, PeerAddrs: b.PeerAddrs}
}

// RecordSeen stores last-seen times for many boxes, up to maxTxnOps boxes
// per transaction. Boxes not on the store are skipped; a group of boxes
// that keeps changing under it is reported in the error, and the others
// are written still.
func (f *Fleet) RecordSeen(ctx context.Context, seen map[string]time.Time) error {
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var errs []error
	for len(ids) > 0 {
		n := min(len(ids), maxTxnOps)
		if err := f.recordSeen(ctx, ids[:n], seen); err != nil {
			if ctx.Err() != nil {
				return err
			}
			errs = append(errs, err)
		}
		ids = ids[n:]
	}
	return errors.Join(errs...)
}

func (f *Fleet) recordSeen(ctx context.Context, ids []string, seen map[string]time.Time) error {
	for range maxTries {
		var t store.Txn
		for _, id := range ids {
			var b Box
			rev, err := get(ctx, f.s, BoxKey(id), &b)
			if errors.Is(err, errdefs.ErrNotFound) {
				continue
			} else if err != nil {
				return err
			}
			b.LastSeen = seen[id].UTC()
			t.If = append(t.If, store.Cmp{Key: BoxKey(id), ModRevision: rev})
			t.Then = append(t.Then, jsonOp(BoxKey(id), b))
		}
		if len(t.Then) == 0 {
			return nil
		}
		res, err := f.s.Txn(ctx, t)
		if err != nil {
			return fmt.Errorf("fleet: recording last-seen times: %w", err)
		}
		if res.Succeeded {
			return nil
		}
	}
	return errdefs.Unavailable("fleet: last-seen times of boxes %s to %s: the boxes kept changing", ids[0], ids[len(ids)-1])
}

// Renewed records a box's new certificate expiry.
func (f *Fleet) Renewed(ctx context.Context, id string, notAfter time.Time) error {
	_, err := f.update(ctx, id, func(b *Box) (*audit.Entry, error) {
		b.CertNotAfter = notAfter.UTC()
		return &audit.Entry{TenantID: b.TenantID, Actor: "box:" + id, Action: "box.renew", Target: id, Result: "ok",
			Detail: "certificate valid until " + notAfter.UTC().Format(time.RFC3339)}, nil
	})
	return err
}

// get reads key into v and returns its ModRevision; a missing key is
// errdefs.ErrNotFound.
func get(ctx context.Context, s store.Store, key string, v any) (int64, error) {
	kv, err := s.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return 0, errdefs.ErrNotFound
	} else if err != nil {
		return 0, fmt.Errorf("fleet: %s: %w", key, err)
	}
	if err := json.Unmarshal(kv.Value, v); err != nil {
		return 0, fmt.Errorf("fleet: %s: %w", key, err)
	}
	return kv.ModRevision, nil
}

// list reads every record under prefix that keep accepts, a page at a time.
func listRecords[T any](ctx context.Context, s store.Store, prefix string, keep func(T) bool) ([]T, error) {
	var out []T
	after := ""
	for {
		kvs, _, err := s.Scan(ctx, prefix, after, 1000)
		if err != nil {
			return out, fmt.Errorf("fleet: listing %s: %w", prefix, err)
		}
		for _, kv := range kvs {
			var v T
			if err := json.Unmarshal(kv.Value, &v); err != nil {
				return out, fmt.Errorf("fleet: %s: %w", kv.Key, err)
			}
			if keep(v) {
				out = append(out, v)
			}
		}
		if len(kvs) < 1000 {
			return out, nil
		}
		after = kvs[len(kvs)-1].Key
	}
}

func jsonOp(key string, v any) store.Op {
	raw, err := json.Marshal(v)
	if err != nil {
		panic(err) // plain records of strings, numbers and times
	}
	return store.Op{Key: key, Value: raw}
}
