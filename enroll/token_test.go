package enroll

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
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

// unchecked encodes a token as consoles did before the check field: a
// token of that shape is refused.
func unchecked(t Token) string {
	s := t.String()
	b, err := tokenText.DecodeString(s[len(tokenPrefix):])
	if err != nil {
		panic(err)
	}
	return tokenPrefix + tokenText.EncodeToString(b[:len(b)-2-checkLen])
}

var badTokens = map[string]string{
	"empty":         "",
	"no prefix":     "abc",
	"other version": "ebx2.AAAA",
	"not base64":    "ebx1.!!!",
	"truncated":     sampleToken().String()[:40],
	"too long":      "ebx1." + strings.Repeat("A", MaxTokenLen),
	"no check":      unchecked(sampleToken()),
	"check not last": func() string {
		b, _ := tokenText.DecodeString(sampleToken().String()[len(tokenPrefix):])
		b = append(b, fieldID+100, 0)
		return tokenPrefix + tokenText.EncodeToString(b)
	}(),
	"padding bits": func() string {
		// The same bytes, with bits set that base64 leaves unused.
		s := sampleToken().String()
		if len(s[len(tokenPrefix):])%4 == 0 {
			panic("sample token has no spare bits")
		}
		i := strings.IndexByte(base64URLAlphabet, s[len(s)-1])
		return s[:len(s)-1] + string(base64URLAlphabet[i|1])
	}(),
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

const base64URLAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// realToken is a token as the console makes one: random ID and secret.
func realToken(t testing.TB, url string, keyPin bool) string {
	tok := Token{ConsoleURL: url, CAHash: sha256.Sum256([]byte(url)), ID: make([]byte, IDLen), Secret: make([]byte, SecretLen)}
	if keyPin {
		tok.KeyPin = sha256.Sum256([]byte("key of " + url))
	}
	rand.Read(tok.ID)
	rand.Read(tok.Secret)
	s := tok.String()
	if _, err := ParseToken(s); err != nil {
		t.Fatalf("a fresh token is refused: %v", err)
	}
	return s
}

// TestEverySingleTypoIsRefusedAsMistyped: every text one character away
// from a real token (each character replaced by every other character of
// the token's alphabet, each one dropped, any one added anywhere) is
// refused with ErrMistyped, never taken for another token.
func TestEverySingleTypoIsRefusedAsMistyped(t *testing.T) {
	t.Parallel()
	alphabet := base64URLAlphabet + "."
	for _, c := range []struct {
		name   string
		url    string
		keyPin bool
	}{
		{"with key pin", "https://console.example.com:8443", true},
		{"without key pin", "https://10.1.2.3", false},
		{"long name", "https://edgebox-console.east-region.customer-network.example.org:65535", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			tok := realToken(t, c.url, c.keyPin)
			tried := 0
			try := func(what, typo string) {
				t.Helper()
				tried++
				_, err := ParseToken(typo)
				if !errors.Is(err, ErrMistyped) || !errors.Is(err, ErrBadToken) {
					t.Fatalf("%s: %q: got %v, want the mistyped error", what, typo, err)
				}
			}
			for i := range len(tok) {
				for _, r := range alphabet {
					if byte(r) != tok[i] {
						try(fmt.Sprintf("character %d replaced by %q", i, r), tok[:i]+string(r)+tok[i+1:])
					}
				}
				try(fmt.Sprintf("character %d dropped", i), tok[:i]+tok[i+1:])
			}
			for i := range len(tok) + 1 {
				for _, r := range alphabet {
					try(fmt.Sprintf("%q added at %d", r, i), tok[:i]+string(r)+tok[i:])
				}
			}
			if want := len(tok)*(len(alphabet)-1) + len(tok) + (len(tok)+1)*len(alphabet); tried != want {
				t.Fatalf("tried %d typos, want %d", tried, want)
			}
		})
	}
}

// TestMistypedSaysSo: what the operator reads.
func TestMistypedSaysSo(t *testing.T) {
	t.Parallel()
	tok := realToken(t, "https://console.example.com:8443", true)
	_, err := ParseToken(tok[:20] + "Q" + tok[21:])
	if err == nil || !strings.Contains(err.Error(), "this token was mistyped") || !strings.Contains(err.Error(), "edgebox token create") {
		t.Fatalf("got %v", err)
	}
	// Another version, checked with its own prefix, is not "mistyped".
	fields, ok := checked(tok[len(tokenPrefix):])
	if !ok {
		t.Fatal("a fresh token fails its check")
	}
	v9 := append(fields, fieldCheck, checkLen)
	v9 = binary.BigEndian.AppendUint32(v9, crc32.Update(crc32.Checksum([]byte("ebx9."), castagnoli), castagnoli, fields))
	if _, err := ParseToken("ebx9." + base64.RawURLEncoding.EncodeToString(v9)); errors.Is(err, ErrMistyped) || !errors.Is(err, ErrBadToken) {
		t.Fatalf("a token of another version: %v", err)
	}
}

func FuzzParseToken(f *testing.F) {
	f.Add(sampleToken().String())
	for _, s := range badTokens {
		f.Add(s)
	}
	tok := sampleToken().String()
	f.Add(tok[:30] + "x" + tok[31:])
	f.Add(tok[:4] + tok[5:])
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

func TestTokenWithOtherAddresses(t *testing.T) {
	t.Parallel()
	tok := sampleToken()
	tok.Also = []string{"console-b.example.com:8443", "10.0.0.3:443"}
	got, err := ParseToken(tok.String())
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"console.example.com:8443", "console-b.example.com:8443", "10.0.0.3:443"}; fmt.Sprint(got.Addrs()) != fmt.Sprint(want) {
		t.Fatalf("addresses %v, want %v", got.Addrs(), want)
	}

	// The longest token still fits.
	tok.ConsoleURL = "https://" + strings.Repeat("c", maxURLLen-len("https://:8443")) + ":8443"
	tok.Also = nil
	for next := strings.Repeat("h", 14) + ":65535"; len(strings.Join(append(tok.Also, next), ",")) <= maxAlsoLen && len(tok.Also) < MaxAlso; {
		tok.Also = append(tok.Also, next)
	}
	if err := tok.Validate(); err != nil {
		t.Fatal(err)
	}
	if n := len(tok.String()); n > MaxTokenLen {
		t.Fatalf("the longest token is %d characters, over %d", n, MaxTokenLen)
	}

	for _, bad := range [][]string{
		{"console-b"}, {"console-b:"}, {":8443"}, {"a:1,b:2"}, {"https://b:1"}, {"b:0"}, {"b:70000"},
		slices.Repeat([]string{"b:1"}, MaxAlso+1), {strings.Repeat("h", maxAlsoLen) + ":1"},
	} {
		tok := sampleToken()
		tok.Also = bad
		if err := tok.Validate(); err == nil {
			t.Errorf("other addresses %q were accepted", bad)
		} else if !errors.Is(err, ErrBadToken) {
			t.Errorf("%q: %v is not ErrBadToken", bad, err)
		}
	}
}
