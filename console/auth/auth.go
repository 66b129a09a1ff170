// Package auth checks the bearer tokens of API callers. Tokens are random
// 32-byte strings; the console stores only their SHA-256, so a stolen
// store yields no usable token.
//
// Records live on the console's store (console/store), as JSON:
//
//	auth/tokens/<sha256 of the token, hex>  -> APIToken
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

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
	Name      string    `json:"name"`
	TenantID  string    `json:"tenant_id"`
	Role      string    `json:"role"` // "admin" for now
	CreatedAt time.Time `json:"created_at"`
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
	b := make([]byte, 32)
	rand.Read(b)
	text := TokenPrefix + base64.RawURLEncoding.EncodeToString(b)
	raw, err := json.Marshal(rec)
	if err != nil {
		return "", err
	}
	res, err := store.CAS(ctx, t.s, keyOf(text), 0, raw)
	switch {
	case err != nil:
		return "", fmt.Errorf("auth: creating token %s: %w", rec.Name, err)
	case !res.Succeeded:
		return "", errdefs.Conflict("auth: a token of the same hash exists; try again")
	}
	return text, nil
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
	return rec, nil
}
