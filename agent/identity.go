package agent

import (
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/edgebox/edgebox/internal/atomicfile"
)

// The agent's data directory:
//
//	identity.json  box ID, name, console URL
//	key.pem        the box's private key (P-256), 0600
//	cert.pem       the box certificate from the console, 0600
//	ca.pem         the pinned console CA, 0600
//	status.json    what the running agent last reported, for 'status'
//	locks.json     the update locks workloads hold (agent/locks)
//	api/agent.sock the local API workloads take update locks through
const (
	identityFile = "identity.json"
	keyFile      = "key.pem"
	certFile     = "cert.pem"
	caFile       = "ca.pem"
	statusFile   = "status.json"
	locksFile    = "locks.json"
	apiDir       = "api"
)

// ErrNotEnrolled is returned when the data directory holds no identity.
var ErrNotEnrolled = errors.New("agent: this box is not enrolled; run 'edgebox-agent enroll <token>' first")

// Identity is who this box is to its console.
type Identity struct {
	BoxID      string `json:"box_id"`
	Name       string `json:"name"`
	ConsoleURL string `json:"console_url"`
	// Also are the console's other addresses (host:port) its token named:
	// its replicas. agent.json's "consoles" replaces them.
	Also       []string `json:"also,omitempty"`
	EnrolledAt string   `json:"enrolled_at"`
}

// credentials are the box's key, certificate and pinned CA.
type credentials struct {
	Identity
	cert tls.Certificate
	leaf *x509.Certificate
	ca   *x509.CertPool
	// caKey is the pinned CA's public key, which agent releases are
	// signed with; nil for a CA whose key is not ECDSA.
	caKey *ecdsa.PublicKey
}

// LoadIdentity reads who the box in dir is; ErrNotEnrolled when nobody.
func LoadIdentity(dir string) (Identity, error) {
	var id Identity
	raw, err := os.ReadFile(filepath.Join(dir, identityFile))
	if errors.Is(err, os.ErrNotExist) {
		return id, ErrNotEnrolled
	} else if err != nil {
		return id, err
	}
	return id, json.Unmarshal(raw, &id)
}

func loadCredentials(dir string) (*credentials, error) {
	raw, err := os.ReadFile(filepath.Join(dir, identityFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotEnrolled
	} else if err != nil {
		return nil, err
	}
	var c credentials
	if err := json.Unmarshal(raw, &c.Identity); err != nil {
		return nil, fmt.Errorf("agent: %s: %w", identityFile, err)
	}
	c.cert, err = tls.LoadX509KeyPair(filepath.Join(dir, certFile), filepath.Join(dir, keyFile))
	if err != nil {
		return nil, fmt.Errorf("agent: box certificate: %w", err)
	}
	c.leaf, _ = x509.ParseCertificate(c.cert.Certificate[0])
	c.cert.Leaf = c.leaf
	caPEM, err := os.ReadFile(filepath.Join(dir, caFile))
	if err != nil {
		return nil, fmt.Errorf("agent: pinned console CA: %w", err)
	}
	c.ca = x509.NewCertPool()
	if !c.ca.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("agent: %s holds no certificate", caFile)
	}
	if b, _ := pem.Decode(caPEM); b != nil {
		if ca, err := x509.ParseCertificate(b.Bytes); err == nil {
			c.caKey, _ = ca.PublicKey.(*ecdsa.PublicKey)
		}
	}
	return &c, nil
}

// saveKeyAndCert writes a new key and certificate, certificate last, each
// atomically, so a crash leaves either the old pair or the new one usable:
// the key goes to key.pem.new first and is renamed only after the
// certificate.
func saveKeyAndCert(dir string, key *ecdsa.PrivateKey, certPEM []byte) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		return fmt.Errorf("agent: the console sent a certificate for another key: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(dir, keyFile+".new"), keyPEM); err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, certFile+".new"), certPEM); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(dir, keyFile+".new"), filepath.Join(dir, keyFile)); err != nil {
		return err
	}
	return os.Rename(filepath.Join(dir, certFile+".new"), filepath.Join(dir, certFile))
}

// renewAt is two thirds into the certificate's lifetime.
func renewAt(leaf *x509.Certificate) time.Time {
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	return leaf.NotBefore.Add(life * 2 / 3)
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(path, append(b, '\n'))
}
