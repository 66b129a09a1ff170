package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdTarget is where a console's store lives on etcd: the cluster's
// client endpoints, and the prefix every key of the store lives under.
type EtcdTarget struct {
	Endpoints []string
	Prefix    string
}

// DefaultEtcdPrefix is the prefix of a target that names none.
const DefaultEtcdPrefix = "/edgebox/"

// ParseEtcdURL reads etcd://HOST:PORT[,HOST:PORT...][/PREFIX], the
// console's --store for a store on etcd; the prefix is /edgebox/ when
// the URL names none.
func ParseEtcdURL(s string) (EtcdTarget, error) {
	rest, ok := strings.CutPrefix(s, "etcd://")
	if !ok {
		return EtcdTarget{}, fmt.Errorf("store %q: want etcd://HOST:PORT[,HOST:PORT...][/PREFIX]", s)
	}
	hosts, prefix, _ := strings.Cut(rest, "/")
	var t EtcdTarget
	for _, h := range strings.Split(hosts, ",") {
		host, port, err := net.SplitHostPort(h)
		if err != nil || host == "" || port == "" {
			return EtcdTarget{}, fmt.Errorf("store %q: %q is not HOST:PORT", s, h)
		}
		t.Endpoints = append(t.Endpoints, h)
	}
	t.Prefix = DefaultEtcdPrefix
	if prefix = strings.Trim(prefix, "/"); prefix != "" {
		t.Prefix = "/" + prefix + "/"
	}
	return t, nil
}

// DialEtcd connects to the cluster t names and checks that it answers
// within timeout: a console does not start on a store it cannot reach. It
// starts on a cluster that has lost its quorum, as a console on it runs:
// with reads from the member it reaches, and writes refused. The store it
// returns owns its client and closes it.
func DialEtcd(ctx context.Context, t EtcdTarget, timeout time.Duration) (*Etcd, error) {
	if len(t.Endpoints) == 0 {
		return nil, errors.New("store: no etcd endpoints")
	}
	// The client's own log is silent: what fails reaches the console as
	// errors, which it logs itself.
	cli, err := clientv3.New(clientv3.Config{Endpoints: t.Endpoints, DialTimeout: timeout, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("store: etcd at %s: %w", strings.Join(t.Endpoints, ","), err)
	}
	s := NewEtcd(cli, t.Prefix)
	s.owned = true
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := s.read(cctx, t.Prefix, clientv3.WithCountOnly()); err != nil {
		s.Close()
		return nil, fmt.Errorf("store: etcd at %s does not answer: %w", strings.Join(t.Endpoints, ","), err)
	}
	return s, nil
}
