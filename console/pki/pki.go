// Package pki is the console's certificate authority: it creates and loads
// the CA and the serving certificate in the console's data directory, signs
// box certificates from CSRs, and reads box identities back from them.
//
// Files (all 0600, in Dir):
//
//	ca.pem, ca-key.pem          the CA (ECDSA P-256, 10 years)
//	server.pem, server-key.pem  the serving certificate chain and key; the key
//	                            is kept across re-issues so install scripts can
//	                            pin it
//	lock                        held by Open while it reads and writes the rest
//
// Dir may be shared by console replicas (a directory on NFS mounted on
// each): Open holds an exclusive lock on Dir/lock (internal/filelock)
// from its first read to its last write, so replicas starting at once on
// an empty Dir make one CA and one serving key, and a replica that
// re-issues the serving certificate for its own names never races
// another. Each file is written whole (internal/atomicfile), so a crash
// leaves no torn file, and the lock goes with the process that held it.
package pki

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/edgebox/edgebox/enroll"
	"github.com/edgebox/edgebox/internal/atomicfile"
	"github.com/edgebox/edgebox/internal/filelock"
)

// BoxURIPrefix is how a box ID appears in a certificate's URI SAN.
const BoxURIPrefix = enroll.BoxURIPrefix

// ErrNotBox is returned by BoxID for a certificate that names no box.
var ErrNotBox = enroll.ErrNotBox

// Authority holds the CA and the serving certificate.
type Authority struct {
	dir    string
	CA     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	Server tls.Certificate
	pool   *x509.CertPool
}

// lockWait is how long Open waits for another console that holds dir's
// lock. A holder keeps it for as long as it takes to write four small
// files, milliseconds; one that keeps it for a minute is stuck.
const lockWait = time.Minute

// Open loads the authority from dir, creating the CA and the serving
// certificate on first use. hosts are the names and addresses the serving
// certificate must cover; it is re-issued (same key) when they change or it
// nears expiry. created reports a first start.
//
// Open holds dir's lock throughout, waiting up to a minute for a console
// that holds it; consoles that share dir open it one at a time and all
// serve with the one key. A console re-issues the certificate for its own
// hosts: consoles sharing dir whose names differ each serve their own
// certificate, and server.pem is the last one's.
func Open(dir string, hosts []string) (a *Authority, created bool, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), lockWait)
	defer cancel()
	lock, err := filelock.Acquire(ctx, filepath.Join(dir, "lock"))
	if err != nil {
		return nil, false, fmt.Errorf("pki: %w", err)
	}
	// Unlock closes the lock's file, which releases the lock whatever the
	// unlock itself answered.
	defer lock.Unlock()
	a = &Authority{dir: dir}
	caPath := filepath.Join(dir, "ca.pem")
	if _, err := os.Stat(caPath); errors.Is(err, os.ErrNotExist) {
		if err := a.createCA(); err != nil {
			return nil, false, err
		}
		created = true
	} else if err := a.loadCA(); err != nil {
		return nil, false, err
	}
	a.pool = x509.NewCertPool()
	a.pool.AddCert(a.CA)
	if err := a.ensureServer(hosts); err != nil {
		return nil, false, err
	}
	return a, created, nil
}

// Pool returns a pool holding only the CA.
func (a *Authority) Pool() *x509.CertPool { return a.pool }

// CAPEM returns the CA certificate in PEM.
func (a *Authority) CAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.CA.Raw})
}

// CAHash is the SHA-256 of the CA certificate's DER, as tokens carry it.
func (a *Authority) CAHash() [32]byte { return sha256.Sum256(a.CA.Raw) }

