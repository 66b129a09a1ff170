//go:build linux || windows

// Package qemu is the runtime.Driver for virtual machines: QEMU with KVM
// (Linux) or WHPX (Windows) when the box has it and TCG otherwise. A VM image (a disk, or a kernel
// and initrd) comes from the console's registry as an OCI artifact; each
// instance runs on its own qcow2 overlay, made anew at every start unless
// the workload keeps its state, so every robot starts from a clean image.
// QEMU runs detached from the agent (an agent restart leaves VMs running)
// with QMP, VNC and a serial port on unix sockets in the instance's
// directory; the first serial port (the guest's console) is logged to a
// file.
//
// On disk, under the state directory:
//
//	images/<manifest hex>/   disk.qcow2, kernel, initrd, vm.json
//	vms/<name>/              instance.json, overlay.qcow2, qemu.pid,
//	                         qmp.sock, vnc.sock, serial.sock, serial.log
//	vms/.rm-<name>-<n>/      a VM being deleted, its QEMU ended
//
// A VM's QEMU is found by its pid file and, before QEMU has written it
// (an agent killed while QEMU came up), by the pid file named on its
// command line, so a restarted agent never starts a second QEMU for a VM.
//
// A bridged VM (Linux, Config.Network set) is attached to the workload
// network as "VM-<name>": a network namespace of its own under the
// network's NetnsDir, with the VM's tap bridged to its eth0 (see
// agent/network's AttachTap), attached at its first start and detached
// at its removal. QEMU gets the tap as fd 3. Run serves the VMs' DHCP;
// HoldsNetwork tells the network's and the egress policies' sweeps which
// attachments are the driver's.
package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/images/vm"
	"github.com/edgebox/edgebox/internal/atomicfile"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Config says where QEMU is and where VMs live.
type Config struct {
	// StateDir holds images and instances. Unix socket paths must fit 108
	// bytes: keep it short.
	StateDir string
	// Binary is qemu-system-x86_64 and Img qemu-img, found on PATH unless
	// set.
	Binary, Img string
	// Accel is QEMU's accelerator list, such as "kvm" or "whpx:tcg";
	// empty picks KVM when /dev/kvm can be opened (Linux), WHPX falling
	// back to TCG (Windows), TCG otherwise.
	Accel string
	// MaxLogBytes rotates serial.log at a start past this size; default
	// 10 MiB.
	MaxLogBytes int64
	// ExtraArgs go at the end of every QEMU command line (tests: -S, a
	// VM that answers QMP and runs no guest).
	ExtraArgs []string
	// Crash is for crash-point tests; production leaves it nil.
	Crash runtime.CrashHook
	// Network is edgebox's workload bridge, which VMs on network "" or
	// "bridge" are attached to (Linux). Nil: they get QEMU's user-mode
	// network, as on Windows hosts.
	Network *Network
	// Egress enforces the egress policies of bridged VMs (Linux). A VM
	// whose release restricts egress does not start without it, nor on
	// the user-mode network, where no policy can be enforced.
	Egress *EgressPolicies
	// Log is where the driver logs; nil discards.
	Log *slog.Logger
}

// crashPoints are the steps of the driver's operations between which a
// killed agent leaves something behind.
var crashPoints = []string{
	"create/dir",
	"start/overlay", "start/recorded", "start/launching", "start/launched",
	"stop/signalled",
	"remove/stopped", "remove/renamed",
}

// CrashPoints lists where a crash hook is called.
func (d *Driver) CrashPoints() []string { return crashPoints }

func (d *Driver) at(point string) error { return d.cfg.Crash.At(crashPoints, point) }

// Driver runs workloads as QEMU VMs.
type Driver struct {
	cfg Config
	log *slog.Logger
	mu  sync.Mutex // one lifecycle change at a time

	// egressMu guards egressFor: the address each VM's egress policy was
	// applied for by this process (Start, or Run after an agent restart).
	egressMu  sync.Mutex
	egressFor map[string]string

	// serialMu guards serialInUse: the VMs whose serial console a
	// session holds.
	serialMu    sync.Mutex
	serialInUse map[string]bool

	// redirMu serialises AttachRedir and DetachRedir, whose QMP steps
	// must not interleave.
	redirMu sync.Mutex
}

// Defaults for a VM whose release and image say nothing.
const (
	defaultMemory = 512 << 20
	defaultCPUs   = 1
)

