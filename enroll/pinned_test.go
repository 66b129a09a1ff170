package enroll

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"testing"
	"time"
)

// TestPinnedTLSTellsAWrongNameFromAWrongConsole: the pinned console reached
// by a name its certificate lacks is a name mismatch; another CA is the
// wrong console; the pinned CA and a name it covers pass.
func TestPinnedTLSTellsAWrongNameFromAWrongConsole(t *testing.T) {
	t.Parallel()
	ca, caKey := newCA(t)
	other, _ := newCA(t)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "console"},
		DNSNames: []string{"console.example"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	serving := tls.Certificate{Certificate: [][]byte{der, ca.Raw}, PrivateKey: key}
	handshake := func(pin [32]byte, name string) error {
		c, s := net.Pipe()
		defer c.Close()
		defer s.Close()
		go tls.Server(s, &tls.Config{Certificates: []tls.Certificate{serving}}).Handshake()
		return tls.Client(c, PinnedTLS(pin, name)).Handshake()
	}
	pin := sha256.Sum256(ca.Raw)
	if err := handshake(pin, "console.example"); err != nil {
		t.Fatalf("the pinned console by its name: %v", err)
	}
	if err := handshake(pin, "replica-2.example"); !errors.Is(err, ErrNameMismatch) || errors.Is(err, ErrWrongConsole) {
		t.Fatalf("the pinned console by a name it lacks: %v, want ErrNameMismatch", err)
	}
	if err := handshake(sha256.Sum256(other.Raw), "console.example"); !errors.Is(err, ErrWrongConsole) {
		t.Fatalf("another console's pin: %v, want ErrWrongConsole", err)
	}
}

func newCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c, key
}
