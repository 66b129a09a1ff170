// Package enroll is the enrollment contract between a box and its console:
// the text of an enrollment token and the request that trades a token and a
// certificate signing request for a box certificate. A token carries all a
// box needs, the console URL and the SHA-256 of the console CA, so enrolling
// trusts nothing that was not pinned.
package enroll

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Token layout: "ebx1." + base64url(fields), where fields is a sequence of
// (u8 type, u8 length, value). Unknown types are skipped, so fields can be
// added without a new version.
const (
	tokenPrefix   = "ebx1."
	MaxTokenLen   = 600 // characters of token text
	fieldURL      = 1
	fieldCAHash   = 2
	fieldID       = 3
	fieldSecret   = 4
	fieldKeyPin   = 5 // SHA-256 of the console serving key's SubjectPublicKeyInfo
	IDLen         = 9
	SecretLen     = 24
	maxURLLen     = 200
	sha256Len     = sha256.Size
	fieldsMaximum = 16
)

// ErrBadToken is wrapped by every token parsing error.
var ErrBadToken = errors.New("enroll: not a valid enrollment token")

// Token is a parsed enrollment token.
type Token struct {
	ConsoleURL string   // https://host:port
	CAHash     [32]byte // SHA-256 of the console CA certificate (DER)
	KeyPin     [32]byte // SHA-256 of the console serving key (SPKI DER); zero if absent
	ID         []byte   // names the token on the console
	Secret     []byte   // proves the holder may use it; the console keeps only its hash
}

// String encodes the token as the text an operator pastes.
func (t Token) String() string {
	var b []byte
	add := func(typ byte, v []byte) {
		b = append(b, typ, byte(len(v)))
		b = append(b, v...)
	}
	add(fieldURL, []byte(t.ConsoleURL))
	add(fieldCAHash, t.CAHash[:])
	if t.KeyPin != ([32]byte{}) {
		add(fieldKeyPin, t.KeyPin[:])
	}
	add(fieldID, t.ID)
	add(fieldSecret, t.Secret)
	return tokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// IDString is the token ID as shown to operators.
func (t Token) IDString() string { return hex.EncodeToString(t.ID) }

// SecretHash is what the console stores instead of the secret.
func (t Token) SecretHash() [32]byte { return sha256.Sum256(t.Secret) }

// SecretMatches reports in constant time whether the secret hashes to h.
func (t Token) SecretMatches(h []byte) bool {
	got := t.SecretHash()
	return subtle.ConstantTimeCompare(got[:], h) == 1
}

// ParseToken parses token text, accepting surrounding white space.
func ParseToken(s string) (Token, error) {
	s = strings.TrimSpace(s)
	if len(s) > MaxTokenLen {
		return Token{}, fmt.Errorf("%w: %d characters, at most %d", ErrBadToken, len(s), MaxTokenLen)
	}
	if !strings.HasPrefix(s, tokenPrefix) {
		return Token{}, fmt.Errorf("%w: it should start with %q", ErrBadToken, tokenPrefix)
	}
	b, err := base64.RawURLEncoding.DecodeString(s[len(tokenPrefix):])
	if err != nil {
		return Token{}, fmt.Errorf("%w: it was cut or changed while copying (%v)", ErrBadToken, err)
	}
	var t Token
	seen := map[byte]bool{}
	for n := 0; len(b) > 0; n++ {
		if n == fieldsMaximum || len(b) < 2 || len(b) < 2+int(b[1]) {
			return Token{}, fmt.Errorf("%w: it was cut while copying", ErrBadToken)
		}
		typ, v := b[0], b[2:2+int(b[1])]
		b = b[2+int(b[1]):]
		if seen[typ] {
			return Token{}, fmt.Errorf("%w: field %d twice", ErrBadToken, typ)
		}
		seen[typ] = true
		switch typ {
		case fieldURL:
			t.ConsoleURL = string(v)
		case fieldCAHash:
			if len(v) != sha256Len {
				return Token{}, fmt.Errorf("%w: CA hash of %d bytes", ErrBadToken, len(v))
			}
			copy(t.CAHash[:], v)
		case fieldKeyPin:
			if len(v) != sha256Len {
				return Token{}, fmt.Errorf("%w: key pin of %d bytes", ErrBadToken, len(v))
			}
			copy(t.KeyPin[:], v)
		case fieldID:
			t.ID = append([]byte(nil), v...)
		case fieldSecret:
			t.Secret = append([]byte(nil), v...)
		}
	}
	if err := t.Validate(); err != nil {
		return Token{}, err
	}
	return t, nil
}

// Validate checks that every required field is present and sane.
func (t Token) Validate() error {
	if len(t.ID) != IDLen || len(t.Secret) != SecretLen {
		return fmt.Errorf("%w: missing or short ID or secret", ErrBadToken)
	}
	if t.CAHash == ([32]byte{}) {
		return fmt.Errorf("%w: no console CA hash", ErrBadToken)
	}
	if _, err := ParseConsoleURL(t.ConsoleURL); err != nil {
		return fmt.Errorf("%w: %v", ErrBadToken, err)
	}
	return nil
}

// ParseConsoleURL checks a console URL: https, a host, no path beyond "/".
func ParseConsoleURL(s string) (*url.URL, error) {
	if len(s) == 0 || len(s) > maxURLLen {
		return nil, fmt.Errorf("console URL must be 1-%d characters", maxURLLen)
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("console URL %q: %v", s, err)
	}
	if u.Scheme != "https" || u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("console URL %q must look like https://host:port", s)
	}
	return u, nil
}

// HostPort returns the console's host:port, 443 when the URL has none.
func HostPort(u *url.URL) string {
	if u.Port() == "" {
		return u.Hostname() + ":443"
	}
	return u.Host
}
