// Package auth says who calls the console and what they may do: users
// with argon2id passwords and roles per tenant (Role, Permission), their
// API tokens and browser sessions, tenants, and a throttle on password
// guessing. Tokens and session cookies are random 32-byte strings; the
// console stores only their SHA-256, so a stolen store yields no usable
// credential.
//
// Records live on the console's store (console/store), as JSON:
//
//	auth/tokens/<sha256 of the token, hex>     -> APIToken
//	auth/users/<name>                          -> User
//	auth/tenants/<id>                          -> Tenant
//	auth/sessions/<sha256 of the cookie, hex>  -> Session
package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/edgebox/edgebox/console/audit"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/errdefs"
)

// TokenPrefix starts every API token, so a leaked one is easy to spot.
const TokenPrefix = "ebxa_"

// Prefix is where API tokens live on the store.
const Prefix = "auth/tokens/"

// Key is where the token whose SHA-256 is hashHex lives.
func Key(hashHex string) string { return Prefix + hashHex }

// APIToken is the stored record of an API token.
type APIToken struct {
	Name string `json:"name"`
	// User is the user the token acts for, with the user's roles as they
	// are at each call. A token from before users has none, and acts as
	// Role in TenantID.
	User      string    `json:"user,omitempty"`
	UserID    string    `json:"user_id,omitempty"` // the user's ID: a user made later under the name is another
	TenantID  string    `json:"tenant_id,omitempty"`
	Role      string    `json:"role,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt, when set, ends the token.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// TokenInfo is a token as listed: its record and its ID, the first 16
// hex digits of its hash, which names it for revoking.
type TokenInfo struct {
	ID string
	APIToken
}

// Tokens issues and checks API tokens. It is safe for concurrent use.
type Tokens struct{ s store.Store }

// New returns Tokens on the console's store.
func New(s store.Store) *Tokens { return &Tokens{s: s} }

func keyOf(tok string) string {
	h := sha256.Sum256([]byte(tok))
	return Key(hex.EncodeToString(h[:]))
}

// Any reports whether any API token exists yet.
func (t *Tokens) Any(ctx context.Context) (bool, error) {
	kvs, _, err := t.s.Range(ctx, Prefix, 1)
	if err != nil {
		return false, fmt.Errorf("auth: %w", err)
	}
	return len(kvs) > 0, nil
}

// Create stores a new token and returns its text, which is never
// retrievable again.
func (t *Tokens) Create(ctx context.Context, rec APIToken) (string, error) {
	text := NewTokenText()
	return text, t.Store(ctx, text, rec)
}

// NewTokenText returns the text of a new API token: TokenPrefix and 32
// random bytes.
func NewTokenText() string { return TokenPrefix + randomText(32) }

// Store keeps rec as the record of the token text, which NewTokenText
// made (for a caller that must show the text before it is stored), with
// the audit entries es in the same transaction.
func (t *Tokens) Store(ctx context.Context, text string, rec APIToken, es ...audit.Entry) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	ops := []store.Op{{Key: keyOf(text), Value: raw}}
	for _, e := range es {
		ops = append(ops, audit.Op(time.Now(), e))
	}
	res, err := t.s.Txn(ctx, store.Txn{If: []store.Cmp{{Key: keyOf(text)}}, Then: ops})
	switch {
	case err != nil:
		return fmt.Errorf("auth: creating token %s: %w", rec.Name, err)
	case !res.Succeeded:
		return errdefs.Conflict("auth: a token of the same hash exists; try again")
	}
	return nil
}

// Check returns the record of a presented token.
func (t *Tokens) Check(ctx context.Context, text string) (APIToken, error) {
	var rec APIToken
	if len(text) > 200 {
		return rec, errdefs.Permission("API token is not valid")
	}
	kv, err := t.s.Get(ctx, keyOf(text))
	if errors.Is(err, store.ErrNotFound) {
		return rec, errdefs.Permission("API token is not valid; check EDGEBOX_TOKEN or run 'edgebox login'")
	} else if err != nil {
		return rec, fmt.Errorf("auth: checking a token: %w", err)
	}
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		return rec, fmt.Errorf("auth: token record: %w", err)
	}
	if !rec.ExpiresAt.IsZero() && !time.Now().Before(rec.ExpiresAt) {
		return rec, errdefs.Permission("API token %q expired at %s; make another", rec.Name, rec.ExpiresAt.Format(time.RFC3339))
	}
	return rec, nil
}

// List returns the tokens of user, or every token when user is "".
func (t *Tokens) List(ctx context.Context, user string) ([]TokenInfo, error) {
	kvs, _, err := t.s.Range(ctx, Prefix, 0)
	if err != nil {
		return nil, fmt.Errorf("auth: listing tokens: %w", err)
	}
	var out []TokenInfo
	for _, kv := range kvs {
		var rec APIToken
		if err := json.Unmarshal(kv.Value, &rec); err != nil {
			return nil, fmt.Errorf("auth: token record: %w", err)
		}
		if user == "" || rec.User == user {
			out = append(out, TokenInfo{ID: tokenID(kv.Key), APIToken: rec})
		}
	}
	return out, nil
}

func tokenID(key string) string {
	h := key[len(Prefix):]
	return h[:min(16, len(h))]
}

// Revoke deletes the token of user (any user's, when user is "") whose ID
// is id, writing e in the same transaction.
func (t *Tokens) Revoke(ctx context.Context, user, id string, e audit.Entry) error {
	notFound := errdefs.NotFound("no API token %q", trunc(id))
	if len(id) != 16 || strings.Trim(id, "0123456789abcdef") != "" {
		return notFound
	}
	kvs, _, err := t.s.Range(ctx, Prefix+id, 2)
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	if len(kvs) != 1 {
		return notFound // none, or (against odds of 2^-64) two: name it by more
	}
	var rec APIToken
	if err := json.Unmarshal(kvs[0].Value, &rec); err != nil {
		return fmt.Errorf("auth: token record: %w", err)
	}
	if user != "" && rec.User != user {
		return notFound
	}
	res, err := t.s.Txn(ctx, store.Txn{If: []store.Cmp{{Key: kvs[0].Key, ModRevision: kvs[0].ModRevision}},
		Then: []store.Op{{Key: kvs[0].Key, Delete: true}, audit.Op(time.Now(), e)}})
	switch {
	case err != nil:
		return fmt.Errorf("auth: revoking token %s: %w", id, err)
	case !res.Succeeded:
		return notFound // revoked meanwhile
	}
	return nil
}

// Principal is an authenticated caller: who, through what, and the role
// it holds in each tenant.
type Principal struct {
	User   string
	UserID string
	Via    string // "session" or "token:<name>"
	Roles  map[string]Role
	// Legacy marks a token from before users: User is the token's name,
	// not a user's.
	Legacy bool
}

// Principal returns who a checked token acts for: its user, with the
// user's roles now; or, for a token from before users, its own role.
func (u *Users) Principal(ctx context.Context, rec APIToken) (Principal, error) {
	if rec.User == "" {
		return Principal{User: rec.Name, Via: "token:" + rec.Name, Roles: map[string]Role{rec.TenantID: Role(rec.Role)}, Legacy: true}, nil
	}
	usr, _, err := u.Get(ctx, rec.User)
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && usr.ID != rec.UserID) {
		return Principal{}, errdefs.Permission("API token %q belongs to a user who no longer exists", rec.Name)
	} else if err != nil {
		return Principal{}, err
	}
	return Principal{User: usr.Name, UserID: usr.ID, Via: "token:" + rec.Name, Roles: usr.Roles}, nil
}
