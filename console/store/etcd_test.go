package store_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/console/store/storetest"
)

// handedOut holds the ports freePort gave, so that parallel tests never
// get the same one (the kernel may offer a just-closed port again).
var handedOut = struct {
	sync.Mutex
	m map[string]bool
}{m: map[string]bool{}}

func freePort(t *testing.T) string {
	handedOut.Lock()
	defer handedOut.Unlock()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		if !handedOut.m[addr] {
			handedOut.m[addr] = true
			return addr
		}
	}
}

// newEtcd starts an embedded etcd server of its own and returns a store on
// it, so that revisions in a test are that test's alone.
func newEtcd(t *testing.T) store.Store {
	// Another process may take a port between its choice and etcd's
	// listen: try again with others.
	for attempt := 1; ; attempt++ {
		s, err := startEtcd(t)
		if err == nil {
			return s
		}
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			t.Fatalf("embedded etcd: %v", err)
		}
	}
}

func startEtcd(t *testing.T) (store.Store, error) {
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	cfg.LogLevel = "error"
	client, peer := freePort(t), freePort(t)
	cu, _ := url.Parse("http://" + client)
	pu, _ := url.Parse("http://" + peer)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = fmt.Sprintf("%s=http://%s", cfg.Name, peer)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		t.Fatal("embedded etcd not ready in 30 s")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: 5 * time.Second})
	if err != nil {
		e.Close()
		t.Fatal(err)
	}
	s := store.NewEtcd(cli, "/edgebox/")
	t.Cleanup(func() {
		s.Close()
		cli.Close()
		e.Close()
	})
	return s, nil
}

func TestEtcd(t *testing.T) { storetest.Suite(t, newEtcd) }

func TestParseEtcdURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in        string
		endpoints string
		prefix    string
		bad       bool
	}{
		{in: "etcd://10.0.0.1:2379", endpoints: "10.0.0.1:2379", prefix: "/edgebox/"},
		{in: "etcd://a:2379,b:2379,c:2379/bank-east", endpoints: "a:2379 b:2379 c:2379", prefix: "/bank-east/"},
		{in: "etcd://[::1]:2379/x/y/", endpoints: "[::1]:2379", prefix: "/x/y/"},
		{in: "http://a:2379", bad: true},
		{in: "etcd://a", bad: true},
		{in: "etcd://a:2379,", bad: true},
		{in: "etcd://", bad: true},
	} {
		got, err := store.ParseEtcdURL(tc.in)
		switch {
		case tc.bad && err == nil:
			t.Errorf("%q: %+v, want an error", tc.in, got)
		case !tc.bad && (err != nil || strings.Join(got.Endpoints, " ") != tc.endpoints || got.Prefix != tc.prefix):
			t.Errorf("%q: %+v, %v; want %s under %s", tc.in, got, err, tc.endpoints, tc.prefix)
		}
	}
}

// TestDialEtcdSaysWhenNothingAnswers: a console does not start on an
// etcd it cannot reach, and says which.
func TestDialEtcdSaysWhenNothingAnswers(t *testing.T) {
	t.Parallel()
	addr := freePort(t) // nothing listens there
	start := time.Now()
	_, err := store.DialEtcd(context.Background(), store.EtcdTarget{Endpoints: []string{addr}, Prefix: "/x/"}, time.Second)
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("dialled nothing: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v to give up", d)
	}
}
