package fleet

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edgebox/edgebox/console/store"
	"github.com/edgebox/edgebox/internal/test/etcdtest"
)

// newEtcd starts an embedded etcd server of the test's own, on ports the
// kernel picks, and returns a store on it: as consoles sharing state see it.
func newEtcd(t *testing.T) store.Store {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdtest.Start(t)}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s := store.NewEtcd(cli, "/edgebox/")
	t.Cleanup(func() {
		s.Close()
		cli.Close()
	})
	return s
}
