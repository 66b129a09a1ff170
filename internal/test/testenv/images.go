package testenv

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/url"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// RegistryTransport is an HTTP transport that trusts the console's CA.
func RegistryTransport(h Harness) *http.Transport {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(h.CAPEM())
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	return tr
}

// RegistryHost is the console's registry as image references name it.
func RegistryHost(h Harness) string {
	u, _ := url.Parse(h.URL())
	return u.Host
}

// PushImage pushes img to the console's registry as repoTag
// ("robots/clock:1") with the admin token, the way an operator's crane
// does, and returns its reference by digest.
func PushImage(t testing.TB, h Harness, repoTag string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(RegistryHost(h) + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithTransport(RegistryTransport(h)),
		remote.WithAuth(&authn.Basic{Username: "edgebox", Password: h.AdminToken()})); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return ref.Context().Digest(d.String()).String()
}
