package enroll

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"regexp"

	"github.com/edgebox/edgebox/errdefs"
)

// Path is where the console takes enrollment requests.
const Path = "/api/v1/enroll"

// MaxRequestBytes bounds an enrollment request body.
const MaxRequestBytes = 16 << 10

// Request is the JSON body a box posts to Path.
type Request struct {
	Token    string `json:"token"`
	CSR      string `json:"csr"`      // PEM "CERTIFICATE REQUEST" for a P-256 key
	Hostname string `json:"hostname"` // the box's host name, used as its default name
	Name     string `json:"name,omitempty"`
	// Labels the box asks for, besides its token's (which win on a
	// clash); the console validates them as any labels.
	Labels map[string]string `json:"labels,omitempty"`
}

// Response is the console's answer.
type Response struct {
	BoxID          string `json:"box_id"`
	Name           string `json:"name"`
	CertificatePEM string `json:"certificate_pem"`
	CAPEM          string `json:"ca_pem"`
	// Pending is true when the box waits in the waiting room until an
	// operator approves it.
	Pending bool `json:"pending"`
}

// ErrBadRequest is wrapped by every request validation error. It is of
// kind errdefs.ErrInvalid.
var ErrBadRequest = errdefs.Wrap(errdefs.ErrInvalid, errors.New("enroll: bad request"))

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ValidName reports whether s can name a box.
func ValidName(s string) bool { return nameRE.MatchString(s) }

// DecodeRequest reads and validates a request: the token parses, the CSR is
// a validly signed P-256 request, and names are sane. It returns the parsed
// token and CSR.
func DecodeRequest(r io.Reader) (Request, Token, *x509.CertificateRequest, error) {
	var req Request
	dec := json.NewDecoder(io.LimitReader(r, MaxRequestBytes+1))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, Token{}, nil, fmt.Errorf("%w: body is not an enrollment request: %v", ErrBadRequest, err)
	}
	tok, err := ParseToken(req.Token)
	if err != nil {
		return req, Token{}, nil, err
	}
	csr, err := ParseCSR([]byte(req.CSR))
	if err != nil {
		return req, Token{}, nil, err
	}
	if req.Name != "" && !ValidName(req.Name) {
		return req, Token{}, nil, fmt.Errorf("%w: name %q: use up to 63 letters, digits, '.', '_' or '-'", ErrBadRequest, req.Name)
	}
	if len(req.Hostname) > 253 {
		return req, Token{}, nil, fmt.Errorf("%w: hostname too long", ErrBadRequest)
	}
	if len(req.Labels) > 32 {
		return req, Token{}, nil, fmt.Errorf("%w: at most 32 labels", ErrBadRequest)
	}
	return req, tok, csr, nil
}

// ParseCSR parses a PEM certificate request, checks its signature and that
// its key is ECDSA P-256.
func ParseCSR(pemBytes []byte) (*x509.CertificateRequest, error) {
	if len(pemBytes) > 4096 {
		return nil, fmt.Errorf("%w: CSR longer than 4096 bytes", ErrBadRequest)
	}
	blk, _ := pem.Decode(pemBytes)
	if blk == nil || blk.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("%w: CSR is not a PEM CERTIFICATE REQUEST", ErrBadRequest)
	}
	return ParseCSRDER(blk.Bytes)
}

// ParseCSRDER is ParseCSR for a DER request, as renewal sends it.
func ParseCSRDER(der []byte) (*x509.CertificateRequest, error) {
	if len(der) > 4096 {
		return nil, fmt.Errorf("%w: CSR longer than 4096 bytes", ErrBadRequest)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("%w: CSR: %v", ErrBadRequest, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: CSR signature: %v", ErrBadRequest, err)
	}
	pub, ok := csr.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%w: CSR key must be ECDSA P-256", ErrBadRequest)
	}
	return csr, nil
}
