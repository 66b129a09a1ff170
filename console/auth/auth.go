// Package auth checks the bearer tokens of API callers. Tokens are random
// 32-byte strings; the console stores only their SHA-256, so a stolen
// database yields no usable token.
package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgebox/edgebox/console/db"
	"github.com/edgebox/edgebox/errdefs"
)

// TokenPrefix starts every API token, so a leaked one is easy to spot.
const TokenPrefix = "ebxa_"

// APIToken is the stored record of an API token.
type APIToken struct {
	Name      string    `json:"name"`
	TenantID  string    `json:"tenant_id"`
	Role      string    `json:"role"` // "admin" for now
	CreatedAt time.Time `json:"created_at"`
}

// Tokens issues and checks API tokens.
type Tokens struct{ db *bolt.DB }

// New returns Tokens on an opened database.
func New(bdb *bolt.DB) *Tokens { return &Tokens{db: bdb} }

func hashKey(tok string) []byte {
	h := sha256.Sum256([]byte(tok))
	return []byte(hex.EncodeToString(h[:]))
}

// Any reports whether any API token exists yet.
func (t *Tokens) Any() (bool, error) {
	var any bool
	err := t.db.View(func(tx *bolt.Tx) error {
		k, _ := tx.Bucket(db.APITokens).Cursor().First()
		any = k != nil
		return nil
	})
	return any, err
}

// Create stores a new token and returns its text, which is never
// retrievable again.
func (t *Tokens) Create(rec APIToken) (string, error) {
	b := make([]byte, 32)
	rand.Read(b)
	text := TokenPrefix + base64.RawURLEncoding.EncodeToString(b)
	raw, err := json.Marshal(rec)
	if err != nil {
		return "", err
	}
	err = t.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(db.APITokens).Put(hashKey(text), raw) })
	return text, err
}

// Check returns the record of a presented token.
func (t *Tokens) Check(text string) (APIToken, error) {
	var rec APIToken
	if len(text) > 200 {
		return rec, errdefs.Permission("API token is not valid")
	}
	err := t.db.View(func(tx *bolt.Tx) error {
		raw := tx.Bucket(db.APITokens).Get(hashKey(text))
		if raw == nil {
			return errdefs.Permission("API token is not valid; check EDGEBOX_TOKEN or run 'edgebox login'")
		}
		return json.Unmarshal(raw, &rec)
	})
	return rec, err
}
