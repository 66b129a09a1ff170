//go:build linux

// Package containerd is the runtime.Driver for containers: the containerd
// v2 client against the box's containerd, in the namespace "edgebox".
// Instances are containers named for their workload and labelled as
// edgebox's; their output goes to a log file per workload on the box,
// rotated when it grows. Containers get the box's workload network
// (agent/network: a bridge with NAT, published ports, the box's
// resolvers), the box's own, or none, and their release's egress policy
// (network.go, egress.go).
package containerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	cerrdefs "github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/edgebox/edgebox/agent/network"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Namespace is the containerd namespace of edgebox's containers and images.
const Namespace = "edgebox"

// Labels on edgebox's containers.
const (
	labelManaged   = "edgebox.io/managed"
	labelHash      = "edgebox.io/hash"
	labelApp       = "edgebox.io/app"
	labelRelease   = "edgebox.io/release"
	labelStartedAt = "edgebox.io/started-at"
	labelNetwork   = "edgebox.io/network" // the mode the container got: bridge, host or none
	labelAddress   = "edgebox.io/address" // its address on the bridge
	labelPorts     = "edgebox.io/ports"   // its published ports, comma-separated portStrings
	labelVeth      = "edgebox.io/veth"    // the box's end of its veth pair
)

// Config says how to reach containerd and where logs go.
type Config struct {
	// Address is containerd's socket, /run/containerd/containerd.sock by
	// default.
	Address string
	// LogDir holds one <workload>.log per instance.
	LogDir string
	// Snapshotter is "overlayfs" unless set.
	Snapshotter string
	// MaxLogBytes rotates a log (to <workload>.log.1) when it passed this
	// size at a start; default 10 MiB.
	MaxLogBytes int64
	// AgentAPIDir is the directory of the agent's local API socket,
	// mounted into every container at /run/edgebox; empty mounts none.
	AgentAPIDir string
	// VolumeDir holds the box-local volumes, one directory per app and
	// volume name, kept across releases; empty disables volumes.
	VolumeDir string
	// RuncRoot is runc's state directory; empty is runc's default. Set it
	// when another containerd on the same host may use the namespace
	// "edgebox" too, or their containers' states collide.
	RuncRoot string
	// Network attaches containers to the box's workload network; nil
	// (a box without the CNI plugins) gives them loopback only. The
	// driver sweeps it (Sweep): whatever else is attached to it must be
	// kept by KeepNetwork.
	Network *network.Network
	// KeepNetwork says which attachments of Network that are not this
	// driver's containers Sweep keeps: other drivers' (the qemu driver's
	// HoldsNetwork). nil keeps none.
	KeepNetwork func(id string) bool
	// StateDir holds each container's resolv.conf and hosts file;
	// required with Network. Empty: containers keep the image's.
	StateDir string
	// ResolvConf is the box's resolv.conf (network.HostResolvConf unless
	// set) and UpstreamResolvConf the servers behind a resolver on
	// loopback (network.UpstreamResolvConf unless set): bridged
	// containers get the servers they name.
	ResolvConf, UpstreamResolvConf string
	// Egress enforces the egress policies of bridged containers; nil: a
	// container whose release restricts egress is refused. The driver
	// sweeps it (Sweep), keeping what KeepNetwork holds.
	Egress *network.Policies
	// Proxy is the box's proxy, an http:// or https:// URL, passed as
	// HTTPS_PROXY and HTTP_PROXY to workloads that ask (proxy_env); empty:
	// the box has none.
	Proxy string
	// Log is where the driver logs; nil discards.
	Log *slog.Logger
	// Crash is for crash-point tests; production leaves it nil.
	Crash runtime.CrashHook
}

// crashPoints are the steps of the driver's operations between which a
// killed agent leaves something behind. containerd keeps the state; what
// the agent must get right is what it does between its calls.
var crashPoints = []string{
	"create/snapshot",
	"start/labelled", "start/task",
	"stop/signalled",
	"remove/stopped", "remove/task", "remove/container",
}

// netCrashPoints are the steps only a driver with a network takes.
var netCrashPoints = []string{"create/attached", "remove/detached"}

// CrashPoints lists where a crash hook is called.
func (d *Driver) CrashPoints() []string {
	if d.cfg.Network == nil {
		return crashPoints
	}
	return append(append([]string(nil), crashPoints...), netCrashPoints...)
}

func (d *Driver) at(point string) error { return d.cfg.Crash.At(d.CrashPoints(), point) }

