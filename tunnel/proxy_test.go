package tunnel

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"
)

// proxyDialErr dials a console through a client built by cfg and returns
// the error of the dial.
func proxyDialErr(t *testing.T, p *testPKI, cfg ClientConfig) error {
	t.Helper()
	cert := p.leaf(t, "box-1", x509.ExtKeyUsageClientAuth)
	cfg.Config = DefaultConfig()
	cfg.TLS = &tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{cert}}
	c, err := NewClient(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = c.dial(ctx, false)
	if err == nil {
		t.Fatal("the dial through a proxy that wants other credentials succeeded")
	}
	return err
}

// checkProxyAuthErr checks err is a proxy credential error that names
// source, says what to do, and does not show the password.
func checkProxyAuthErr(t *testing.T, err error, source, advice string) {
	t.Helper()
	t.Logf("the box says: %v", err)
	if !errors.Is(err, ErrProxyAuth) {
		t.Errorf("error %q does not wrap ErrProxyAuth", err)
	}
	for _, want := range []string{source, advice} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "wrong-pass") {
		t.Errorf("error %q shows the password", err)
	}
}

func TestProxyAuthFailureNamesItsSource(t *testing.T) {
	t.Parallel()
	p := newTestPKI(t)
	srv := startTestServer(t, p, DefaultConfig(), "")
	paddr, used := connectProxy(t, "edge", "s3cret")
	tests := []struct {
		name, proxy, source string
		wantSource, advice  string
	}{
		{"agent.json, wrong password", "http://edge:wrong-pass@" + paddr,
			`the "proxy" setting in /var/lib/edgebox/agent.json`, `the "proxy" setting in /var/lib/edgebox/agent.json`,
			`refused user "edge"`},
		{"--proxy flag, wrong user", "http://someone:wrong-pass@" + paddr,
			"the --proxy flag", "the --proxy flag", `refused user "someone"`},
		{"--proxy flag, no credentials", "http://" + paddr,
			"the --proxy flag", "the --proxy flag", "wants a user and password"},
		{"a caller that names no source", "http://edge:wrong-pass@" + paddr,
			"", "the proxy setting", "correct the user and password"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			u, err := url.Parse(tt.proxy)
			if err != nil {
				t.Fatal(err)
			}
			err = proxyDialErr(t, p, ClientConfig{Addr: srv.addr, ProxySource: tt.source,
				Proxy: func(*url.URL) (*url.URL, error) { return u, nil }})
			checkProxyAuthErr(t, err, tt.wantSource, tt.advice)
			if strings.Contains(err.Error(), "HTTPS_PROXY") {
				t.Errorf("error %q points at HTTPS_PROXY, which was not used", err)
			}
		})
	}
	if used.Load() != 0 {
		t.Fatal("the proxy opened a tunnel without the right credentials")
	}
}

// TestProxyFromEnvironmentAuthFailureNamesTheVariable is not parallel: it
// sets the process's environment.
func TestProxyFromEnvironmentAuthFailureNamesTheVariable(t *testing.T) {
	p := newTestPKI(t)
	paddr, _ := connectProxy(t, "edge", "s3cret")
	for _, name := range []string{"HTTPS_PROXY", "https_proxy"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("HTTPS_PROXY", "")
			t.Setenv("https_proxy", "")
			t.Setenv("NO_PROXY", "")
			t.Setenv("no_proxy", "")
			t.Setenv(name, "http://edge:wrong-pass@"+paddr)
			// Loopback consoles are never reached through an environment
			// proxy; the proxy answers 407 before it resolves this name.
			err := proxyDialErr(t, p, ClientConfig{Addr: "console.invalid:8443"})
			checkProxyAuthErr(t, err, "the "+name+" environment variable", `refused user "edge"`)
		})
	}
}
