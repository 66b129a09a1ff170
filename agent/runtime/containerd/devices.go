//go:build linux

package containerd

import (
	"context"
	"fmt"
	"os"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/edgebox/edgebox/agent/runtime"
)

// withKeys gives the container the device nodes of its leased USB keys
// and a device cgroup rule for exactly each of them; every other device
// stays denied.
func withKeys(devs []runtime.Device) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		if s.Linux.Resources == nil {
			s.Linux.Resources = &specs.LinuxResources{}
		}
		for _, d := range devs {
			var st unix.Stat_t
			if err := unix.Stat(d.HostPath, &st); err != nil {
				return fmt.Errorf("key %s: %w", d.KeyID, err)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFCHR {
				return fmt.Errorf("key %s: %s is not a character device", d.KeyID, d.HostPath)
			}
			major, minor := int64(unix.Major(uint64(st.Rdev))), int64(unix.Minor(uint64(st.Rdev)))
			mode := os.FileMode(0o660)
			var root uint32
			s.Linux.Devices = append(s.Linux.Devices, specs.LinuxDevice{Path: d.Path, Type: "c", Major: major, Minor: minor,
				FileMode: &mode, UID: &root, GID: &root})
			s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, specs.LinuxDeviceCgroup{Allow: true, Type: "c",
				Major: &major, Minor: &minor, Access: "rwm"})
		}
		return nil
	}
}
