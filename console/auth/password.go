package auth

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/crypto/argon2"

	"github.com/edgebox/edgebox/errdefs"
)

// Password bounds. The upper one keeps a hostile caller from making the
// console hash megabytes.
const (
	MinPassword = 10
	MaxPassword = 256
)

// HashParams are argon2id's costs. DefaultHashParams is RFC 9106's second
// recommended setting (64 MiB, 3 passes); one hash takes about 90 ms of one
// core here, which is what bounds how many logins a console does at once
// (Hasher).
type HashParams struct {
	Time    uint32
	Memory  uint32 // KiB
	Threads uint8
}

// DefaultHashParams are the costs of new hashes.
var DefaultHashParams = HashParams{Time: 3, Memory: 64 << 10, Threads: 1}

// Bounds on stored parameters: a stored hash is trusted no further than
// these, so a corrupted record cannot ask for a terabyte.
const (
	maxHashTime   = 16
	maxHashMemory = 1 << 20 // 1 GiB
	saltLen       = 16
	keyLen        = 32
)

// CheckPasswordRules says what is wrong with a new password, if anything.
func CheckPasswordRules(pw string) error {
	switch n := utf8.RuneCountInString(pw); {
	case !utf8.ValidString(pw):
		return errdefs.Invalid("a password must be valid UTF-8")
	case n < MinPassword:
		return errdefs.Invalid("a password needs at least %d characters", MinPassword)
	case len(pw) > MaxPassword:
		return errdefs.Invalid("a password may have at most %d bytes", MaxPassword)
	}
	return nil
}

// Hasher hashes and checks passwords with argon2id, at most Slots at
// once: each hash holds 64 MiB and a core for tens of milliseconds, so a
// burst of logins waits for a slot, up to Wait, and is then told to come
// back rather than taking the console's memory or the operators' CPU.
type Hasher struct {
	Params HashParams
	slots  chan struct{}
	wait   time.Duration
}

// NewHasher returns a Hasher with slots concurrent hashes, each caller
// waiting at most wait for one.
func NewHasher(p HashParams, slots int, wait time.Duration) *Hasher {
	return &Hasher{Params: p, slots: make(chan struct{}, max(slots, 1)), wait: wait}
}

// ErrBusy is the error of a hash that found no slot in time.
var ErrBusy = errdefs.Unavailable("the console is checking many passwords at once; try again in a few seconds")

func (h *Hasher) acquire(ctx context.Context) error {
	t := time.NewTimer(h.wait)
	defer t.Stop()
	select {
	case h.slots <- struct{}{}:
		return nil
	case <-t.C:
		return ErrBusy
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Hash returns pw's argon2id hash in the PHC string format:
// $argon2id$v=19$m=65536,t=3,p=1$<salt>$<key>, base64 without padding.
func (h *Hasher) Hash(ctx context.Context, pw string) (string, error) {
	if err := h.acquire(ctx); err != nil {
		return "", err
	}
	defer func() { <-h.slots }()
	salt := make([]byte, saltLen)
	rand.Read(salt)
	p := h.Params
	key := argon2.IDKey([]byte(pw), salt, p.Time, p.Memory, p.Threads, keyLen)
	enc := base64.RawStdEncoding
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, p.Memory, p.Time, p.Threads,
		enc.EncodeToString(salt), enc.EncodeToString(key)), nil
}

// Verify reports whether pw matches hash. A hash of the wrong shape is an
// error, never a match. An empty hash (no such user) still costs one hash
// of DefaultHashParams, so a caller cannot tell unknown users by time.
func (h *Hasher) Verify(ctx context.Context, hash, pw string) (bool, error) {
	if err := h.acquire(ctx); err != nil {
		return false, err
	}
	defer func() { <-h.slots }()
	if hash == "" {
		p := h.Params
		argon2.IDKey([]byte(pw), make([]byte, saltLen), p.Time, p.Memory, p.Threads, keyLen)
		return false, nil
	}
	ph, err := parseHash(hash)
	if err != nil {
		return false, err
	}
	got := argon2.IDKey([]byte(pw), ph.salt, ph.Time, ph.Memory, ph.Threads, uint32(len(ph.key)))
	return subtle.ConstantTimeCompare(got, ph.key) == 1, nil
}

type parsedHash struct {
	HashParams
	salt, key []byte
}

var errBadHash = errors.New("auth: a stored password hash is malformed")

// parseHash reads the PHC string Hash writes, within bounds.
func parseHash(s string) (parsedHash, error) {
	var ph parsedHash
	if len(s) > 512 {
		return ph, errBadHash
	}
	parts := strings.Split(s, "$")
	if len(parts) != 6 || parts[0] != "" || parts[1] != "argon2id" || parts[2] != "v="+strconv.Itoa(argon2.Version) {
		return ph, errBadHash
	}
	for _, kv := range strings.Split(parts[3], ",") {
		k, v, ok := strings.Cut(kv, "=")
		n, err := strconv.ParseUint(v, 10, 32)
		if !ok || err != nil {
			return ph, errBadHash
		}
		switch k {
		case "m":
			ph.Memory = uint32(n)
		case "t":
			ph.Time = uint32(n)
		case "p":
			if n > 255 {
				return ph, errBadHash
			}
			ph.Threads = uint8(n)
		default:
			return ph, errBadHash
		}
	}
	if ph.Time < 1 || ph.Time > maxHashTime || ph.Memory < 8 || ph.Memory > maxHashMemory || ph.Threads < 1 {
		return ph, errBadHash
	}
	enc := base64.RawStdEncoding
	var err1, err2 error
	ph.salt, err1 = enc.DecodeString(parts[4])
	ph.key, err2 = enc.DecodeString(parts[5])
	if err1 != nil || err2 != nil || len(ph.salt) < 8 || len(ph.key) < 16 || len(ph.key) > 64 {
		return ph, errBadHash
	}
	return ph, nil
}
