package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Cluster is a running embedded etcd cluster of several members on
// loopback, stopped when the test ends.
type Cluster struct {
	Members []*Member
}

// Endpoints returns every member's client endpoint, HOST:PORT, stopped
// members' too: what a client of the whole cluster is given.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, 0, len(c.Members))
	for _, m := range c.Members {
		eps = append(eps, m.Endpoint)
	}
	return eps
}

// Member is one member of a Cluster. Restart is for the test's goroutine:
// it fails the test when the member does not start.
type Member struct {
	// Name is the member's name in the cluster; Endpoint its client
	// endpoint, HOST:PORT, which it keeps across a restart.
	Name     string
	Endpoint string

	t       testing.TB
	dir     string // its data directory, kept across a restart
	peer    string // its peer address, HOST:PORT
	initial string // the cluster's members, NAME=URL,...

	mu sync.Mutex  // guards e
	e  *embed.Etcd // nil while stopped
}

// StartCluster starts a cluster of n members (3 to survive the loss of
// one) and returns it once it serves. Every member must know the others'
// peer addresses before any starts, and etcd listens only on the
// addresses it is given: the ports are chosen first, then handed to etcd,
// and the cluster is started again on others when something took one
// meanwhile.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("etcdtest: a cluster of %d members", n)
	}
	for attempt := 1; ; attempt++ {
		c, err := startCluster(t, n)
		if err == nil {
			return c
		}
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			t.Fatalf("embedded etcd cluster: %v", err)
		}
	}
}

func startCluster(t testing.TB, n int) (*Cluster, error) {
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	var initial []string
	for i := range n {
		m := &Member{Name: fmt.Sprintf("m%d", i), Endpoint: ports[2*i], peer: ports[2*i+1], t: t, dir: t.TempDir()}
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"=http://"+m.peer)
	}
	for _, m := range c.Members {
		m.initial = strings.Join(initial, ",")
		t.Cleanup(m.Stop)
		if err := m.start(); err != nil {
			for _, m := range c.Members {
				m.Stop()
			}
			return nil, err
		}
	}
	timeout := time.After(readyTimeout)
	for _, m := range c.Members {
		select {
		case <-m.Ready():
		case <-timeout:
			t.Fatalf("embedded etcd cluster not ready in %v", readyTimeout)
		}
	}
	return c, nil
}

// freePorts returns n loopback addresses free now, all different: each
// is held until all are chosen.
func freePorts(n int) ([]string, error) {
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

func (m *Member) start() error {
	cfg := newConfig(m.dir)
	cfg.Name = m.Name
	cu, _ := url.Parse("http://" + m.Endpoint)
	pu, _ := url.Parse("http://" + m.peer)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	// Ignored on a restart: the member finds its cluster in its data
	// directory.
	cfg.InitialCluster = m.initial
	cfg.InitialClusterToken = "etcdtest"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("member %s: %w", m.Name, err)
	}
	m.mu.Lock()
	m.e = e
	m.mu.Unlock()
	return nil
}

// Stop stops the member; stopping a stopped member does nothing. It is
// etcd's graceful stop: a leader hands its lead to another member first,
// and a member that serves a watch waits for it to end, up to etcd's
// request timeout (7 s).
func (m *Member) Stop() {
	if e := m.take(); e != nil {
		e.Close()
	}
}

// Kill stops the member as a crash would: a leader hands nothing over,
// and the others see it gone when its heartbeats stop.
func (m *Member) Kill() {
	if e := m.take(); e != nil {
		e.Server.HardStop()
		e.Close()
	}
}

// take returns the running member's etcd, now stopping, or nil.
func (m *Member) take() *embed.Etcd {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.e
	m.e = nil
	return e
}

// Restart starts the member again (stopping it first if it runs) on its
// data directory and ports, so that it rejoins its cluster. It does not
// wait: the member serves once it has rejoined a quorum (Ready).
func (m *Member) Restart() {
	m.t.Helper()
	m.Stop()
	if err := m.start(); err != nil {
		m.t.Fatalf("restarting etcd: %v", err)
	}
}

// Ready is closed once the member serves as a member of its cluster; it
// is never closed while the member is stopped.
func (m *Member) Ready() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.e == nil {
		return nil
	}
	return m.e.Server.ReadyNotify()
}