var (
	_ runtime.CrashPointer = (*Driver)(nil)
	_ runtime.Sweeper      = (*Driver)(nil)
)

// Driver runs workloads as containerd containers.
type Driver struct {
	c     *client.Client
	cfg   Config
	log   *slog.Logger
	execs atomic.Int64 // names exec processes
}

// New connects to containerd.
func New(cfg Config) (*Driver, error) {
	if cfg.ResolvConf == "" {
		cfg.ResolvConf = network.HostResolvConf
	}
	if cfg.UpstreamResolvConf == "" {
		cfg.UpstreamResolvConf = network.UpstreamResolvConf
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Network != nil && cfg.StateDir == "" {
		return nil, errors.New("containerd: StateDir is required with a Network")
	}
	if err := validProxy(cfg.Proxy); err != nil {
		return nil, err
	}
	if cfg.Address == "" {
		cfg.Address = "/run/containerd/containerd.sock"
	}
	if cfg.Snapshotter == "" {
		cfg.Snapshotter = "overlayfs"
	}
	if cfg.MaxLogBytes <= 0 {
		cfg.MaxLogBytes = 10 << 20
	}
	if cfg.LogDir == "" {
		return nil, errors.New("containerd: LogDir is required")
	}
	if err := os.MkdirAll(cfg.LogDir, 0o700); err != nil {
		return nil, err
	}
	if cfg.StateDir != "" {
		if err := os.MkdirAll(cfg.StateDir, 0o711); err != nil {
			return nil, err
		}
	}
	c, err := client.New(cfg.Address, client.WithDefaultNamespace(Namespace), client.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("containerd at %s: %w", cfg.Address, err)
	}
	return &Driver{c: c, cfg: cfg, log: cfg.Log.With("component", edgeboxv1.RuntimeContainerd)}, nil
}

// Close closes the connection to containerd; containers keep running.
func (d *Driver) Close() error { return d.c.Close() }

// Client is the containerd client, for importing images.
func (d *Driver) Client() *client.Client { return d.c }

func (d *Driver) Runtime() string { return edgeboxv1.RuntimeContainerd }

// Import loads images from a docker-save or OCI archive into edgebox's
// namespace, for boxes that get images on a USB stick instead of from the
// console, and returns their names.
func (d *Driver) Import(ctx context.Context, r io.Reader) ([]string, error) {
	imgs, err := d.c.Import(ns(ctx), r)
	if err != nil {
		return nil, translate(err, "importing images")
	}
	names := make([]string, 0, len(imgs))
	for _, img := range imgs {
		names = append(names, img.Name)
	}
	return names, nil
}

func ns(ctx context.Context) context.Context { return namespaces.WithNamespace(ctx, Namespace) }

// translate turns containerd's error kinds into edgebox's.
func translate(err error, format string, a ...any) error {
	msg := fmt.Sprintf(format, a...)
	switch {
	case err == nil:
		return nil
	case cerrdefs.IsNotFound(err):
		return errdefs.NotFound("%s: %w", msg, err)
	case cerrdefs.IsAlreadyExists(err):
		return errdefs.Conflict("%s: %w", msg, err)
	}
	return fmt.Errorf("%s: %w", msg, err)
}

func (d *Driver) logPath(name string) string { return filepath.Join(d.cfg.LogDir, name+".log") }

// Create makes the container of s from its image, which must be on the
// box already.
func (d *Driver) Create(ctx context.Context, s runtime.Spec) error {
	ctx = ns(ctx)
	w := s.Workload
	img, err := d.c.GetImage(ctx, w.GetImage())
	if err != nil {
		return translate(err, "image %s is not on this box", w.GetImage())
	}
	if ok, err := img.IsUnpacked(ctx, d.cfg.Snapshotter); err != nil {
		return translate(err, "image %s", w.GetImage())
	} else if !ok {
		if err := img.Unpack(ctx, d.cfg.Snapshotter); err != nil {
			return translate(err, "unpacking %s", w.GetImage())
		}
	}
	imageConfig := oci.WithImageConfig(img)
	if len(w.GetArgs()) > 0 {
		imageConfig = oci.WithImageConfigArgs(img, w.GetArgs())
	}
	specOpts := []oci.SpecOpts{imageConfig, oci.WithHostname(s.Name)}
	if w.GetProxyEnv() {
		specOpts = append(specOpts, oci.WithEnv(d.proxyEnv(s.Name)))
	}
	specOpts = append(specOpts, oci.WithEnv(w.GetEnv()))
	if d.cfg.AgentAPIDir != "" {
		// The directory, not the socket: a socket made again after a
		// restart of the agent is then there for running containers too.
		// Read-only: a container connects to the socket, and can neither
		// replace it nor plant anything beside it.
		specOpts = append(specOpts, oci.WithMounts([]specs.Mount{{Type: "bind", Source: d.cfg.AgentAPIDir,
			Destination: runtime.AgentAPIInContainer, Options: []string{"rbind", "ro"}}}),
			oci.WithEnv([]string{runtime.AgentAPIEnv + "=unix://" + runtime.AgentAPIInContainer + "/agent.sock"}))
	}
	if m := w.GetCpuMillis(); m > 0 {
		// CFS: m thousandths of a CPU in every 100 ms period.
		specOpts = append(specOpts, oci.WithCPUCFS(m*100, 100000))
	}
	if b := w.GetMemoryBytes(); b > 0 {
		specOpts = append(specOpts, oci.WithMemoryLimit(uint64(b)))
	}
	if len(s.Devices) > 0 {
		specOpts = append(specOpts, withKeys(s.Devices))
	}
	if vols := w.GetVolumes(); len(vols) > 0 {
		mounts, err := d.volumes(w.GetApp(), s.Name, vols)
		if err != nil {
			return err
		}
		specOpts = append(specOpts, oci.WithMounts(mounts))
	}
	if _, err := d.c.LoadContainer(ctx, s.Name); err == nil {
		return errdefs.Conflict("instance %s exists", s.Name)
	} else if !cerrdefs.IsNotFound(err) {
		return translate(err, "instance %s", s.Name)
	}
	// A root filesystem without its container is what an agent killed
	// between making the two leaves: it is made again.
	sn := d.c.SnapshotService(d.cfg.Snapshotter)
	if _, err := sn.Stat(ctx, rootfs(s.Name)); err == nil {
		if err := sn.Remove(ctx, rootfs(s.Name)); err != nil && !cerrdefs.IsNotFound(err) {
			return translate(err, "clearing the root filesystem a killed agent left of %s", s.Name)
		}
	} else if !cerrdefs.IsNotFound(err) {
		return translate(err, "root filesystem of %s", s.Name)
	}
	// The network comes before the container, whose spec names its
	// namespace, and is attached while the container is made; a killed
	// agent leaves it to the next Create of the name or to Sweep.
	nw, err := d.setupNetwork(ctx, s.Name, w)
	if err != nil {
		return fmt.Errorf("workload %s: %w", s.Name, err)
	}
	specOpts = append(specOpts, nw.opts...)
	labels := map[string]string{labelManaged: "true", labelHash: s.Hash, labelApp: w.GetApp(), labelRelease: w.GetRelease()}
	for k, v := range nw.labels {
		labels[k] = v
	}
	crashed := false
	defer func() {
		if nw.attached != nil {
			<-nw.attached // the attach ends before Create does
		}
		if err != nil && !crashed {
			if terr := d.teardown(context.WithoutCancel(ctx), s.Name, nw.ports, ""); terr != nil {
				d.log.Warn("undoing the network of a failed create", "workload", s.Name, "err", terr)
			}
		}
	}()
	// The snapshot and the container are made under a lease of the
	// driver's, which a killed agent leaves behind with the snapshot.
	lease, err := d.c.LeasesService().Create(ctx, leases.WithRandomID(), leases.WithExpiration(time.Hour))
	if err != nil {
		return translate(err, "creating %s", s.Name)
	}
	defer func() {
		if !crashed {
			d.c.LeasesService().Delete(context.WithoutCancel(ctx), lease)
		}
	}()
	ctx = leases.WithLease(ctx, lease.ID)
	// What an earlier instance of the name logged is not this one's.
	os.Remove(d.logPath(s.Name))
	os.Remove(d.logPath(s.Name) + ".1")
	opts := []client.NewContainerOpts{client.WithImage(img)}
	if d.cfg.RuncRoot != "" {
		opts = append(opts, client.WithRuntime("io.containerd.runc.v2", &runcoptions.Options{Root: d.cfg.RuncRoot}))
	}
	c, err := d.c.NewContainer(ctx, s.Name, append(opts,
		client.WithSnapshotter(d.cfg.Snapshotter),
		client.WithNewSnapshot(rootfs(s.Name), img),
		client.WithNewSpec(specOpts...),
		client.WithContainerLabels(labels),
		func(context.Context, *client.Client, *containers.Container) error {
			err := d.at("create/snapshot")
			crashed = err != nil
			return err
		},
	)...)
	if err != nil {
		err = translate(err, "creating %s", s.Name)
		return err
	}
	if crashed, err = d.finishNetwork(ctx, s.Name, nw); err != nil {
		if crashed {
			return err
		}
		// No container without its network.
		if derr := c.Delete(context.WithoutCancel(ctx), client.WithSnapshotCleanup); derr != nil && !cerrdefs.IsNotFound(derr) {
			d.log.Warn("deleting a container whose network failed", "workload", s.Name, "err", derr)
		}
		err = fmt.Errorf("workload %s: %w", s.Name, err)
		return err
	}
	if a := nw.labels[labelAddress]; a != "" {
		if _, err = c.SetLabels(ctx, map[string]string{labelAddress: a, labelVeth: nw.labels[labelVeth]}); err != nil {
			err = translate(err, "labelling %s", s.Name)
			return err
		}
	}
	return nil
}

// rootfs is the key of an instance's root filesystem snapshot.
func rootfs(name string) string { return name + "-rootfs" }

// Start starts the container's task; a running one is left alone, an
// ended one is replaced.
func (d *Driver) Start(ctx context.Context, name string) error {
	ctx = ns(ctx)
	c, err := d.c.LoadContainer(ctx, name)
	if err != nil {
		return translate(err, "instance %s", name)
	}
	if t, err := c.Task(ctx, nil); err == nil {
		st, err := t.Status(ctx)
		if err != nil {
			return translate(err, "instance %s", name)
		}
		if st.Status == client.Running || st.Status == client.Paused {
			return nil
		}
		if _, err := t.Delete(ctx, client.WithProcessKill); err != nil && !cerrdefs.IsNotFound(err) {
			return translate(err, "clearing the old task of %s", name)
		}
	} else if !cerrdefs.IsNotFound(err) {
		return translate(err, "instance %s", name)
	}
	d.rotate(name)
	labels, err := c.Labels(ctx)
	if err != nil {
		return translate(err, "instance %s", name)
	}
	set, err := d.reattach(ctx, name, labels)
	if err != nil {
		return fmt.Errorf("workload %s: %w", name, err)
	}
	if set == nil {
		set = map[string]string{}
	}
	// The start time is recorded first: a task an agent killed after
	// starting it then has its time.
	set[labelStartedAt] = strconv.FormatInt(time.Now().UnixNano(), 10)
	if _, err := c.SetLabels(ctx, set); err != nil {
		return translate(err, "labelling %s", name)
	}
	if err := d.at("start/labelled"); err != nil {
		return err
	}
	t, err := d.newTask(ctx, c, name)
	if err != nil {
		return translate(err, "starting %s", name)
	}
	if err := d.at("start/task"); err != nil {
		return err
	}
	if err := t.Start(ctx); err != nil {
		t.Delete(ctx, client.WithProcessKill)
		return translate(err, "starting %s", name)
	}
	return nil
}

// newTask makes the container's task. When the shim of its last task
// was killed, containerd no longer shows that task but removes it only
// once it has cleaned up after the shim, in the background: until then
// making a task is refused as existing, and newTask waits for it.
func (d *Driver) newTask(ctx context.Context, c client.Container, name string) (client.Task, error) {
	deadline := time.Now().Add(taskCleanupWait)
	for {
		t, err := c.NewTask(ctx, cio.LogFile(d.logPath(name)))
		if err == nil || !cerrdefs.IsAlreadyExists(err) || time.Now().After(deadline) {
			return t, err
		}
		if _, terr := c.Task(ctx, nil); terr == nil {
			return nil, err // a task that is there: not a dead shim's
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// taskCleanupWait bounds newTask's wait for containerd to clean up after
// a killed shim; it takes well under a second on a 2-core box.
const taskCleanupWait = 15 * time.Second

// rotate moves a log that grew past MaxLogBytes aside.
func (d *Driver) rotate(name string) {
	p := d.logPath(name)
	if fi, err := os.Stat(p); err == nil && fi.Size() > d.cfg.MaxLogBytes {
		os.Rename(p, p+".1")
	}
}

// Stop sends SIGTERM and, after timeout, SIGKILL. The ended task stays, so
// Inspect reports the exit code.
func (d *Driver) Stop(ctx context.Context, name string, timeout time.Duration) error {
	ctx = ns(ctx)
	c, err := d.c.LoadContainer(ctx, name)
	if cerrdefs.IsNotFound(err) {
		return nil
	} else if err != nil {
		return translate(err, "instance %s", name)
	}
	t, err := c.Task(ctx, nil)
	if cerrdefs.IsNotFound(err) {
		return nil
	} else if err != nil {
		return translate(err, "instance %s", name)
	}
	st, err := t.Status(ctx)
	if err != nil {
		return translate(err, "instance %s", name)
	}
	if st.Status == client.Stopped || st.Status == client.Created {
		return nil
	}
	exited, err := t.Wait(ctx)
	if err != nil {
		return translate(err, "waiting for %s", name)
	}
	if err := t.Kill(ctx, syscall.SIGTERM); err != nil && !cerrdefs.IsNotFound(err) {
		return translate(err, "stopping %s", name)
	}
	if err := d.at("stop/signalled"); err != nil {
		return err
	}
	select {
	case <-exited:
		return nil
	case <-time.After(timeout):
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := t.Kill(ctx, syscall.SIGKILL); err != nil && !cerrdefs.IsNotFound(err) {
		return translate(err, "killing %s", name)
	}
	select {
	case <-exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Remove stops the instance (10 s grace) and deletes its task, container,
// root filesystem and logs.
func (d *Driver) Remove(ctx context.Context, name string) error {
	if err := d.Stop(ctx, name, 10*time.Second); err != nil {
		return err
	}
	if err := d.at("remove/stopped"); err != nil {
		return err
	}
	ctx = ns(ctx)
	c, err := d.c.LoadContainer(ctx, name)
	if cerrdefs.IsNotFound(err) {
		// What a killed Remove or Create left of its network.
		if d.hasNetwork(name) {
			return d.teardown(ctx, name, nil, "")
		}
		return nil
	} else if err != nil {
		return translate(err, "instance %s", name)
	}
	labels, err := c.Labels(ctx)
	if err != nil {
		return translate(err, "instance %s", name)
	}
	if t, err := c.Task(ctx, nil); err == nil {
		if _, err := t.Delete(ctx, client.WithProcessKill); err != nil && !cerrdefs.IsNotFound(err) {
			return translate(err, "deleting the task of %s", name)
		}
	}
	if err := d.at("remove/task"); err != nil {
		return err
	}
	if err := c.Delete(ctx, client.WithSnapshotCleanup); err != nil && !cerrdefs.IsNotFound(err) {
		return translate(err, "deleting %s", name)
	}
	if err := d.at("remove/container"); err != nil {
		return err
	}
	if err := d.teardown(ctx, name, labelledPorts(labels[labelPorts]), "remove/detached"); err != nil {
		return fmt.Errorf("removing the network of %s: %w", name, err)
	}
	os.Remove(d.logPath(name))
	os.Remove(d.logPath(name) + ".1")
	return nil
}

// Sweep removes the root filesystems that killed agents left without
// their containers. containerd keeps every process in a container of its
// own, which List shows: it has no other orphans.
func (d *Driver) Sweep(ctx context.Context) ([]runtime.Orphan, error) {
	ctx = ns(ctx)
	sn := d.c.SnapshotService(d.cfg.Snapshotter)
	var left []string
	err := sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if name, ok := strings.CutSuffix(info.Name, "-rootfs"); ok && info.Kind == snapshots.KindActive {
			if _, err := d.c.LoadContainer(ctx, name); cerrdefs.IsNotFound(err) {
				left = append(left, info.Name)
			}
		}
		return nil
	})
	if err != nil {
		return nil, translate(err, "listing root filesystems")
	}
	var out []runtime.Orphan
	for _, key := range left {
		if err := sn.Remove(ctx, key); err != nil && !cerrdefs.IsNotFound(err) {
			return out, translate(err, "removing the root filesystem %s", key)
		}
		out = append(out, runtime.Orphan{Name: strings.TrimSuffix(key, "-rootfs"), What: "a root filesystem without its container"})
	}
	// The network of containers that are gone: all of edgebox's
	// containers are kept, whatever their labels.
	cs, err := d.c.Containers(ctx)
	if err != nil {
		return out, translate(err, "listing containers")
	}
	keep := map[string]map[string]string{}
	for _, c := range cs {
		labels, err := c.Labels(ctx)
		if err != nil && !cerrdefs.IsNotFound(err) {
			return out, translate(err, "instance %s", c.ID())
		}
		keep[c.ID()] = labels
	}
	gone, err := d.sweepNetwork(ctx, keep)
	for _, name := range gone {
		out = append(out, runtime.Orphan{Name: name, What: "the network of a container that is gone"})
	}
	if err != nil {
		return out, fmt.Errorf("sweeping the network of gone containers: %w", err)
	}
	return out, nil
}

// List returns edgebox's containers.
func (d *Driver) List(ctx context.Context) ([]runtime.Instance, error) {
	ctx = ns(ctx)
	cs, err := d.c.Containers(ctx, `labels."`+labelManaged+`"==true`)
	if err != nil {
		return nil, translate(err, "listing containers")
	}
	out := make([]runtime.Instance, 0, len(cs))
	for _, c := range cs {
		in, err := d.inspect(ctx, c)
		if cerrdefs.IsNotFound(err) {
			continue // removed meanwhile
		} else if err != nil {
			return nil, err
		}
		out = append(out, in)
	}
	return out, nil
}

// Inspect returns one instance.
func (d *Driver) Inspect(ctx context.Context, name string) (runtime.Instance, error) {
	ctx = ns(ctx)
	c, err := d.c.LoadContainer(ctx, name)
	if err != nil {
		return runtime.Instance{}, translate(err, "instance %s", name)
	}
	return d.inspect(ctx, c)
}

func (d *Driver) inspect(ctx context.Context, c client.Container) (runtime.Instance, error) {
	labels, err := c.Labels(ctx)
	if err != nil {
		return runtime.Instance{}, translate(err, "instance %s", c.ID())
	}
	in := runtime.Instance{Name: c.ID(), Hash: labels[labelHash], State: runtime.StateCreated, Address: labels[labelAddress]}
	if p := labels[labelPorts]; p != "" {
		in.Ports = strings.Split(p, ",")
	}
	if ns, err := strconv.ParseInt(labels[labelStartedAt], 10, 64); err == nil {
		in.StartedAt = time.Unix(0, ns)
	}
	t, err := c.Task(ctx, nil)
	if cerrdefs.IsNotFound(err) {
		return in, nil
	} else if err != nil {
		return runtime.Instance{}, translate(err, "instance %s", c.ID())
	}
	st, err := t.Status(ctx)
	if err != nil {
		return runtime.Instance{}, translate(err, "instance %s", c.ID())
	}
	switch st.Status {
	case client.Running, client.Paused, client.Pausing:
		in.State = runtime.StateRunning
	case client.Stopped:
		in.State, in.ExitCode = runtime.StateExited, int(st.ExitStatus)
	}
	return in, nil
}

// Exec runs argv in the running instance, with the instance's
// environment and user, and returns its exit code.
func (d *Driver) Exec(ctx context.Context, name string, argv []string, stdout, stderr io.Writer) (int, error) {
	if len(argv) == 0 {
		return 0, errdefs.Invalid("exec in %s: no command", name)
	}
	ctx = ns(ctx)
	c, err := d.c.LoadContainer(ctx, name)
	if err != nil {
		return 0, translate(err, "instance %s", name)
	}
	t, err := c.Task(ctx, nil)
	if cerrdefs.IsNotFound(err) {
		return 0, errdefs.Conflict("instance %s is not running", name)
	} else if err != nil {
		return 0, translate(err, "instance %s", name)
	}
	spec, err := c.Spec(ctx)
	if err != nil {
		return 0, translate(err, "instance %s", name)
	}
	ps := *spec.Process
	ps.Args, ps.Terminal = argv, false
	id := fmt.Sprintf("exec-%d", d.execs.Add(1))
	p, err := t.Exec(ctx, id, &ps, cio.NewCreator(cio.WithStreams(nil, stdout, stderr)))
	if err != nil {
		return 0, translate(err, "exec in %s", name)
	}
	defer p.Delete(context.WithoutCancel(ctx), client.WithProcessKill)
	exited, err := p.Wait(ctx)
	if err != nil {
		return 0, translate(err, "exec in %s", name)
	}
	if err := p.Start(ctx); err != nil {
		return 0, translate(err, "exec in %s", name)
	}
	select {
	case st := <-exited:
		p.IO().Wait() // all output copied
		code, _, err := st.Result()
		return int(code), err
	case <-ctx.Done():
		p.Kill(context.WithoutCancel(ctx), syscall.SIGKILL)
		return 0, ctx.Err()
	}
}

// Logs writes the last tail lines of the instance's output.
func (d *Driver) Logs(ctx context.Context, name string, tail int, w io.Writer) error {
	if _, err := d.Inspect(ctx, name); err != nil {
		return err
	}
	return runtime.TailFile(d.logPath(name), tail, w)
}
