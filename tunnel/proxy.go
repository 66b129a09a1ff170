package tunnel

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"
)

// ProxyFunc picks the HTTP proxy for a console URL, as
// golang.org/x/net/http/httpproxy's ProxyFunc does; nil means direct.
type ProxyFunc func(*url.URL) (*url.URL, error)

// maxProxyResponse bounds the proxy's answer to CONNECT.
const maxProxyResponse = 16 << 10

// ErrProxyAuth is wrapped by the error of a dial whose proxy answered 407:
// it wants credentials it was not given, or refused the ones it got.
var ErrProxyAuth = errors.New("proxy authentication failed")

// envProxySource names the environment variable the default proxy comes
// from, in the order httpproxy.FromEnvironment reads them.
func envProxySource() string {
	for _, name := range []string{"https_proxy", "HTTPS_PROXY"} {
		if os.Getenv(name) != "" {
			return "the " + name + " environment variable"
		}
	}
	return "the HTTPS_PROXY environment variable"
}

// DialProxy opens a TCP connection to addr through a proxy with CONNECT,
// using basic auth when the proxy URL has a user. An https:// proxy is
// reached over TLS, verified against roots (nil: the system's). source
// names the setting the proxy URL came from, for the operator to correct.
func DialProxy(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error), roots *x509.CertPool, proxy *url.URL, source, addr string) (net.Conn, error) {
	port := "80"
	switch proxy.Scheme {
	case "http", "":
	case "https":
		port = "443"
	default:
		return nil, fmt.Errorf("tunnel: proxy %s: use an http:// or https:// proxy URL (from %s)", proxy.Redacted(), source)
	}
	host := proxy.Host
	if proxy.Port() == "" {
		host = net.JoinHostPort(proxy.Hostname(), port)
	}
	c, err := dial(ctx, "tcp", host)
	if err != nil {
		return nil, fmt.Errorf("tunnel: dial proxy %s: %w", proxy.Redacted(), err)
	}
	if proxy.Scheme == "https" {
		tc := tls.Client(c, &tls.Config{ServerName: proxy.Hostname(), RootCAs: roots, MinVersion: tls.VersionTLS12})
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, fmt.Errorf("tunnel: TLS handshake with proxy %s: %w", proxy.Redacted(), err)
		}
		c = tc
	}
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
	} else {
		c.SetDeadline(time.Now().Add(30 * time.Second))
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	req := &http.Request{
		Method: http.MethodConnect,
		URL:    &url.URL{Opaque: addr},
		Host:   addr,
		Header: make(http.Header),
	}
	if u := proxy.User; u != nil {
		pw, _ := u.Password()
		cred := base64.StdEncoding.EncodeToString([]byte(u.Username() + ":" + pw))
		req.Header.Set("Proxy-Authorization", "Basic "+cred)
	}
	if err := req.Write(c); err != nil {
		c.Close()
		return nil, fmt.Errorf("tunnel: CONNECT via %s: %w", proxy.Redacted(), err)
	}
	br := bufio.NewReaderSize(&limitedReader{c, maxProxyResponse}, 1024)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("tunnel: CONNECT via %s: %w", proxy.Redacted(), err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		c.Close()
		if resp.StatusCode == http.StatusProxyAuthRequired {
			return nil, proxyAuthError(proxy, source, resp.Status)
		}
		return nil, fmt.Errorf("tunnel: proxy %s refused CONNECT %s: %s", proxy.Redacted(), addr, resp.Status)
	}
	if br.Buffered() > 0 {
		c.Close()
		return nil, fmt.Errorf("tunnel: proxy %s sent data before the tunnel was up", proxy.Redacted())
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// limitedReader fails once more than n bytes were read.
type limitedReader struct {
	c net.Conn
	n int
}

func (l *limitedReader) Read(b []byte) (int, error) {
	if l.n <= 0 {
		return 0, fmt.Errorf("proxy response longer than %d bytes", maxProxyResponse)
	}
	if len(b) > l.n {
		b = b[:l.n]
	}
	n, err := l.c.Read(b)
	l.n -= n
	return n, err
}

// proxyAuthError says what the operator must correct when a proxy answers
// 407, naming the setting the proxy came from.
func proxyAuthError(proxy *url.URL, source, status string) error {
	if source == "" {
		source = "the proxy setting"
	}
	if proxy.User == nil {
		return fmt.Errorf("tunnel: proxy %s wants a user and password (%s): %w; add them to %s, as in http://user:password@%s",
			proxy.Redacted(), status, ErrProxyAuth, source, proxy.Host)
	}
	return fmt.Errorf("tunnel: proxy %s refused user %q (%s): %w; correct the user and password in %s",
		proxy.Redacted(), proxy.User.Username(), status, ErrProxyAuth, source)
}
