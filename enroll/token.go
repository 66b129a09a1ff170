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
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/edgebox/edgebox/errdefs"
)

// Token layout: "ebx1." + base64url(fields), where fields is a sequence of
// (u8 type, u8 length, value). Unknown types are skipped, so fields can be
// added without a new version.
//
// The last field is always the check: CRC-32C (big-endian) of "ebx1."
// followed by every field byte before it. One character changed, dropped
// or added anywhere in the text fails the check (a CRC finds every change
// confined to 32 bits, and a base64 character is 6), so a mistyped token
// is refused as mistyped instead of yielding a wrong URL or hash. Agents
// from before the check skip it as an unknown field, so they still enroll
// with new tokens. This parser requires it: tokens without one (made
// before it) are refused as mistyped too. Accepting them would let every
// typo in the check field's own header pass as an old token, and tokens
// live at most 30 days and are made again with one command.
const (
	tokenPrefix   = "ebx1."
	MaxTokenLen   = 800 // characters of token text
	fieldURL      = 1
	fieldCAHash   = 2
	fieldID       = 3
	fieldSecret   = 4
	fieldKeyPin   = 5 // SHA-256 of the console serving key's SubjectPublicKeyInfo
	fieldCheck    = 6 // CRC-32C of the prefix and every field before it; last
	fieldAlso     = 7 // the console's other addresses, host:port separated by commas
	checkLen      = 4
	IDLen         = 9
	SecretLen     = 24
	maxURLLen     = 200
	maxAlsoLen    = 160 // bytes of the other addresses, commas included
	MaxAlso       = 8   // other addresses in a token
	sha256Len     = sha256.Size
	fieldsMaximum = 16
)

// ErrBadToken is wrapped by every token parsing error. It is of kind
// errdefs.ErrInvalid.
var ErrBadToken = errdefs.Wrap(errdefs.ErrInvalid, errors.New("enroll: not a valid enrollment token"))

// ErrMistyped is wrapped, with ErrBadToken, when the token's text fails
// its check: a character was changed, lost or added on its way from the
// console to the box.
var ErrMistyped = errors.New("this token was mistyped")

// castagnoli is the CRC-32C table of the token check.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// tokenText is the base64url alphabet the token's fields are written in:
// strict, so a changed last character cannot hide in unused bits.
var tokenText = base64.RawURLEncoding.Strict()

func checkOf(fields []byte) uint32 {
	return crc32.Update(crc32.Checksum([]byte(tokenPrefix), castagnoli), castagnoli, fields)
}

// Token is a parsed enrollment token.
type Token struct {
	ConsoleURL string // https://host:port
	// Also are the same console's other addresses (host:port): its
	// replicas, where no one name reaches them all. A box tries them, and
	// ConsoleURL's, in a random order. Agents from before them skip the
	// field and use ConsoleURL alone.
	Also   []string
	CAHash [32]byte // SHA-256 of the console CA certificate (DER)
	KeyPin [32]byte // SHA-256 of the console serving key (SPKI DER); zero if absent
	ID     []byte   // names the token on the console
	Secret []byte   // proves the holder may use it; the console keeps only its hash
}