// KeyPin is the SHA-256 of the serving key's SubjectPublicKeyInfo, as curl's
// --pinnedpubkey takes it.
func (a *Authority) KeyPin() [32]byte {
	leaf, _ := x509.ParseCertificate(a.Server.Certificate[0])
	return sha256.Sum256(leaf.RawSubjectPublicKeyInfo)
}

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func (a *Authority) createCA() error {
	key, err := newKey()
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "edgebox console CA", Organization: []string{"edgebox"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	a.CA, _ = x509.ParseCertificate(der)
	a.caKey = key
	if err := writeKey(filepath.Join(a.dir, "ca-key.pem"), key); err != nil {
		return err
	}
	return writePEM(filepath.Join(a.dir, "ca.pem"), "CERTIFICATE", der)
}

func (a *Authority) loadCA() error {
	cert, err := readCert(filepath.Join(a.dir, "ca.pem"))
	if err != nil {
		return err
	}
	key, err := readKey(filepath.Join(a.dir, "ca-key.pem"))
	if err != nil {
		return err
	}
	a.CA, a.caKey = cert, key
	return nil
}

// ensureServer loads or (re)issues the serving certificate for hosts.
func (a *Authority) ensureServer(hosts []string) error {
	certPath, keyPath := filepath.Join(a.dir, "server.pem"), filepath.Join(a.dir, "server-key.pem")
	key, err := readKey(keyPath)
	if errors.Is(err, os.ErrNotExist) {
		if key, err = newKey(); err != nil {
			return err
		}
		if err := writeKey(keyPath, key); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	if leaf, err := readCert(certPath); err == nil && covers(leaf, hosts) &&
		time.Until(leaf.NotAfter) > 30*24*time.Hour && leaf.CheckSignatureFrom(a.CA) == nil {
		a.Server = tls.Certificate{Certificate: [][]byte{leaf.Raw, a.CA.Raw}, PrivateKey: key, Leaf: leaf}
		return nil
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "edgebox console"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	name(tmpl, hosts)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.CA, &key.PublicKey, a.caKey)
	if err != nil {
		return err
	}
	if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
		return err
	}
	leaf, _ := x509.ParseCertificate(der)
	a.Server = tls.Certificate{Certificate: [][]byte{der, a.CA.Raw}, PrivateKey: key, Leaf: leaf}
	return nil
}

// name adds hosts to tmpl's names: IP addresses as such, the rest as
// DNS names.
func name(tmpl *x509.Certificate, hosts []string) {
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
}

func covers(leaf *x509.Certificate, hosts []string) bool {
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			if !slices.ContainsFunc(leaf.IPAddresses, ip.Equal) {
				return false
			}
		} else if !slices.Contains(leaf.DNSNames, h) {
			return false
		}
	}
	return true
}

// SignBox issues a client certificate for box boxID from a checked CSR and
// returns it in PEM with its expiry.
func (a *Authority) SignBox(csr *x509.CertificateRequest, boxID string, ttl time.Duration) ([]byte, time.Time, error) {
	u, err := url.Parse(BoxURIPrefix + boxID)
	if err != nil {
		return nil, time.Time{}, err
	}
	now := time.Now()
	// Backdate a little for boxes whose clocks run behind, but never so much
	// that the renewal point (two thirds in) has already passed.
	backdate := min(5*time.Minute, ttl/10)
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: boxID, Organization: []string{"edgebox box"}},
		URIs:         []*url.URL{u},
		NotBefore:    now.Add(-backdate),
		NotAfter:     now.Add(ttl),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.CA, csr.PublicKey, a.caKey)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("pki: signing box certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, time.Time{}, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), leaf.NotAfter, nil
}

// BoxID returns the box named by a certificate's URI SAN.
func BoxID(cert *x509.Certificate) (string, error) { return enroll.BoxID(cert) }

func writePEM(path, typ string, der []byte) error {
	return atomicfile.Write(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der)
}

func readCert(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("pki: %s holds no certificate", path)
	}
	return x509.ParseCertificate(blk.Bytes)
}

func readKey(path string) (*ecdsa.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "EC PRIVATE KEY" {
		return nil, fmt.Errorf("pki: %s holds no EC key", path)
	}
	return x509.ParseECPrivateKey(blk.Bytes)
}

// SignRelease signs what an agent release binary's signature covers
// (update.SignedMessage) with the CA's key, which every box pinned when
// it enrolled: a box runs only agent binaries this console signed.
func (a *Authority) SignRelease(msg []byte) ([]byte, error) {
	sum := sha256.Sum256(msg)
	return ecdsa.SignASN1(rand.Reader, a.caKey, sum[:])
}
