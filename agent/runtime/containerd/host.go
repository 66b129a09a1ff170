//go:build linux

package containerd

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Devices and volumes: what a container gets of the box.

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

// volumes makes (if needed) the box-local directories of a workload's
// volumes and returns their bind mounts. A volume belongs to the app (to
// the workload when it has no app), so a new release finds its data.
func (d *Driver) volumes(app, name string, vols []*edgeboxv1.Volume) ([]specs.Mount, error) {
	if d.cfg.VolumeDir == "" {
		return nil, errdefs.Invalid("workload %s has volumes, but this box keeps none", name)
	}
	owner := app
	if owner == "" {
		owner = name
	}
	if !edgeboxv1.ValidObjectName(owner) {
		return nil, errdefs.Invalid("workload %s: app %q cannot name a volume directory", name, owner)
	}
	var out []specs.Mount
	for _, v := range vols {
		if !edgeboxv1.ValidObjectName(v.GetName()) || !path.IsAbs(v.GetPath()) || path.Clean(v.GetPath()) == "/" {
			return nil, errdefs.Invalid("workload %s: volume %q at %q: give a name and an absolute path other than /", name, v.GetName(), v.GetPath())
		}
		dir := filepath.Join(d.cfg.VolumeDir, owner, v.GetName())
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		opts := []string{"rbind", "rw"}
		if v.GetReadOnly() {
			opts = []string{"rbind", "ro"}
		}
		out = append(out, specs.Mount{Type: "bind", Source: dir, Destination: path.Clean(v.GetPath()), Options: opts})
	}
	return out, nil
}
