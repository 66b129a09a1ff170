package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestCAPersistsAndServerKeyIsStable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a, created, err := Open(dir, []string{"127.0.0.1", "console.local"})
	if err != nil || !created {
		t.Fatalf("first open: created=%v err=%v", created, err)
	}
	for _, f := range []string{"ca.pem", "ca-key.pem", "server.pem", "server-key.pem"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v mode %v", f, err, st.Mode())
		}
	}
	pin := a.KeyPin()
	// New hosts re-issue the serving certificate, with the same key.
	b, created, err := Open(dir, []string{"127.0.0.1", "console.example.com"})
	if err != nil || created {
		t.Fatalf("second open: created=%v err=%v", created, err)
	}
	if b.CAHash() != a.CAHash() {
		t.Fatal("CA changed on reopen")
	}
	if b.KeyPin() != pin {
		t.Fatal("serving key changed; install scripts pin it")
	}
	if err := b.Server.Leaf.VerifyHostname("console.example.com"); err != nil {
		t.Fatal(err)
	}
}

func TestSignBox(t *testing.T) {
	t.Parallel()
	a, _, err := Open(t.TempDir(), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	csr, _ := x509.ParseCertificateRequest(der)
	certPEM, notAfter, err := a.SignBox(csr, "bx-abc", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(certPEM)
	cert, _ := x509.ParseCertificate(blk.Bytes)
	if !cert.NotAfter.Equal(notAfter) {
		t.Fatalf("SignBox says the certificate expires at %v, it says %v", notAfter, cert.NotAfter)
	}
	if id, err := BoxID(cert); err != nil || id != "bx-abc" {
		t.Fatalf("BoxID = %q, %v", id, err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: a.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatal(err)
	}
	// Renewal point (two thirds in) lies in the future even for short lives.
	life := cert.NotAfter.Sub(cert.NotBefore)
	if renew := cert.NotBefore.Add(life * 2 / 3); !renew.After(time.Now()) {
		t.Fatalf("renewal point %v already passed", renew)
	}
	if _, err := BoxID(a.Server.Leaf); err == nil {
		t.Fatal("the serving certificate names a box")
	}
}
