// Package sitevote signs and checks the votes boxes cast on their site's
// peers (ADR 0019). A vote is the bytes of an edgeboxv1.SiteVote with an
// ECDSA signature by the voter's box key over them, so it proves itself
// wherever it is kept or carried: in the box's queue while its line is
// down, in the console's history after. The checks here are those of the
// vote alone (size, shape, signature); whether its counter is new and its
// time recent is the console's to judge, against what it saw before.
package sitevote

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Bounds of one vote: a site of MaxPeers+1 boxes at most.
const (
	MaxPeers     = 64
	MaxIDLen     = 64
	MaxVoteBytes = 8 << 10
	MaxSigBytes  = 80 // an ASN.1 ECDSA P-256 signature is at most 72
)

// ErrBadSignature is a vote whose signature is not its voter's.
var ErrBadSignature = errors.New("sitevote: the signature is not the voter's")

// Sign encodes v and signs it with key.
func Sign(key *ecdsa.PrivateKey, v *edgeboxv1.SiteVote) (*edgeboxv1.SignedVote, error) {
	if err := check(v); err != nil {
		return nil, err
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(v)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxVoteBytes {
		return nil, fmt.Errorf("sitevote: a vote of %d bytes is over %d", len(b), MaxVoteBytes)
	}
	sum := sha256.Sum256(b)
	sig, err := ecdsa.SignASN1(rand.Reader, key, sum[:])
	if err != nil {
		return nil, err
	}
	return &edgeboxv1.SignedVote{Vote: b, Signature: sig}, nil
}

// Open decodes a signed vote and checks its shape, without its
// signature: the caller learns the voter, whose key it then looks up for
// Verify.
func Open(s *edgeboxv1.SignedVote) (*edgeboxv1.SiteVote, error) {
	if len(s.GetVote()) == 0 || len(s.GetVote()) > MaxVoteBytes {
		return nil, fmt.Errorf("sitevote: a vote of %d bytes (want 1 to %d)", len(s.GetVote()), MaxVoteBytes)
	}
	if n := len(s.GetSignature()); n == 0 || n > MaxSigBytes {
		return nil, fmt.Errorf("sitevote: a signature of %d bytes (want 1 to %d)", n, MaxSigBytes)
	}
	v := &edgeboxv1.SiteVote{}
	if err := proto.Unmarshal(s.GetVote(), v); err != nil {
		return nil, fmt.Errorf("sitevote: %w", err)
	}
	if err := check(v); err != nil {
		return nil, err
	}
	return v, nil
}

// Verify checks that s was signed by the key of cert, the voter's box
// certificate.
func Verify(s *edgeboxv1.SignedVote, cert *x509.Certificate) error {
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return fmt.Errorf("sitevote: the voter's key is a %T, not ECDSA", cert.PublicKey)
	}
	return VerifyKey(s, pub)
}

// VerifyKey checks that s was signed by pub.
func VerifyKey(s *edgeboxv1.SignedVote, pub *ecdsa.PublicKey) error {
	sum := sha256.Sum256(s.GetVote())
	if !ecdsa.VerifyASN1(pub, sum[:], s.GetSignature()) {
		return ErrBadSignature
	}
	return nil
}

// check is the shape every vote must have.
func check(v *edgeboxv1.SiteVote) error {
	if err := checkID("voter", v.GetVoter()); err != nil {
		return err
	}
	if v.GetCounter() == 0 {
		return errors.New("sitevote: counter 0 (counters start at 1)")
	}
	if v.GetUnixNano() <= 0 {
		return errors.New("sitevote: the vote has no time")
	}
	if len(v.GetPeers()) > MaxPeers {
		return fmt.Errorf("sitevote: %d peers, over %d", len(v.GetPeers()), MaxPeers)
	}
	seen := make(map[string]bool, len(v.GetPeers()))
	for _, p := range v.GetPeers() {
		if err := checkID("peer", p.GetBoxId()); err != nil {
			return err
		}
		if p.GetBoxId() == v.GetVoter() {
			return fmt.Errorf("sitevote: box %s votes on itself", v.GetVoter())
		}
		if seen[p.GetBoxId()] {
			return fmt.Errorf("sitevote: peer %s twice", p.GetBoxId())
		}
		seen[p.GetBoxId()] = true
		if p.GetLastHeardUnixNano() < 0 || (p.GetAlive() && p.GetLastHeardUnixNano() == 0) {
			return fmt.Errorf("sitevote: peer %s alive but never heard", p.GetBoxId())
		}
	}
	return nil
}

func checkID(what, id string) error {
	if id == "" || len(id) > MaxIDLen || !utf8.ValidString(id) {
		return fmt.Errorf("sitevote: %s ID %.64q (want 1 to %d bytes of UTF-8)", what, id, MaxIDLen)
	}
	return nil
}
