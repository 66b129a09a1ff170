package agent_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/enroll"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/internal/test/toxic"
)

// proxyCert makes a self-signed certificate for a proxy on 127.0.0.1 and
// the pool that trusts it.
func proxyCert(t *testing.T) (tls.Certificate, *x509.CertPool) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "proxy.corp"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(c)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// TestEnrollThroughHTTPSProxy enrolls a box through an https:// proxy: the
// proxy's certificate is checked against its own roots, the console's
// against the token's pin, and a proxy whose certificate is not trusted
// is refused before any token is spent.
func TestEnrollThroughHTTPSProxy(t *testing.T) {
	h := testenv.NewInProcess(t, testenv.Options{})
	cert, pool := proxyCert(t)
	px := toxic.NewTLSConnectProxy(t, "edge", "s3cret", cert)
	proxy := func(*url.URL) (*url.URL, error) { return url.Parse("https://edge:s3cret@" + px.Addr) }
	tok := h.Token(t, api.TokenRequest{Region: "east", Site: "proxied"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	_, _, err := agent.Enroll(ctx, t.TempDir(), tok, agent.EnrollOptions{Name: "untrusting", Proxy: proxy, ProxyRoots: x509.NewCertPool()})
	if err == nil || !strings.Contains(err.Error(), "TLS handshake with proxy") {
		t.Fatalf("enrolling through a proxy whose certificate is not trusted: %v", err)
	}
	id, _, err := agent.Enroll(ctx, t.TempDir(), tok, agent.EnrollOptions{Name: "proxied", Proxy: proxy, ProxyRoots: pool})
	if err != nil {
		t.Fatalf("enrolling through an https proxy: %v", err)
	}
	if id.BoxID == "" || px.Used.Load() != 1 {
		t.Fatalf("box %q, proxy carried %d connections, want 1", id.BoxID, px.Used.Load())
	}
}

// TestEnrollTriesTheConsolesOtherAddresses enrolls with a token whose URL
// leads nowhere and whose other address is the console: the box enrolls
// there and keeps the other address for its tunnel.
func TestEnrollTriesTheConsolesOtherAddresses(t *testing.T) {
	h := testenv.NewInProcess(t, testenv.Options{})
	text := h.Token(t, api.TokenRequest{Region: "east", Site: "replicas"})
	tok, err := enroll.ParseToken(text)
	if err != nil {
		t.Fatal(err)
	}
	u, err := enroll.ParseConsoleURL(tok.ConsoleURL)
	if err != nil {
		t.Fatal(err)
	}
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead.Close()
	tok.ConsoleURL = "https://" + dead.Addr().String()
	tok.Also = []string{enroll.HostPort(u)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id, _, err := agent.Enroll(ctx, t.TempDir(), tok.String(), agent.EnrollOptions{Name: "replicated"})
	if err != nil {
		t.Fatalf("enrolling through the other address: %v", err)
	}
	if strings.Join(id.Also, ",") != enroll.HostPort(u) {
		t.Fatalf("the identity keeps other addresses %q, want %q", id.Also, enroll.HostPort(u))
	}

	tok.Also = []string{dead.Addr().String()}
	_, _, err = agent.Enroll(ctx, t.TempDir(), tok.String(), agent.EnrollOptions{Name: "nowhere"})
	if err == nil || !strings.Contains(err.Error(), "cannot reach the console at any of") {
		t.Fatalf("enrolling where no address answers: %v", err)
	}
}
