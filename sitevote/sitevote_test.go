package sitevote

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

func key(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func vote() *edgeboxv1.SiteVote {
	return &edgeboxv1.SiteVote{Voter: "bx-a", Counter: 7, UnixNano: 1_800_000_000_000_000_000, Peers: []*edgeboxv1.PeerSeen{
		{BoxId: "bx-b", Alive: true, LastHeardUnixNano: 1_799_999_999_000_000_000},
		{BoxId: "bx-c"},
	}}
}

func TestASignedVoteOpensAndVerifies(t *testing.T) {
	k := key(t)
	s, err := Sign(k, vote())
	if err != nil {
		t.Fatal(err)
	}
	v, err := Open(s)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(v, vote()) {
		t.Fatalf("opened %v, want %v", v, vote())
	}
	if err := VerifyKey(s, &k.PublicKey); err != nil {
		t.Fatal(err)
	}
}

// TestAForgedVoteIsRefused: another box's key, a changed byte, a vote
// moved under another signature.
func TestAForgedVoteIsRefused(t *testing.T) {
	k, other := key(t), key(t)
	s, _ := Sign(k, vote())
	if err := VerifyKey(s, &other.PublicKey); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("another key: %v", err)
	}
	changed := proto.Clone(s).(*edgeboxv1.SignedVote)
	changed.Vote[len(changed.Vote)-1] ^= 1
	if err := VerifyKey(changed, &k.PublicKey); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("a changed byte: %v", err)
	}
	v := vote()
	v.Counter++
	s2, _ := Sign(k, v)
	swapped := &edgeboxv1.SignedVote{Vote: s2.Vote, Signature: s.Signature}
	if err := VerifyKey(swapped, &k.PublicKey); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("a signature of another vote: %v", err)
	}
}

func TestMisshapenVotesAreRefused(t *testing.T) {
	k := key(t)
	cases := map[string]func(v *edgeboxv1.SiteVote){
		"no voter":       func(v *edgeboxv1.SiteVote) { v.Voter = "" },
		"long voter":     func(v *edgeboxv1.SiteVote) { v.Voter = strings.Repeat("x", MaxIDLen+1) },
		"counter 0":      func(v *edgeboxv1.SiteVote) { v.Counter = 0 },
		"no time":        func(v *edgeboxv1.SiteVote) { v.UnixNano = 0 },
		"on itself":      func(v *edgeboxv1.SiteVote) { v.Peers[0].BoxId = "bx-a" },
		"a peer twice":   func(v *edgeboxv1.SiteVote) { v.Peers[1].BoxId = "bx-b" },
		"alive, unheard": func(v *edgeboxv1.SiteVote) { v.Peers[0].LastHeardUnixNano = 0 },
		"too many peers": func(v *edgeboxv1.SiteVote) {
			for i := range MaxPeers {
				v.Peers = append(v.Peers, &edgeboxv1.PeerSeen{BoxId: "bx-" + strings.Repeat("p", i%50) + string(rune('a'+i%26)) + string(rune('a'+i/26))})
			}
		},
	}
	for name, spoil := range cases {
		v := vote()
		spoil(v)
		if _, err := Sign(k, v); err == nil {
			t.Errorf("%s: signed", name)
		}
		b, _ := proto.Marshal(v)
		if _, err := Open(&edgeboxv1.SignedVote{Vote: b, Signature: []byte{1}}); err == nil {
			t.Errorf("%s: opened", name)
		}
	}
	if _, err := Open(&edgeboxv1.SignedVote{Vote: make([]byte, MaxVoteBytes+1), Signature: []byte{1}}); err == nil {
		t.Error("an oversized vote opened")
	}
	s, _ := Sign(k, vote())
	if _, err := Open(&edgeboxv1.SignedVote{Vote: s.Vote}); err == nil {
		t.Error("a vote without a signature opened")
	}
}

// FuzzOpen: no vote, however made, panics Open or VerifyKey, and what
// Open takes has the shape Sign would give it.
func FuzzOpen(f *testing.F) {
	k := key(f)
	s, _ := Sign(k, vote())
	f.Add(s.Vote, s.Signature)
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}, []byte{0x30, 0x00})
	f.Fuzz(func(t *testing.T, b, sig []byte) {
		sv := &edgeboxv1.SignedVote{Vote: b, Signature: sig}
		v, err := Open(sv)
		if err != nil {
			return
		}
		if err := check(v); err != nil {
			t.Fatalf("opened a vote check refuses: %v", err)
		}
		VerifyKey(sv, &k.PublicKey)
	})
}
