//go:build linux

package usbhub

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/edgebox/edgebox/internal/test/require"
)

// TestSimulatedKeysHaveNodes: after MakeNodes, every simulated key has a
// node where Devices says, made on plug and on power cycle (with the new
// device number), removed on unplug; a node a workload was given keeps its
// owner when the nodes are made again (an agent restart), and anything
// stale goes; Close removes them all. As root a node is a character device
// that opens as /dev/null does; where mknod is refused it is a plain file.
func TestSimulatedKeysHaveNodes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		mknod    func(string) error // nil: the real one
		charDev  bool
		needRoot bool
	}{
		{name: "device nodes", charDev: true, needRoot: true},
		{name: "mknod refused", mknod: func(string) error { return unix.EPERM }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if c.needRoot {
				require.Root(t, "making device nodes")
			}
			cfg := SimConfig{Hubs: []SimHub{{Port: "1-1", Switchable: true}},
				Keys: []Device{{Port: "1-1.1", VendorID: "096e", ProductID: "0702", Serial: "A"}}}
			newSim := func() *Sim {
				s, err := NewSim(cfg)
				if err != nil {
					t.Fatal(err)
				}
				if c.mknod != nil {
					s.mknod = c.mknod
				}
				return s
			}
			ctx := context.Background()
			dir := filepath.Join(t.TempDir(), "usb-sim")
			s := newSim()
			if devs, _ := s.Devices(ctx); devs[0].Node != "" || !devs[0].Simulated {
				t.Fatalf("before MakeNodes: %+v", devs[0])
			}
			if err := s.MakeNodes(dir); err != nil {
				t.Fatal(err)
			}
			if err := s.MakeNodes(dir); err != nil {
				t.Fatalf("MakeNodes again: %v", err)
			}
			if err := s.MakeNodes(dir + "2"); err == nil {
				t.Fatal("MakeNodes in a second directory")
			}
			// nodes lists what is under dir, and checks each.
			nodes := func() []string {
				t.Helper()
				var out []string
				filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
					if err != nil || e.IsDir() {
						return err
					}
					out = append(out, strings.TrimPrefix(p, dir+"/"))
					var st unix.Stat_t
					if err := unix.Lstat(p, &st); err != nil {
						t.Fatal(err)
					}
					isChar := st.Mode&unix.S_IFMT == unix.S_IFCHR
					if isChar != c.charDev || st.Mode&0o777 != 0o660 {
						t.Fatalf("%s: mode %o, want a character device %v, 0660", p, st.Mode, c.charDev)
					}
					if isChar && (unix.Major(st.Rdev) != 1 || unix.Minor(st.Rdev) != 3) {
						t.Fatalf("%s is device %d:%d, not 1:3", p, unix.Major(st.Rdev), unix.Minor(st.Rdev))
					}
					return nil
				})
				sort.Strings(out)
				return out
			}
			want := func(what string, paths ...string) {
				t.Helper()
				if got := strings.Join(nodes(), " "); got != strings.Join(paths, " ") {
					t.Fatalf("%s: nodes %q, want %q", what, got, paths)
				}
				devs, _ := s.Devices(ctx)
				var named []string
				for _, d := range devs {
					named = append(named, strings.TrimPrefix(d.Node, dir+"/"))
				}
				sort.Strings(named)
				if strings.Join(named, " ") != strings.Join(paths, " ") {
					t.Fatalf("%s: Devices names %q, want %q", what, named, paths)
				}
			}
			want("the first key", "001/002")
			if err := s.Plug(Device{Port: "1-1.2", VendorID: "096e", ProductID: "0702", Serial: "B"}); err != nil {
				t.Fatal(err)
			}
			want("plugged", "001/002", "001/003")
			if err := s.PowerCycle(ctx, "1-1.2"); err != nil {
				t.Fatal(err)
			}
			want("power-cycled", "001/002", "001/004")
			if err := s.Unplug("1-1.2"); err != nil {
				t.Fatal(err)
			}
			want("unplugged", "001/002")

			// The node opens as a key's would for its holder: read and write.
			node := filepath.Join(dir, "001/002")
			f, err := os.OpenFile(node, os.O_RDWR, 0)
			if err != nil {
				t.Fatalf("opening the node: %v", err)
			}
			if _, err := f.Write([]byte("APDU")); err != nil {
				t.Fatalf("writing to the node: %v", err)
			}
			f.Close()

			// A restart: a workload was given the node; a stale node and a
			// link are left. The same keys come back with the same numbers.
			if os.Geteuid() == 0 {
				if err := os.Chown(node, 4242, -1); err != nil {
					t.Fatal(err)
				}
			}
			os.WriteFile(filepath.Join(dir, "001/009"), nil, 0o660)
			os.Symlink("/etc/passwd", filepath.Join(dir, "001/010"))
			s2 := newSim()
			if err := s2.MakeNodes(dir); err != nil {
				t.Fatal(err)
			}
			s = s2
			want("after a restart", "001/002")
			if fi, err := os.Stat(node); err != nil || (os.Geteuid() == 0 && fi.Sys().(*syscall.Stat_t).Uid != 4242) {
				t.Fatalf("the held node after a restart: %v %+v", err, fi)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatalf("Close again: %v", err)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Fatalf("after Close: %v", err)
			}
			if devs, _ := s.Devices(ctx); devs[0].Node != "" {
				t.Fatalf("a node named after Close: %+v", devs[0])
			}
		})
	}
}