// New checks that QEMU is there.
func New(cfg Config) (*Driver, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("qemu: StateDir is required")
	}
	if cfg.Binary == "" {
		cfg.Binary = "qemu-system-x86_64"
	}
	if cfg.Img == "" {
		cfg.Img = "qemu-img"
	}
	for _, p := range []*string{&cfg.Binary, &cfg.Img} {
		path, err := exec.LookPath(*p)
		if err != nil {
			return nil, fmt.Errorf("qemu: %s not found: install QEMU (Debian: qemu-system-x86 qemu-utils)", *p)
		}
		*p = path
	}
	if cfg.Accel == "" {
		cfg.Accel = defaultAccel()
	}
	if cfg.MaxLogBytes <= 0 {
		cfg.MaxLogBytes = 10 << 20
	}
	for _, d := range []string{"images", "vms"} {
		if err := os.MkdirAll(filepath.Join(cfg.StateDir, d), 0o700); err != nil {
			return nil, err
		}
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Driver{cfg: cfg, log: log.With("component", edgeboxv1.RuntimeQEMU), egressFor: map[string]string{}}, nil
}

func (d *Driver) Runtime() string { return edgeboxv1.RuntimeQEMU }

// Accel is the accelerator VMs run with.
func (d *Driver) Accel() string { return d.cfg.Accel }

// instance is what the driver keeps of one VM, in instance.json.
type instance struct {
	Name     string           `json:"name"`
	Hash     string           `json:"hash"`
	Workload json.RawMessage  `json:"workload"`          // protobuf JSON
	Image    string           `json:"image"`             // directory under images/
	Devices  []runtime.Device `json:"devices,omitempty"` // leased USB keys
	Started  time.Time        `json:"started,omitzero"`
	Stopped  bool             `json:"stopped,omitempty"` // by the driver, so it exited cleanly
	Net      *vmNet           `json:"net,omitempty"`     // its network, from its first start
}

// vmNet is a VM's network: kept from its first start to its removal, so
// its address does not change when it starts again.
type vmNet struct {
	Mode    string `json:"mode"`
	Addr    string `json:"addr,omitempty"`    // bridge: its address and the subnet's length
	Gateway string `json:"gateway,omitempty"` // bridge: the bridge's address
	HostIf  string `json:"host_if,omitempty"` // bridge: the box's end of its veth
	Ports   []port `json:"ports,omitempty"`
}

func (d *Driver) vmDir(name string) string   { return filepath.Join(d.cfg.StateDir, "vms", name) }
func (d *Driver) imageDir(hex string) string { return filepath.Join(d.cfg.StateDir, "images", hex) }
func sock(dir, what string) string           { return filepath.Join(dir, what+".sock") }

func (d *Driver) load(name string) (instance, error) {
	var in instance
	raw, err := os.ReadFile(filepath.Join(d.vmDir(name), "instance.json"))
	if errors.Is(err, os.ErrNotExist) {
		return in, errdefs.NotFound("no VM %q", name)
	} else if err != nil {
		return in, err
	}
	return in, json.Unmarshal(raw, &in)
}

func (d *Driver) save(in instance) error {
	raw, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(d.vmDir(in.Name), "instance.json"), raw)
}

// imageOf returns the directory of a fetched VM image, by the manifest
// digest its reference names.
func (d *Driver) imageOf(ref string) (string, error) {
	r, err := vm.ParseRef(ref)
	if err != nil {
		return "", err
	}
	hex, _ := strings.CutPrefix(r.Digest, "sha256:")
	return d.imageDir(hex), nil
}

// HasImage says whether the VM image ref has been fetched whole.
func (d *Driver) HasImage(_ context.Context, ref string) (bool, error) {
	dir, err := d.imageOf(ref)
	if err != nil {
		return false, err
	}
	_, err = os.Stat(filepath.Join(dir, vm.ConfigFile))
	return err == nil, nil
}

// Pull fetches the VM image ref through hc.
func (d *Driver) Pull(ctx context.Context, ref string, hc *http.Client, progress func(runtime.Progress)) error {
	r, err := vm.ParseRef(ref)
	if err != nil {
		return err
	}
	dir, _ := d.imageOf(ref)
	if hc == nil {
		hc = http.DefaultClient
	}
	return vm.Fetch(ctx, hc, r, dir, func(done, total int64) {
		if progress != nil {
			progress(runtime.Progress{Done: done, Total: total})
		}
	})
}

