// Package runtime is the seam between the agent and what runs workloads:
// containerd, QEMU, native processes. The reconciler speaks only Driver.
package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"time"

	"google.golang.org/protobuf/proto"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Spec is one workload as a driver runs it.
type Spec struct {
	// Name is the workload's name, unique on the box.
	Name     string
	Workload *edgeboxv1.Workload
	// Hash identifies the workload's spec: a different hash means the
	// instance must be replaced.
	Hash string
	// Devices are the USB keys leased to the workload.
	Devices []Device
}

// NewSpec returns the Spec of workload name.
func NewSpec(name string, w *edgeboxv1.Workload) Spec { return NewSpecWith(name, w, nil) }

// NewSpecWith returns the Spec of workload name with the USB keys leased
// to it; a key that moves (a new device number) changes the hash, and the
// instance is made again with the key where it now is.
func NewSpecWith(name string, w *edgeboxv1.Workload, devs []Device) Spec {
	raw, _ := proto.MarshalOptions{Deterministic: true}.Marshal(w)
	h := sha256.New()
	h.Write(raw)
	for _, d := range devs {
		h.Write([]byte("\x00" + d.KeyID + "\x00" + d.HostPath + "\x00" + d.Port))
	}
	return Spec{Name: name, Workload: w, Hash: hex.EncodeToString(h.Sum(nil)[:8]), Devices: devs}
}

// AgentAPIEnv is the environment variable that tells a workload where the
// agent's local API is (update locks): "unix:///run/edgebox/agent.sock"
// in a container, the socket's path on the box for a native program.
const AgentAPIEnv = "EDGEBOX_AGENT_API"

// AgentAPIInContainer is where containers find the agent's local API
// directory.
const AgentAPIInContainer = "/run/edgebox"

// Device is a USB key leased to a workload, where it is on the box now.
type Device struct {
	KeyID string
	// HostPath is its device node on the box (/dev/bus/usb/001/005);
	// Path is where a container sees it.
	HostPath, Path string
	// Bus and Port find it for a VM (QEMU's usb-host hostbus/hostport).
	Bus  int
	Port string
}

// State is where an instance is in its life.
type State string

const (
	StateCreated State = "created"
	StateRunning State = "running"
	StateExited  State = "exited"
)

// Instance is one workload instance a driver holds.
type Instance struct {
	Name      string
	Hash      string
	State     State
	ExitCode  int
	StartedAt time.Time
	// Address is the instance's IPv4 address on the box's workload
	// network; empty when it has none (the box's own network, or none).
	Address string
	// Ports are its ports published on the box, each
	// "[host_ip:]host_port:port/protocol" (as ObjectStatus.ports).
	Ports []string
}

// Driver runs workload instances of one runtime. Every method is
// idempotent where it can be: creating what exists is errdefs.ErrConflict,
// stopping what is stopped and removing what is gone succeed.
type Driver interface {
	// Runtime is the Workload.runtime value this driver serves.
	Runtime() string
	Create(ctx context.Context, s Spec) error
	Start(ctx context.Context, name string) error
	// Stop asks the instance to end and kills it after timeout.
	Stop(ctx context.Context, name string, timeout time.Duration) error
	Remove(ctx context.Context, name string) error
	// List returns the instances this driver made for edgebox.
	List(ctx context.Context) ([]Instance, error)
	// Inspect returns one instance, or errdefs.ErrNotFound.
	Inspect(ctx context.Context, name string) (Instance, error)
	// Logs writes the instance's last tail lines of output (0: all that
	// is kept) to w.
	Logs(ctx context.Context, name string, tail int, w io.Writer) error
}

// Execer is a driver that runs commands inside a running instance.
type Execer interface {
	// Exec runs argv in the instance and returns its exit code.
	Exec(ctx context.Context, name string, argv []string, stdout, stderr io.Writer) (int, error)
}

// EgressCounter is a driver that enforces its workloads' egress policies
// and counts what they refused.
type EgressCounter interface {
	// EgressRefused is how many connections (for TCP; packets otherwise)
	// the egress policy of instance name refused; 0 without a policy.
	EgressRefused(ctx context.Context, name string) (uint64, error)
}

// Progress is how far a pull has come, in bytes of configs and layers.
// Total grows as manifests are read.
type Progress struct {
	Done, Total int64
}

// Puller is a driver that fetches its images onto the box itself.
type Puller interface {
	// HasImage says whether ref is on the box, with all its content.
	HasImage(ctx context.Context, ref string) (bool, error)
	// Pull fetches ref with client, verifying every digest, and reports
	// progress as bytes arrive. A pull interrupted part way resumes where
	// it stopped the next time.
	Pull(ctx context.Context, ref string, client *http.Client, progress func(Progress)) error
}

// ImageStore is a driver whose images can be listed and removed, so the
// agent can keep its image cache small.
type ImageStore interface {
	// Images lists the images the driver holds.
	Images(ctx context.Context) ([]string, error)
	// RemoveImage deletes an image; what instances still use stays.
	RemoveImage(ctx context.Context, ref string) error
}

// USBAttacher is a driver that plugs keys into a running instance and out
// again (VMs); others get their keys when the instance is made.
type USBAttacher interface {
	AttachUSB(name string, dev Device) error
	DetachUSB(name string, dev Device) error
}

// RedirAttacher is a driver that plugs a USB device served over usbredir into a running instance, and out.
type RedirAttacher interface {
	// AttachRedir adds a usb-redir device with id to the running instance name, on a chardev socket QEMU
	// listens on, and returns that socket's path for the usbredir host side to dial. Attaching an id that is
	// there already returns its socket (an agent restarted finds what it had plugged).
	AttachRedir(name, id string) (socket string, err error)
	// DetachRedir removes it; one not there is not an error.
	DetachRedir(name, id string) error
}

// Consoler is a driver whose instances have a screen and a serial console
// on unix sockets, for remote sessions.
type Consoler interface {
	// Consoles returns the sockets of a running instance; "" where it has
	// none.
	Consoles(name string) (vnc, serial string, err error)
}

// Sweeper is a driver that can find what runs on the box in its name but
// belongs to no instance it holds — left by an agent killed part way
// through an operation, or by an older agent — and stop it. The agent
// sweeps once at start, before it creates or starts anything.
type Sweeper interface {
	// Sweep stops every orphan and removes what is left of half-made or
	// half-removed instances, and returns what it stopped.
	Sweep(ctx context.Context) ([]Orphan, error)
}

// Orphan is something a sweep stopped.
type Orphan struct {
	// Name is the instance it was made for, when that can be told.
	Name string
	// PIDs are the processes stopped.
	PIDs []int
	// What says what it was, for the operator.
	What string
}

// CrashHook is a test's hook into a driver's operations: a driver calls
// it at each of its declared crash points, and an error from it ends the
// operation there at once, as if the agent had been killed at that point
// (nothing is cleaned up). Production leaves it nil.
type CrashHook func(point string) error

// At calls h at point, which must be among declared. A nil hook does
// nothing.
func (h CrashHook) At(declared []string, point string) error {
	if h == nil {
		return nil
	}
	for _, p := range declared {
		if p == point {
			return h(point)
		}
	}
	return fmt.Errorf("crash point %q is not declared", point)
}

// CrashPointer is a driver that declares its crash points: the steps of
// create, start, stop and remove between which a killed agent leaves
// something behind. Points are named "<operation>/<step>", operation one
// of create, start, stop, remove.
type CrashPointer interface {
	CrashPoints() []string
}
