package presence

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/pki"
	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/console/store/storetest"
	"github.com/edgebox/edgebox/tunnel"
)

func newFleet(t *testing.T, revoked ...string) *fleet.Fleet {
	t.Helper()
	ctx := context.Background()
	st := storetest.Bolt(t)
	for _, id := range revoked {
		if _, err := store.Put(ctx, st, fleet.RevokedPrefix+id, []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	f, err := fleet.New(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func certOf(t *testing.T, uri string) *x509.Certificate {
	t.Helper()
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	return &x509.Certificate{URIs: []*url.URL{u}}
}

func TestIdentify(t *testing.T) {
	t.Parallel()
	identify := Identify(newFleet(t, "b-revoked"))
	tests := []struct {
		name    string
		certs   []*x509.Certificate
		want    string
		wantErr string
	}{
		{"a box", []*x509.Certificate{certOf(t, pki.BoxURIPrefix+"b-1")}, "b-1", ""},
		{"no certificate", nil, "", "no box certificate"},
		{"not a box's certificate", []*x509.Certificate{certOf(t, "https://example.com/")}, "", "names no box"},
		{"a revoked box", []*x509.Certificate{certOf(t, pki.BoxURIPrefix+"b-revoked")}, "", "revoked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := identify(tls.ConnectionState{PeerCertificates: tt.certs})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Identify = %q, %v; want an error saying %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Identify = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// TestPresenceOfABoxWithoutSession: a box with no session is offline; it
// was last seen when its last session came or went, until Flush hands
// that time to the fleet.
func TestPresenceOfABoxWithoutSession(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := tunnel.DefaultConfig()
	srv, err := tunnel.NewServer(tunnel.ServerConfig{Config: cfg, Identify: func(tls.ConnectionState) (string, error) { return "b-1", nil }}, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	p := New(srv, newFleet(t), cfg, log)
	if got := p.Presence("b-1"); got != (Status{}) {
		t.Fatalf("a box never seen: %+v, want nothing", got)
	}
	before := time.Now()
	p.OnSession(tunnel.SessionEvent{BoxID: "b-1", Up: false})
	got := p.Presence("b-1")
	if got.Online || got.LastSeen.Before(before) {
		t.Fatalf("a box whose session just ended: %+v, want offline and seen since %v", got, before)
	}
	if p.Online("b-1") {
		t.Error("Online of a box without a session = true")
	}
	if p.Drop("b-1") {
		t.Error("Drop of a box without a session reported one")
	}
	p.Flush(context.Background())
	if got := p.Presence("b-1"); !got.LastSeen.IsZero() {
		t.Fatalf("after Flush: %+v, want the time handed to the fleet", got)
	}
}