// Create records the VM; its overlay is made at start.
func (d *Driver) Create(ctx context.Context, s runtime.Spec) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.load(s.Name); err == nil {
		return errdefs.Conflict("VM %q exists", s.Name)
	}
	img, err := d.imageOf(s.Workload.GetImage())
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(img, vm.ConfigFile)); err != nil {
		return errdefs.NotFound("VM image %s is not on this box", s.Workload.GetImage())
	}
	raw, err := protojson.Marshal(s.Workload)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.vmDir(s.Name), 0o700); err != nil {
		return err
	}
	if err := d.at("create/dir"); err != nil {
		return err
	}
	return d.save(instance{Name: s.Name, Hash: s.Hash, Workload: raw, Image: filepath.Base(img), Devices: s.Devices})
}

// OverlayPath is the disk overlay of VM name.
func (d *Driver) OverlayPath(name string) string {
	return filepath.Join(d.vmDir(name), "overlay.qcow2")
}

// pid returns the VM's QEMU process, 0 when it does not run.
func (d *Driver) pid(name string) int {
	raw, err := os.ReadFile(filepath.Join(d.vmDir(name), "qemu.pid"))
	if err == nil {
		pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		// The pid must still be this VM's QEMU, not a number reused.
		if err == nil && pid > 0 && isQEMU(pid, d.vmDir(name)) {
			return pid
		}
	}
	// A QEMU still coming up has not written its pid file.
	if pids := qemus(filepath.Join(d.cfg.StateDir, "vms"))[d.vmDir(name)]; len(pids) > 0 {
		return pids[0]
	}
	return 0
}

