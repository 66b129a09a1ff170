// Package etcdtest starts an embedded etcd server of a test's own, one
// member on loopback ports the kernel picks, stopped when the test ends.
package etcdtest

import (
	"net/url"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Start starts the server and returns its client endpoint (HOST:PORT).
func Start(t testing.TB) string {
	t.Helper()
	return StartServer(t).Endpoint
}

// Server is a running embedded etcd.
type Server struct {
	// Endpoint is its client endpoint, HOST:PORT.
	Endpoint string
	e        *embed.Etcd
	once     sync.Once
}

// Stop stops the server, as a cluster that lost its quorum answers no
// one; the test's end stops it too.
func (s *Server) Stop() { s.once.Do(s.e.Close) }

// StartServer starts the server.
func StartServer(t testing.TB) *Server {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	cfg.LogLevel = "error"
	u, _ := url.Parse("http://127.0.0.1:0")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*u}, []url.URL{*u}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*u}, []url.URL{*u}
	cfg.InitialCluster = cfg.Name + "=" + u.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("embedded etcd: %v", err)
	}
	s := &Server{Endpoint: e.Clients[0].Addr().String(), e: e}
	t.Cleanup(s.Stop)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("embedded etcd not ready in 30 s")
	}
	return s
}
