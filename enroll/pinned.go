package enroll

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
)

// ErrWrongConsole is returned when a console presents a CA other than the
// pinned one.
var ErrWrongConsole = errors.New("enroll: the console's certificate authority does not match the token")

// ErrNameMismatch is returned when a console presents the pinned CA, but
// a certificate that does not cover the name or address dialled: the
// right console, reached by a name it was not told it has (its
// --host, or --also-addr for a replica's own address).
var ErrNameMismatch = errors.New("enroll: the console's certificate does not cover the address dialled")

// PinnedTLS returns a TLS configuration that trusts exactly the CA whose
// certificate hashes to caHash, which the server must send in its chain,
// and checks the server's name against serverName.
func PinnedTLS(caHash [32]byte, serverName string) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		ServerName:         serverName,
		InsecureSkipVerify: true, // replaced by the pin check below
		VerifyConnection: func(cs tls.ConnectionState) error {
			var ca *x509.Certificate
			for _, c := range cs.PeerCertificates {
				if sha256.Sum256(c.Raw) == caHash {
					ca = c
				}
			}
			if ca == nil || len(cs.PeerCertificates) == 0 {
				return ErrWrongConsole
			}
			pool := x509.NewCertPool()
			pool.AddCert(ca)
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, DNSName: serverName})
			var name x509.HostnameError
			switch {
			case errors.As(err, &name):
				return fmt.Errorf("%w: %v", ErrNameMismatch, err)
			case err != nil:
				return fmt.Errorf("%w: %v", ErrWrongConsole, err)
			}
			return nil
		},
	}
}
