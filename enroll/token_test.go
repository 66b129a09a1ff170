package enroll

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func sampleToken() Token {
	t := Token{ConsoleURL: "https://console.example.com:8443", CAHash: sha256.Sum256([]byte("ca")),
		KeyPin: sha256.Sum256([]byte("key")), ID: make([]byte, IDLen), Secret: make([]byte, SecretLen)}
	for i := range t.Secret {
		t.Secret[i] = byte(i)
	}
	t.ID[0] = 7
	return t
}

func TestTokenRoundTrip(t *testing.T) {
	t.Parallel()
	tok := sampleToken()
	text := tok.String()
	if len(text) > MaxTokenLen {
		t.Fatalf("token text is %d characters, over the limit %d", len(text), MaxTokenLen)
	}
	got, err := ParseToken("  " + text + "\n")
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != text || got.CAHash != tok.CAHash || got.KeyPin != tok.KeyPin || got.ConsoleURL != tok.ConsoleURL {
		t.Fatalf("round trip changed the token: %+v", got)
	}
	h := tok.SecretHash()
	if !got.SecretMatches(h[:]) {
		t.Fatal("secret does not match its own hash")
	}
	h[0] ^= 1
	if got.SecretMatches(h[:]) {
		t.Fatal("secret matches a wrong hash")
	}
}

var badTokens = map[string]string{
	"empty":         "",
	"no prefix":     "abc",
	"other version": "ebx2.AAAA",
	"not base64":    "ebx1.!!!",
	"truncated":     sampleToken().String()[:40],
	"too long":      "ebx1." + strings.Repeat("A", MaxTokenLen),
	"http url": func() string {
		t := sampleToken()
		t.ConsoleURL = "http://console:8443"
		return t.String()
	}(),
	"url with path": func() string {
		t := sampleToken()
		t.ConsoleURL = "https://console:8443/x"
		return t.String()
	}(),
	"short secret": func() string {
		t := sampleToken()
		t.Secret = t.Secret[:4]
		return t.String()
	}(),
	"no CA hash": func() string {
		t := sampleToken()
		t.CAHash = [32]byte{}
		return t.String()
	}(),
}

func TestParseTokenRejects(t *testing.T) {
	t.Parallel()
	for name, text := range badTokens {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if _, err := ParseToken(text); !errors.Is(err, ErrBadToken) {
				t.Fatalf("got %v, want ErrBadToken", err)
			}
		})
	}
}

func FuzzParseToken(f *testing.F) {
	f.Add(sampleToken().String())
	for _, s := range badTokens {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := ParseToken(s)
		if err != nil {
			if !errors.Is(err, ErrBadToken) {
				t.Fatalf("error %v does not wrap ErrBadToken", err)
			}
			return
		}
		again, err := ParseToken(tok.String())
		if err != nil || again.String() != tok.String() {
			t.Fatalf("accepted token does not round-trip: %v", err)
		}
	})
}

func ExampleParseToken() {
	tok, err := ParseToken(sampleToken().String())
	fmt.Println(tok.ConsoleURL, tok.IDString(), err)
	// Output: https://console.example.com:8443 070000000000000000 <nil>
}
