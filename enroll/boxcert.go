package enroll

import (
	"crypto/x509"
	"errors"
	"strings"
)

// BoxURIPrefix is how a box ID appears in the URI SAN of the certificate
// the console issues a box.
const BoxURIPrefix = "spiffe://edgebox/box/"

// ErrNotBox is returned by BoxID for a certificate that names no box.
var ErrNotBox = errors.New("certificate names no box")

// BoxID returns the box named by a certificate's URI SAN: what the
// console and a box's site peers know it by.
func BoxID(cert *x509.Certificate) (string, error) {
	for _, u := range cert.URIs {
		if s := u.String(); strings.HasPrefix(s, BoxURIPrefix) {
			if id := s[len(BoxURIPrefix):]; id != "" {
				return id, nil
			}
		}
	}
	return "", ErrNotBox
}
