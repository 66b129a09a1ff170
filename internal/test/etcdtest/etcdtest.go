// Package etcdtest starts embedded etcd of a test's own on loopback
// ports, stopped when the test ends: one server (Start, StartServer), or
// a cluster of several members that a test stops and restarts one by one
// (StartCluster), to see what a console does when etcd loses members.
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
	cfg := newConfig(t.TempDir())
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
	case <-time.After(readyTimeout):
		t.Fatalf("embedded etcd not ready in %v", readyTimeout)
	}
	return s
}

// readyTimeout bounds the wait for a server, or a cluster, to serve.
const readyTimeout = 30 * time.Second

// newConfig is an etcd of etcd's default timing (100 ms heartbeats, a
// 1 s election timeout), as a console's cluster most likely runs, that
// logs only its errors.
func newConfig(dir string) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.LogLevel = "error"
	return cfg
}