// String encodes the token as the text an operator pastes.
func (t Token) String() string {
	var b []byte
	add := func(typ byte, v []byte) {
		b = append(b, typ, byte(len(v)))
		b = append(b, v...)
	}
	add(fieldURL, []byte(t.ConsoleURL))
	if len(t.Also) > 0 {
		add(fieldAlso, []byte(strings.Join(t.Also, ",")))
	}
	add(fieldCAHash, t.CAHash[:])
	if t.KeyPin != ([32]byte{}) {
		add(fieldKeyPin, t.KeyPin[:])
	}
	add(fieldID, t.ID)
	add(fieldSecret, t.Secret)
	add(fieldCheck, binary.BigEndian.AppendUint32(nil, checkOf(b)))
	return tokenPrefix + tokenText.EncodeToString(b)
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

// ParseToken parses token text, accepting surrounding white space. Text
// that fails the check is refused with ErrMistyped (and ErrBadToken).
func ParseToken(s string) (Token, error) {
	s = strings.TrimSpace(s)
	if len(s) > MaxTokenLen {
		return Token{}, fmt.Errorf("%w: %d characters, at most %d", ErrBadToken, len(s), MaxTokenLen)
	}
	if !strings.HasPrefix(s, tokenPrefix) {
		if mistypedPrefix(s) {
			return Token{}, mistyped("its start should read " + tokenPrefix)
		}
		return Token{}, fmt.Errorf("%w: it should start with %q", ErrBadToken, tokenPrefix)
	}
	b, ok := checked(s[len(tokenPrefix):])
	if !ok {
		return Token{}, mistyped("its checksum does not match")
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
		case fieldAlso:
			t.Also = strings.Split(string(v), ",")
		}
	}
	if err := t.Validate(); err != nil {
		return Token{}, err
	}
	return t, nil
}

func mistyped(why string) error {
	return fmt.Errorf("%w: %w (%s): copy it again, whole, or create a new one with 'edgebox token create'", ErrBadToken, ErrMistyped, why)
}

// checked decodes the text after the prefix and returns its fields
// without the check field, if the check field is last and matches.
func checked(text string) ([]byte, bool) {
	b, err := tokenText.DecodeString(text)
	n := len(b) - 2 - checkLen
	if err != nil || n < 0 || b[n] != fieldCheck || b[n+1] != checkLen {
		return nil, false
	}
	return b[:n], binary.BigEndian.Uint32(b[n+2:]) == checkOf(b[:n])
}

// mistypedPrefix reports whether s is a token whose prefix had one
// character changed, lost or added: the rest then passes the check, which
// covers the right prefix. A token of another version (another prefix in
// its check) does not.
func mistypedPrefix(s string) bool {
	for k := len(tokenPrefix) - 1; k <= len(tokenPrefix)+1 && k <= len(s); k++ {
		if oneEditApart(s[:k], tokenPrefix) {
			if _, ok := checked(s[k:]); ok {
				return true
			}
		}
	}
	return false
}

// oneEditApart reports whether a becomes b by at most one substitution,
// deletion or insertion of a byte.
func oneEditApart(a, b string) bool {
	if len(a) > len(b) {
		a, b = b, a
	}
	if len(b)-len(a) > 1 {
		return false
	}
	i := 0
	for i < len(a) && a[i] == b[i] {
		i++
	}
	if len(a) == len(b) {
		return i == len(a) || a[i+1:] == b[i+1:]
	}
	return a[i:] == b[i+1:]
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
	if err := ValidateAlso(t.Also); err != nil {
		return fmt.Errorf("%w: %v", ErrBadToken, err)
	}
	return nil
}

// ValidateAlso checks a console's other addresses: at most MaxAlso, each
// a host and a port, all of them in at most 160 bytes with their commas.
func ValidateAlso(also []string) error {
	if len(also) > MaxAlso {
		return fmt.Errorf("%d other console addresses; at most %d", len(also), MaxAlso)
	}
	if n := len(strings.Join(also, ",")); n > maxAlsoLen {
		return fmt.Errorf("the other console addresses take %d bytes; at most %d (give the replicas one DNS name instead)", n, maxAlsoLen)
	}
	for _, a := range also {
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" || strings.ContainsAny(a, ",/@ ") {
			return fmt.Errorf("console address %q must look like host:port", a)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("console address %q: port must be 1-65535", a)
		}
	}
	return nil
}

// Addrs returns every host:port the console answers on: ConsoleURL's
// first, then the others.
func (t Token) Addrs() []string {
	u, err := ParseConsoleURL(t.ConsoleURL)
	if err != nil {
		return slices.Clone(t.Also)
	}
	return append([]string{HostPort(u)}, t.Also...)
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
