package pki

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/edgebox/edgebox/internal/atomicfile"
)

// Session ticket keys: a TLS session ticket is the console's own state,
// encrypted under one of these keys and kept by the box, so that the box's
// next handshake resumes its session instead of verifying certificates and
// signing again. Kept in the PKI directory, they outlive a restart: a fleet
// redialling a restarted console resumes, and the console's handshakes cost
// a fraction of full ones. A new key takes over every TicketKeyRotation;
// tickets stay valid while their key is kept, TicketKeyLifetime.
const (
	TicketKeyRotation = 24 * time.Hour
	TicketKeyLifetime = 7 * 24 * time.Hour
	ticketKeysFile    = "ticket-keys.json"
)

type ticketKeyFile struct {
	Keys []ticketKeyRecord `json:"keys"` // newest first
}

type ticketKeyRecord struct {
	Created time.Time `json:"created"`
	Key     string    `json:"key"` // 32 bytes, hex
}

// TicketKeys returns the session ticket keys at now, newest (the one that
// encrypts) first: a new key when the newest is older than
// TicketKeyRotation, the keys older than TicketKeyLifetime dropped, and the
// result written back when it changed. A missing or unreadable file starts
// afresh: losing the keys only costs boxes one full handshake.
func (a *Authority) TicketKeys(now time.Time) ([][32]byte, error) {
	path := filepath.Join(a.dir, ticketKeysFile)
	var f ticketKeyFile
	raw, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("pki: %w", err)
	}
	var keys [][32]byte
	var kept []ticketKeyRecord
	if err == nil && json.Unmarshal(raw, &f) == nil {
		for _, r := range f.Keys {
			b, err := hex.DecodeString(r.Key)
			if err != nil || len(b) != 32 || r.Created.After(now.Add(time.Hour)) || now.Sub(r.Created) > TicketKeyLifetime {
				continue // unreadable, from the future or too old: dropped
			}
			keys = append(keys, [32]byte(b))
			kept = append(kept, r)
		}
	}
	changed := len(kept) != len(f.Keys)
	if len(kept) == 0 || now.Sub(kept[0].Created) >= TicketKeyRotation {
		var k [32]byte
		rand.Read(k[:])
		keys = append([][32]byte{k}, keys...)
		kept = append([]ticketKeyRecord{{Created: now.UTC(), Key: hex.EncodeToString(k[:])}}, kept...)
		changed = true
	}
	if changed {
		out, _ := json.MarshalIndent(ticketKeyFile{Keys: kept}, "", "  ")
		if err := atomicfile.Write(path, out); err != nil {
			return nil, fmt.Errorf("pki: session ticket keys: %w", err)
		}
	}
	return keys, nil
}
