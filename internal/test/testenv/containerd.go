//go:build linux

package testenv

import (
	"bytes"
	"context"
	"testing"

	"github.com/edgebox/edgebox/agent/runtime/containerd"
	"github.com/edgebox/edgebox/internal/test/ctrdtest"
)

// Containerd starts a containerd of the test's own and returns the
// edgebox driver on it, with the busybox test image imported when
// withImage; at the end of the test its containers are removed and it is
// closed.
func Containerd(t testing.TB, withImage bool) *containerd.Driver {
	t.Helper()
	sock := ctrdtest.Start(t)
	d, err := containerd.New(containerd.Config{Address: sock, LogDir: t.TempDir(), VolumeDir: t.TempDir(), RuncRoot: ctrdtest.RuncRoot(sock)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		list, _ := d.List(context.Background())
		for _, in := range list {
			d.Remove(context.Background(), in.Name)
		}
		d.Close()
	})
	if withImage {
		if _, err := d.Import(context.Background(), bytes.NewReader(ctrdtest.BusyboxImage(t))); err != nil {
			t.Fatal(err)
		}
	}
	return d
}