// killAll kills every QEMU of the VM in dir and waits until they are
// gone.
func (d *Driver) killAll(dir string) ([]int, error) {
	var killed []int
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids := qemus(filepath.Join(d.cfg.StateDir, "vms"))[dir]
		if raw, err := os.ReadFile(filepath.Join(dir, "qemu.pid")); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(raw))); err == nil && pid > 0 && isQEMU(pid, dir) {
				pids = append(pids, pid)
			}
		}
		if len(pids) == 0 {
			return killed, nil
		}
		if time.Now().After(deadline) {
			return killed, fmt.Errorf("QEMU of %s (pids %v) does not end", filepath.Base(dir), pids)
		}
		for _, pid := range pids {
			killPID(pid)
			killed = append(killed, pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Start boots the VM from a new overlay (or its kept one); a running VM
// is left alone.
func (d *Driver) Start(ctx context.Context, name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	in, err := d.load(name)
	if err != nil {
		return err
	}
	if d.pid(name) != 0 {
		if in.Started.IsZero() {
			// Started by an agent killed before it recorded so.
			in.Started, in.Stopped = time.Now().UTC(), false
			return d.save(in)
		}
		return nil
	}
	var w edgeboxv1.Workload
	if err := protojson.Unmarshal(in.Workload, &w); err != nil {
		return fmt.Errorf("VM %s: %w", name, err)
	}
	dir, img := d.vmDir(name), d.imageDir(in.Image)
	var cfg vm.Config
	if raw, err := os.ReadFile(filepath.Join(img, vm.ConfigFile)); err != nil {
		return errdefs.NotFound("VM image of %s is gone from this box: %w", name, err)
	} else if err := json.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("VM image of %s: %w", name, err)
	}
	overlay := d.OverlayPath(name)
	disk := filepath.Join(img, vm.DiskFile)
	hasDisk := fileExists(disk)
	if hasDisk && (!w.GetKeepState() || !fileExists(overlay)) {
		// Made aside and renamed: a killed agent leaves no half-made
		// overlay that a VM keeping its state would boot from.
		tmp := overlay + ".new"
		os.Remove(tmp)
		out, err := exec.CommandContext(ctx, d.cfg.Img, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", disk, tmp).CombinedOutput()
		if err != nil {
			return fmt.Errorf("VM %s: overlay: %v: %s", name, err, strings.TrimSpace(string(out)))
		}
		if err := os.Rename(tmp, overlay); err != nil {
			return fmt.Errorf("VM %s: overlay: %w", name, err)
		}
	}
	if err := d.at("start/overlay"); err != nil {
		return err
	}
	mode, err := netMode(&w, d.haveBridge())
	if err != nil {
		return fmt.Errorf("VM %s: %w", name, err)
	}
	ps, err := ports(&w)
	if err != nil {
		return fmt.Errorf("VM %s: %w", name, err)
	}
	if restrictsEgress(&w) && mode == netUser {
		return errdefs.Invalid("VM %s: its release restricts egress, which only the bridge network enforces; this VM is on network %s", name, mode)
	}
	var files []*os.File // for QEMU, from fd 3
	var g guestNet
	switch mode {
	case netBridge:
		tap, gn, err := d.bridgeUp(ctx, &in, ps)
		if err != nil {
			return err
		}
		defer tap.Close()
		files, g = append(files, tap), gn
		// Before the guest runs: it must not send a packet unchecked.
		if err := d.applyEgress(ctx, in, &w); err != nil {
			return err
		}
	default:
		in.Net = &vmNet{Mode: mode, Ports: ps}
	}
	d.rotate(filepath.Join(dir, "serial.log"))
	for _, s := range []string{"qmp", "vnc", "serial"} {
		os.Remove(sock(dir, s))
	}
	os.Remove(filepath.Join(dir, "qemu.pid"))
	args := d.args(name, dir, img, overlay, hasDisk, &w, cfg)
	args = append(args, netArgs(mode, MAC(name), ps, 3, g)...)
	for _, dev := range in.Devices {
		// Matched by where it is plugged: QEMU takes the key again when it
		// re-appears at the same port.
		args = append(args, "-device", usbHostOpts(dev))
	}
	args = append(args, d.cfg.ExtraArgs...)
	// The start is recorded first: a QEMU an agent killed after starting
	// it then has its start time.
	was := in
	in.Started, in.Stopped = time.Now().UTC(), false
	if err := d.save(in); err != nil {
		return err
	}
	if err := d.at("start/recorded"); err != nil {
		return err
	}
	crashed := false
	if err := launch(ctx, d.cfg.Binary, args, dir, files, func() bool { return d.pid(name) != 0 }, func() error {
		err := d.at("start/launching")
		crashed = err != nil
		return err
	}); err != nil {
		if crashed {
			return err
		}
		d.save(was)
		return fmt.Errorf("starting VM %s: %w", name, err)
	}
	return d.at("start/launched")
}

// args is QEMU's command line for one VM.
func (d *Driver) args(name, dir, img, overlay string, hasDisk bool, w *edgeboxv1.Workload, cfg vm.Config) []string {
	mem := w.GetMemoryBytes()
	if mem <= 0 {
		mem = cfg.MemoryBytes
	}
	if mem <= 0 {
		mem = defaultMemory
	}
	cpus := int((w.GetCpuMillis() + 999) / 1000)
	if cpus <= 0 {
		cpus = cfg.CPUs
	}
	if cpus <= 0 {
		cpus = defaultCPUs
	}
	a := []string{
		"-name", name, "-nodefaults", "-no-user-config", "-display", "none",
		"-machine", "q35,accel=" + d.cfg.Accel,
		"-m", strconv.FormatInt(max(mem>>20, 16), 10) + "M",
		"-smp", strconv.Itoa(cpus),
		"-qmp", "unix:" + sock(dir, "qmp") + ",server=on,wait=off",
		"-vnc", "unix:" + sock(dir, "vnc"),
		// A display the VNC socket shows: the guest's own screen (a
		// Windows robot's desktop), for remote sessions.
		"-vga", "std",
		// The first serial port is the log; the second is for interactive
		// serial sessions (nothing is lost while nobody is connected).
		"-chardev", "file,id=serial0,path=" + filepath.Join(dir, "serial.log") + ",append=on",
		"-serial", "chardev:serial0",
		"-chardev", "socket,id=serial1,path=" + sock(dir, "serial") + ",server=on,wait=off",
		"-serial", "chardev:serial1",
		"-device", "qemu-xhci,id=xhci", // UKEYs are hot-plugged here
		"-pidfile", filepath.Join(dir, "qemu.pid"),
	}
	if hasDisk {
		a = append(a, "-drive", "file="+overlay+",if=virtio,format=qcow2")
	}
	if k := filepath.Join(img, vm.KernelFile); fileExists(k) {
		a = append(a, "-kernel", k)
		if i := filepath.Join(img, vm.InitrdFile); fileExists(i) {
			a = append(a, "-initrd", i)
		}
		if cfg.Cmdline != "" {
			a = append(a, "-append", cfg.Cmdline)
		}
	}
	if env := w.GetEnv(); len(env) > 0 {
		// The guest reads its environment from fw_cfg (Linux:
		// /sys/firmware/qemu_fw_cfg/by_name/opt/edgebox/env/raw).
		a = append(a, "-fw_cfg", "name=opt/edgebox/env,string="+strings.ReplaceAll(strings.Join(env, "\n"), ",", ",,"))
	}
	return a
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func (d *Driver) rotate(path string) {
	if st, err := os.Stat(path); err == nil && st.Size() > d.cfg.MaxLogBytes {
		os.Rename(path, path+".1")
	}
}

// qmpRun sends one QMP command to a VM.
func qmpRun(dir, cmd string) error {
	mon, err := qmp.NewSocketMonitor("unix", sock(dir, "qmp"), 2*time.Second)
	if err != nil {
		return err
	}
	if err := mon.Connect(); err != nil {
		return err
	}
	defer mon.Disconnect()
	_, err = mon.Run([]byte(`{"execute":"` + cmd + `"}`))
	return err
}

// QMP sends a raw QMP command to a running VM and returns its answer, for
// USB hot-plug and remote sessions.
func (d *Driver) QMP(name string, command []byte) ([]byte, error) {
	if d.pid(name) == 0 {
		return nil, errdefs.Conflict("VM %q is not running", name)
	}
	mon, err := qmp.NewSocketMonitor("unix", sock(d.vmDir(name), "qmp"), 2*time.Second)
	if err != nil {
		return nil, err
	}
	if err := mon.Connect(); err != nil {
		return nil, err
	}
	defer mon.Disconnect()
	return mon.Run(command)
}

// usbHostOpts is QEMU's usb-host device for a key, on the VM's xHCI
// controller, matched on host bus and port.
func usbHostOpts(dev runtime.Device) string {
	return fmt.Sprintf("usb-host,id=%s,bus=xhci.0,hostbus=%d,hostport=%s", usbID(dev), dev.Bus, hostPort(dev.Port))
}

func usbID(dev runtime.Device) string { return "ukey-" + strings.TrimPrefix(dev.KeyID, "k-") }

// hostPort is QEMU's hostport of a sysfs port path: "1-1.3" is "1.3".
func hostPort(port string) string {
	_, p, _ := strings.Cut(port, "-")
	return p
}

// Consoles returns the VNC and serial sockets of a running VM.
func (d *Driver) Consoles(name string) (vnc, serial string, err error) {
	if !edgeboxv1.ValidObjectName(name) || d.pid(name) == 0 {
		return "", "", errdefs.Conflict("VM %q is not running", name)
	}
	dir := d.vmDir(name)
	return sock(dir, "vnc"), sock(dir, "serial"), nil
}

var (
	_ runtime.USBAttacher = (*Driver)(nil)
	_ runtime.Consoler    = (*Driver)(nil)
	_ runtime.Puller      = (*Driver)(nil)
	_ runtime.ImageStore  = (*Driver)(nil)
)

// AttachUSB hot-plugs a key into a running VM.
func (d *Driver) AttachUSB(name string, dev runtime.Device) error {
	cmd, _ := json.Marshal(map[string]any{"execute": "device_add", "arguments": map[string]any{
		"driver": "usb-host", "id": usbID(dev), "bus": "xhci.0", "hostbus": dev.Bus, "hostport": hostPort(dev.Port)}})
	_, err := d.QMP(name, cmd)
	return err
}

// DetachUSB unplugs a key from a running VM.
func (d *Driver) DetachUSB(name string, dev runtime.Device) error {
	cmd, _ := json.Marshal(map[string]any{"execute": "device_del", "arguments": map[string]any{"id": usbID(dev)}})
	_, err := d.QMP(name, cmd)
	return err
}

// Stop asks the guest to power off (ACPI), and after timeout quits QEMU,
// then kills it.
func (d *Driver) Stop(ctx context.Context, name string, timeout time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	in, err := d.load(name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	dir := d.vmDir(name)
	pid := d.pid(name)
	if pid == 0 {
		return nil
	}
	gone := func(within time.Duration) bool {
		deadline := time.Now().Add(within)
		for {
			if d.pid(name) == 0 {
				return true
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return false
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// A paused guest (or one QEMU holds before it runs, -S) cannot
	// hear the power button.
	if paused(dir) {
		timeout = 0
	}
	if err := d.at("stop/signalled"); err != nil {
		return err
	}
	if timeout <= 0 || !powerdown(dir, timeout, gone) {
		qmpRun(dir, "quit")
		if !gone(5 * time.Second) {
			// Every QEMU of the VM: one still coming up too.
			if _, err := d.killAll(dir); err != nil {
				return fmt.Errorf("VM %s (pid %d) does not stop: %w", name, pid, err)
			}
		}
	}
	in.Stopped = true
	return d.save(in)
}

// repress is how often Stop presses the power button again: a guest still
// booting (Windows, for one) ignores a press.
const repress = 5 * time.Second

// powerdown presses the VM's ACPI power button, again every repress,
// until it is gone or timeout passed.
func powerdown(dir string, timeout time.Duration, gone func(time.Duration) bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if err := qmpRun(dir, "system_powerdown"); err != nil {
			return false
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		if gone(min(left, repress)) {
			return true
		}
	}
}

// Remove stops the VM and deletes it with its overlay and logs.
func (d *Driver) Remove(ctx context.Context, name string) error {
	if !edgeboxv1.ValidObjectName(name) {
		return errdefs.NotFound("no VM %q", name)
	}
	if err := d.Stop(ctx, name, 10*time.Second); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.at("remove/stopped"); err != nil {
		return err
	}
	if err := d.netDown(ctx, name); err != nil {
		return err
	}
	return d.discard(d.vmDir(name))
}

// netDown detaches a stopped VM from the bridge, if it is attached or
// might be (an agent killed between attaching it and recording so).
// Hold d.mu.
func (d *Driver) netDown(ctx context.Context, name string) error {
	in, err := d.load(name)
	if err != nil {
		return nil // nothing recorded: Sweep finds what is left
	}
	if in.Net != nil && in.Net.Mode != netBridge {
		return nil
	}
	var w edgeboxv1.Workload
	if in.Net == nil && (protojson.Unmarshal(in.Workload, &w) != nil || !d.haveBridge()) {
		return nil
	}
	if in.Net == nil {
		if mode, err := netMode(&w, true); err != nil || mode != netBridge {
			return nil
		}
	}
	var ps []port
	if in.Net != nil {
		ps = in.Net.Ports
	}
	return d.bridgeDown(ctx, name, ps)
}

// discard ends every QEMU of the VM in dir and deletes the directory,
// renamed aside first so that a crash part way leaves no VM half there.
// Hold d.mu.
func (d *Driver) discard(dir string) error {
	if _, err := d.killAll(dir); err != nil {
		return err
	}
	gone := dir
	if base := filepath.Base(dir); !strings.HasPrefix(base, ".") {
		gone = filepath.Join(filepath.Dir(dir), fmt.Sprintf(".rm-%s-%d", base, time.Now().UnixNano()))
		if err := os.Rename(dir, gone); errors.Is(err, os.ErrNotExist) {
			return nil
		} else if err != nil {
			return err
		}
		if err := d.at("remove/renamed"); err != nil {
			return err
		}
	}
	return os.RemoveAll(gone)
}

var (
	_ runtime.CrashPointer = (*Driver)(nil)
	_ runtime.Sweeper      = (*Driver)(nil)
)

// Sweep kills the QEMUs of VMs that do not exist, and deletes what killed
// agents left: VM directories without their instance.json and VMs being
// deleted.
func (d *Driver) Sweep(ctx context.Context) ([]runtime.Orphan, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	vms := filepath.Join(d.cfg.StateDir, "vms")
	ents, err := os.ReadDir(vms)
	if err != nil {
		return nil, err
	}
	var out []runtime.Orphan
	known := map[string]bool{}
	for _, e := range ents {
		name, dir := e.Name(), filepath.Join(vms, e.Name())
		if _, err := d.load(name); err == nil && edgeboxv1.ValidObjectName(name) {
			known[dir] = true
			continue
		}
		pids, _ := d.killAll(dir)
		if err := d.discard(dir); err != nil {
			return out, err
		}
		if vm := instanceOf(name); edgeboxv1.ValidObjectName(vm) {
			if _, err := d.load(vm); err != nil {
				if err := d.bridgeDown(ctx, vm, nil); err != nil {
					return out, err
				}
			}
		}
		out = append(out, runtime.Orphan{Name: instanceOf(name), PIDs: pids, What: fmt.Sprintf("what a killed agent left of a VM (%s)", name)})
	}
	for dir := range qemus(vms) {
		if known[dir] {
			continue
		}
		pids, err := d.killAll(dir)
		if err != nil {
			return out, err
		}
		out = append(out, runtime.Orphan{Name: instanceOf(filepath.Base(dir)), PIDs: pids, What: "a QEMU whose VM does not exist"})
	}
	gone, err := d.sweepNetwork(ctx)
	for _, name := range gone {
		out = append(out, runtime.Orphan{Name: name, What: "the bridge attachment of a VM that does not exist"})
	}
	return out, err
}

// instanceOf is the VM a directory under vms/ was made for.
func instanceOf(dir string) string {
	if rest, ok := strings.CutPrefix(dir, ".rm-"); ok {
		if i := strings.LastIndexByte(rest, '-'); i > 0 {
			return rest[:i]
		}
		return rest
	}
	return dir
}

// paused says whether the VM's guest is not running: paused, or held
// before it starts (-S).
func paused(dir string) bool {
	mon, err := qmp.NewSocketMonitor("unix", sock(dir, "qmp"), 2*time.Second)
	if err != nil {
		return false
	}
	if err := mon.Connect(); err != nil {
		return false
	}
	defer mon.Disconnect()
	raw, err := mon.Run([]byte(`{"execute":"query-status"}`))
	if err != nil {
		return false
	}
	var st struct {
		Return struct {
			Running bool   `json:"running"`
			Status  string `json:"status"`
		} `json:"return"`
	}
	return json.Unmarshal(raw, &st) == nil && st.Return.Status != "" && !st.Return.Running
}

// List returns every VM the driver holds.
func (d *Driver) List(ctx context.Context) ([]runtime.Instance, error) {
	ents, err := os.ReadDir(filepath.Join(d.cfg.StateDir, "vms"))
	if err != nil {
		return nil, err
	}
	var out []runtime.Instance
	for _, e := range ents {
		if in, err := d.Inspect(ctx, e.Name()); err == nil {
			out = append(out, in)
		}
	}
	return out, nil
}

// Inspect returns one VM.
func (d *Driver) Inspect(_ context.Context, name string) (runtime.Instance, error) {
	if !edgeboxv1.ValidObjectName(name) {
		return runtime.Instance{}, errdefs.NotFound("no VM %q", name)
	}
	in, err := d.load(name)
	if err != nil {
		return runtime.Instance{}, err
	}
	out := runtime.Instance{Name: name, Hash: in.Hash, State: runtime.StateCreated, StartedAt: in.Started}
	if n := in.Net; n != nil {
		if p, err := netip.ParsePrefix(n.Addr); err == nil {
			out.Address = p.Addr().String()
		}
		for _, p := range n.Ports {
			out.Ports = append(out.Ports, p.String())
		}
	}
	switch {
	case d.pid(name) != 0:
		out.State = runtime.StateRunning
	case !in.Started.IsZero():
		// QEMU ends with the guest's power-off; a VM that went away on
		// its own counts as a failure.
		out.State = runtime.StateExited
		if !in.Stopped {
			out.ExitCode = 1
		}
	}
	return out, nil
}

// Logs writes the end of the VM's serial console.
func (d *Driver) Logs(_ context.Context, name string, tail int, w io.Writer) error {
	if _, err := d.load(name); err != nil {
		return err
	}
	return runtime.TailFile(filepath.Join(d.vmDir(name), "serial.log"), tail, w)
}

// Images lists the fetched VM images, by manifest digest.
func (d *Driver) Images(context.Context) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(d.cfg.StateDir, "images"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		out = append(out, "sha256:"+e.Name())
	}
	return out, nil
}

// RemoveImage deletes a fetched VM image that no VM runs on.
func (d *Driver) RemoveImage(_ context.Context, ref string) error {
	dir, err := d.imageOf(ref)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ents, _ := os.ReadDir(filepath.Join(d.cfg.StateDir, "vms"))
	for _, e := range ents {
		if in, err := d.load(e.Name()); err == nil && in.Image == filepath.Base(dir) {
			return errdefs.Conflict("VM %s runs on image %s", in.Name, ref)
		}
	}
	return os.RemoveAll(dir)
}
