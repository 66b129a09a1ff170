package enroll

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
)

func csrPEM(t testing.TB, key any) string {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

func body(t testing.TB, r Request) []byte {
	b, _ := json.Marshal(r)
	return b
}

func TestDecodeRequest(t *testing.T) {
	t.Parallel()
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	good := csrPEM(t, p256)
	tampered := strings.Replace(good, good[100:104], "AAAA", 1)
	tok := sampleToken().String()
	cases := []struct {
		name string
		body []byte
		ok   bool
	}{
		{"good", body(t, Request{Token: tok, CSR: good, Hostname: "box-1"}), true},
		{"good with name", body(t, Request{Token: tok, CSR: good, Name: "robot-7"}), true},
		{"P-384 key", body(t, Request{Token: tok, CSR: csrPEM(t, p384)}), false},
		{"ed25519 key", body(t, Request{Token: tok, CSR: csrPEM(t, ed)}), false},
		{"tampered CSR", body(t, Request{Token: tok, CSR: tampered}), false},
		{"no CSR", body(t, Request{Token: tok}), false},
		{"bad token", body(t, Request{Token: "nope", CSR: good}), false},
		{"bad name", body(t, Request{Token: tok, CSR: good, Name: "a b"}), false},
		{"unknown field", []byte(`{"token":"x","admin":true}`), false},
		{"not JSON", []byte("<xml/>"), false},
		{"huge", append([]byte(`{"token":"`), bytes.Repeat([]byte("A"), MaxRequestBytes+10)...), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, _, csr, err := DecodeRequest(bytes.NewReader(tc.body))
			if tc.ok {
				if err != nil || csr == nil {
					t.Fatalf("got %v", err)
				}
				return
			}
			if !errors.Is(err, ErrBadRequest) && !errors.Is(err, ErrBadToken) {
				t.Fatalf("got %v, want a bad request", err)
			}
		})
	}
}

func FuzzDecodeRequest(f *testing.F) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	f.Add(body(f, Request{Token: sampleToken().String(), CSR: csrPEM(f, key), Hostname: "h"}))
	f.Add([]byte(`{"token":"ebx1.AAAA","csr":"-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n"}`))
	f.Add([]byte("{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, csr, err := DecodeRequest(bytes.NewReader(b))
		if err == nil && csr == nil {
			t.Fatal("accepted a request without a CSR")
		}
	})
}
