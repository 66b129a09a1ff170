package health

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

type execer struct{ code int }

func (e execer) Exec(_ context.Context, _ string, argv []string, _, _ io.Writer) (int, error) {
	if argv[0] == "missing" {
		return 0, errors.New("no such program")
	}
	return e.code, nil
}

func TestCheck(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	open := ln.Addr().String()
	ln.Close() // now nothing listens there
	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln2.Close()
	p := New(context.Background(), func() {})
	for _, c := range []struct {
		probe *edgeboxv1.Probe
		ex    *execer
		fail  string
	}{
		{&edgeboxv1.Probe{Exec: []string{"true"}}, &execer{0}, ""},
		{&edgeboxv1.Probe{Exec: []string{"false"}}, &execer{1}, "exited with code 1"},
		{&edgeboxv1.Probe{Exec: []string{"missing"}}, &execer{0}, "no such program"},
		{&edgeboxv1.Probe{Exec: []string{"true"}}, nil, "cannot run exec probes"},
		{&edgeboxv1.Probe{Tcp: ln2.Addr().String()}, nil, ""},
		{&edgeboxv1.Probe{Tcp: open}, nil, "refused"},
		{&edgeboxv1.Probe{Http: "http://" + open + "/"}, nil, "refused"},
		{&edgeboxv1.Probe{}, nil, "needs exec, http or tcp"},
	} {
		var err error
		if c.ex != nil {
			err = p.check(context.Background(), "w", c.probe, c.ex)
		} else {
			err = p.check(context.Background(), "w", c.probe, nil)
		}
		if c.fail == "" && err != nil || c.fail != "" && (err == nil || !strings.Contains(err.Error(), c.fail)) {
			t.Errorf("%v: %v, want %q", c.probe, err, c.fail)
		}
	}
}
