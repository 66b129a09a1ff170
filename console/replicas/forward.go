package replicas

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/edgebox/edgebox/console/pki"
)

// ClientHeader carries the address of the caller a replica forwards a call
// for; the replica listener believes it only from another replica.
const ClientHeader = "X-Edgebox-Client"

// ForwardedByHeader names the replica a call was forwarded by.
const ForwardedByHeader = "X-Edgebox-Forwarded-By"

// fromReplica marks a request's context as one that came through the
// replica listener: it is served where it landed, never forwarded again.
type fromReplica struct{}

// Forwarder sends a call for a box whose tunnel another replica holds to
// that replica, over TLS on which both sides show their replica
// certificates. The replica that holds the box authenticates the caller
// again, from the same store: the call is served as if made there.
type Forwarder struct {
	set    *Set
	proxy  *httputil.ReverseProxy
	client *http.Client // the replicas' own calls to each other (Ask)
	log    *slog.Logger
}

type target struct{}

// NewForwarder returns a forwarder for the replicas of set; cert is this
// replica's certificate, roots the console CA.
func NewForwarder(set *Set, cert *pki.ReplicaCert, roots *x509.CertPool, log *slog.Logger) *Forwarder {
	f := &Forwarder{set: set, log: log}
	tr := &http.Transport{
		TLSClientConfig:       clientTLS(cert, roots),
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: 2 * time.Minute, // a file copy's first byte may wait for the box
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   32,
	}
	f.client = &http.Client{Transport: tr}
	f.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			to := pr.In.Context().Value(target{}).(Replica)
			u, _ := url.Parse(to.URL)
			pr.SetURL(u)
			pr.Out.Host = pr.In.Host
			host, _, err := net.SplitHostPort(pr.In.RemoteAddr)
			if err != nil {
				host = pr.In.RemoteAddr
			}
			pr.Out.Header.Set(ClientHeader, host)
			pr.Out.Header.Set(ForwardedByHeader, set.Self().ID)
		},
		Transport:     tr,
		FlushInterval: -1, // logs, files and sessions stream as they come
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			to := r.Context().Value(target{}).(Replica)
			f.log.Warn("a call forwarded to another console replica failed", "replica", to.ID, "url", to.URL, "path", r.URL.Path, "err", err)
			writeError(w, http.StatusBadGateway, fmt.Sprintf(
				"the console replica that holds the box's tunnel (%s) did not answer (%v); the box reconnects to another within a minute if that replica is gone: try again", to.Name, err))
		},
	}
	return f
}

// Forward serves r on the replica that holds box's tunnel when another
// does, and reports whether it did. A call that came from a replica is
// never forwarded again.
func (f *Forwarder) Forward(w http.ResponseWriter, r *http.Request, box string) bool {
	if f == nil || r.Context().Value(fromReplica{}) != nil {
		return false
	}
	to, ok := f.set.Holder(box)
	if !ok {
		return false
	}
	f.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), target{}, to)))
	return true
}

// ForwardTo serves r on replica id when it is another running replica,
// and reports whether it did: for a call about what runs there, such as
// a remote session. A call that came from a replica is never forwarded
// again.
func (f *Forwarder) ForwardTo(w http.ResponseWriter, r *http.Request, id string) bool {
	if f == nil || id == "" || id == f.set.Self().ID || r.Context().Value(fromReplica{}) != nil {
		return false
	}
	to, ok := f.set.replica(id)
	if !ok {
		return false
	}
	f.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), target{}, to)))
	return true
}

// Ask posts body (JSON) to path on every other registered replica at
// once, each within timeout, and returns the bodies of those that
// answered 200, each read up to limit bytes. The error names each replica
// that did not answer, and why; answers of the others come with it.
func (f *Forwarder) Ask(ctx context.Context, path string, body []byte, timeout time.Duration, limit int64) ([][]byte, error) {
	self := f.set.Self().ID
	var others []Replica
	for _, r := range f.set.Replicas() {
		if r.ID != self {
			others = append(others, r)
		}
	}
	answers := make([][]byte, len(others))
	errs := make([]error, len(others))
	var wg sync.WaitGroup
	for i, r := range others {
		wg.Go(func() {
			answers[i], errs[i] = f.ask(ctx, r, path, body, timeout, limit)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("replica %s (%s): %w", r.Name, r.ID, errs[i])
			}
		})
	}
	wg.Wait()
	return slices.DeleteFunc(answers, func(b []byte) bool { return b == nil }), errors.Join(errs...)
}

func (f *Forwarder) ask(ctx context.Context, to Replica, path string, body []byte, timeout time.Duration, limit int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(to.URL, "/")+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(ForwardedByHeader, f.set.Self().ID)
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	switch {
	case err != nil:
		return nil, err
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b[:min(len(b), 200)]))
	case int64(len(b)) > limit:
		return nil, fmt.Errorf("an answer longer than %d bytes", limit)
	}
	return b, nil
}

// Held reports whether another replica holds box's tunnel.
func (f *Forwarder) Held(box string) bool {
	if f == nil {
		return false
	}
	_, ok := f.set.Holder(box)
	return ok
}

// ServeReplicas returns the handler of the replica listener: h, for calls
// forwarded by other replicas, whose callers' addresses it believes. The
// listener's TLS must require a replica's certificate (ListenerTLS).
func ServeReplicas(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			writeError(w, http.StatusForbidden, "only console replicas call here")
			return
		}
		if ip := net.ParseIP(r.Header.Get(ClientHeader)); ip != nil {
			r.RemoteAddr = net.JoinHostPort(ip.String(), "0")
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), fromReplica{}, true)))
	})
}

// clientTLS is the TLS of a replica calling another: it shows cert, and
// takes only a replica certificate of the CA roots.
func clientTLS(cert *pki.ReplicaCert, roots *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13, RootCAs: roots,
		GetClientCertificate:  cert.ForClient,
		VerifyPeerCertificate: pki.VerifyReplica,
	}
}

// ListenerTLS is the replica listener's TLS: its certificate is cert, and
// it takes only clients that show a replica certificate of the CA roots.
func ListenerTLS(cert *pki.ReplicaCert, roots *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13, GetCertificate: cert.ForServer,
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: roots,
		VerifyPeerCertificate: pki.VerifyReplica,
		NextProtos:            []string{"http/1.1"},
	}
}

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}
