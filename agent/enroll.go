package agent

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/net/http/httpproxy"

	"github.com/edgebox/edgebox/enroll"
	"github.com/edgebox/edgebox/internal/atomicfile"
	"github.com/edgebox/edgebox/tunnel"
)

// EnrollOptions are the optional parts of enrollment.
type EnrollOptions struct {
	Name string // box name; the host name when empty
	// Labels are asked for besides the token's.
	Labels map[string]string
	// Proxy picks the proxy for the console, http:// or https://; nil is
	// HTTPS_PROXY/NO_PROXY.
	Proxy func(*url.URL) (*url.URL, error)
	// ProxyRoots verify an https:// proxy; nil uses the system's roots.
	ProxyRoots *x509.CertPool
	// Transport, when set, replaces the HTTP transport (tests);
	// its TLS settings are overwritten with the token's pin.
	Transport *http.Transport
}

// Enroll trades an enrollment token for a box identity and stores it in
// dir: it makes a P-256 key here, sends a CSR with the token to the console
// the token names, and trusts only the console CA the token pins.
func Enroll(ctx context.Context, dir, tokenText string, opts EnrollOptions) (Identity, bool, error) {
	tok, err := enroll.ParseToken(tokenText)
	if err != nil {
		return Identity{}, false, err
	}
	if _, err := os.Stat(filepath.Join(dir, identityFile)); err == nil {
		return Identity{}, false, fmt.Errorf("agent: %s already holds an enrolled box; remove it to enroll again", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Identity{}, false, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Identity{}, false, err
	}
	host, _ := os.Hostname()
	csr, err := makeCSR(key, host)
	if err != nil {
		return Identity{}, false, err
	}
	body, _ := json.Marshal(enroll.Request{Token: tok.String(), CSR: string(csr), Hostname: host, Name: opts.Name, Labels: opts.Labels})
	// The console's addresses in a random order, the token's URL among
	// them: the first that answers enrolls the box.
	addrs := tok.Addrs()
	mrand.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] })
	var resp *http.Response
	for i, addr := range addrs {
		resp, err = postEnroll(ctx, opts, tok.CAHash, addr, body)
		if err == nil {
			break
		}
		if errors.Is(err, enroll.ErrWrongConsole) {
			return Identity{}, false, fmt.Errorf("%s is not the console that made this token (its CA does not match the token's pin); nothing was changed", addr)
		}
		if ctx.Err() != nil || i == len(addrs)-1 {
			where := tok.ConsoleURL
			if len(addrs) > 1 {
				where = "any of " + strings.Join(tok.Addrs(), ", ")
			}
			return Identity{}, false, fmt.Errorf("cannot reach the console at %s: %w", where, err)
		}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return Identity{}, false, err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		if json.Unmarshal(raw, &e) != nil || e.Error == "" {
			e.Error = resp.Status
		}
		return Identity{}, false, fmt.Errorf("the console refused enrollment: %s", e.Error)
	}
	var out enroll.Response
	if err := json.Unmarshal(raw, &out); err != nil {
		return Identity{}, false, fmt.Errorf("the console's answer is not an enrollment response: %w", err)
	}
	if err := checkIssued(out, tok.CAHash); err != nil {
		return Identity{}, false, err
	}
	if err := atomicfile.Write(filepath.Join(dir, caFile), []byte(out.CAPEM)); err != nil {
		return Identity{}, false, err
	}
	if err := saveKeyAndCert(dir, key, []byte(out.CertificatePEM)); err != nil {
		return Identity{}, false, err
	}
	id := Identity{BoxID: out.BoxID, Name: out.Name, ConsoleURL: tok.ConsoleURL, Also: tok.Also, EnrolledAt: time.Now().UTC().Format(time.RFC3339)}
	// identity.json last: its presence means enrollment completed.
	if err := writeJSON(filepath.Join(dir, identityFile), id); err != nil {
		return Identity{}, false, err
	}
	return id, out.Pending, nil
}

// postEnroll sends the enrollment request to the console at addr
// (host:port), trusting only the pinned CA.
func postEnroll(ctx context.Context, opts EnrollOptions, caHash [32]byte, addr string, body []byte) (*http.Response, error) {
	host, _, _ := net.SplitHostPort(addr)
	pinned := enroll.PinnedTLS(caHash, host)
	tr := opts.Transport
	if tr == nil {
		tr = &http.Transport{DialTLSContext: pinnedDial(pinned, opts)}
	} else {
		tr = tr.Clone()
		tr.TLSClientConfig = pinned
	}
	hc := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	defer tr.CloseIdleConnections() // one request: leave nothing open on the console
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+enroll.Path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return hc.Do(req)
}

// checkIssued verifies the returned CA is the pinned one and the
// certificate chains to it.
func checkIssued(out enroll.Response, caHash [32]byte) error {
	blk, _ := pem.Decode([]byte(out.CAPEM))
	if blk == nil {
		return errors.New("the console sent no CA certificate")
	}
	ca, err := x509.ParseCertificate(blk.Bytes)
	if err != nil || sha256.Sum256(ca.Raw) != caHash {
		return errors.New("the console sent a CA that does not match the token's pin")
	}
	blk, _ = pem.Decode([]byte(out.CertificatePEM))
	if blk == nil {
		return errors.New("the console sent no certificate")
	}
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return fmt.Errorf("the console sent a bad certificate: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("the console sent a certificate its CA did not sign: %w", err)
	}
	return nil
}

func makeCSR(key *ecdsa.PrivateKey, host string) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: host},
	}, key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// pinnedDial dials the console, through a proxy when one applies, and
// checks its certificate against the token's pin. The proxy's own TLS,
// for an https:// proxy, is verified apart from the console's: the pin
// covers the console alone.
func pinnedDial(pinned *tls.Config, opts EnrollOptions) func(ctx context.Context, network, addr string) (net.Conn, error) {
	pick := opts.Proxy
	if pick == nil {
		env := httpproxy.FromEnvironment().ProxyFunc()
		pick = func(u *url.URL) (*url.URL, error) { return env(u) }
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		proxy, err := pick(&url.URL{Scheme: "https", Host: addr})
		if err != nil {
			return nil, fmt.Errorf("choosing proxy: %w", err)
		}
		var d net.Dialer
		var raw net.Conn
		if proxy != nil {
			raw, err = tunnel.DialProxy(ctx, d.DialContext, opts.ProxyRoots, proxy, "", addr)
		} else {
			raw, err = d.DialContext(ctx, network, addr)
		}
		if err != nil {
			return nil, err
		}
		c := tls.Client(raw, pinned)
		if err := c.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, err
		}
		return c, nil
	}
}
