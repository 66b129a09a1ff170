package pki

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"
)

// ReplicaURIPrefix is how a console replica's ID appears in the URI SAN
// of its certificate; box certificates carry BoxURIPrefix instead.
const ReplicaURIPrefix = "edgebox-replica:"

// replicaTTL is how long a replica's certificate lasts; it is issued
// again, with a new key, a third of that before it ends.
const replicaTTL = 7 * 24 * time.Hour

// ReplicaCert is the certificate a console replica shows the others,
// both as the server of its replica listener and as the client that
// forwards calls to them. It lives in memory only, and is issued anew on
// each start and before it ends.
type ReplicaCert struct {
	a     *Authority
	id    string
	hosts []string

	mu   sync.Mutex
	cert *tls.Certificate
}

// ReplicaCert returns the certificate of replica id, served for hosts.
func (a *Authority) ReplicaCert(id string, hosts []string) (*ReplicaCert, error) {
	rc := &ReplicaCert{a: a, id: id, hosts: hosts}
	if _, err := rc.Get(); err != nil {
		return nil, err
	}
	return rc, nil
}

// Get returns the current certificate, issuing a new one when it nears
// its end. It fits tls.Config's GetCertificate and GetClientCertificate
// through the two methods below.
func (rc *ReplicaCert) Get() (*tls.Certificate, error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.cert != nil && time.Until(rc.cert.Leaf.NotAfter) > replicaTTL/3 {
		return rc.cert, nil
	}
	c, err := rc.a.issueReplica(rc.id, rc.hosts)
	if err != nil {
		return nil, err
	}
	rc.cert = c
	return c, nil
}

// ForServer serves as tls.Config.GetCertificate.
func (rc *ReplicaCert) ForServer(*tls.ClientHelloInfo) (*tls.Certificate, error) { return rc.Get() }

// ForClient serves as tls.Config.GetClientCertificate.
func (rc *ReplicaCert) ForClient(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return rc.Get()
}

func (a *Authority) issueReplica(id string, hosts []string) (*tls.Certificate, error) {
	u, err := url.Parse(ReplicaURIPrefix + id)
	if err != nil || id == "" {
		return nil, fmt.Errorf("pki: replica ID %q", id)
	}
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "edgebox console replica " + id},
		URIs:         []*url.URL{u},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(replicaTTL),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	name(tmpl, hosts)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.CA, &key.PublicKey, a.caKey)
	if err != nil {
		return nil, fmt.Errorf("pki: issuing the replica certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der, a.CA.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

// ErrNotReplica is returned by ReplicaID for a certificate that names no
// console replica.
var ErrNotReplica = errors.New("pki: not a console replica's certificate")

// ReplicaID returns the replica a verified certificate names.
func ReplicaID(cert *x509.Certificate) (string, error) {
	for _, u := range cert.URIs {
		if id, ok := strings.CutPrefix(u.String(), ReplicaURIPrefix); ok && id != "" {
			return id, nil
		}
	}
	return "", ErrNotReplica
}

// VerifyReplica serves as tls.Config.VerifyPeerCertificate on both ends
// of a connection between replicas: after the chain was verified against
// the CA, the peer must be a replica, not a box the same CA signed.
func VerifyReplica(_ [][]byte, chains [][]*x509.Certificate) error {
	if len(chains) == 0 || len(chains[0]) == 0 {
		return ErrNotReplica
	}
	_, err := ReplicaID(chains[0][0])
	return err
}
