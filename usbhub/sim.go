package usbhub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/edgebox/edgebox/usbhub/ccid"
	"github.com/edgebox/edgebox/usbhub/usbdev"
)

// SimConfig describes a simulated box: its hubs and the keys in them. It
// is the file the agent reads with --usb-sim.
type SimConfig struct {
	Hubs []SimHub `json:"hubs"`
	Keys []Device `json:"keys"`
}

// SimHub is a hub at a port path; Switchable hubs can power-cycle their
// ports.
type SimHub struct {
	Port       string `json:"port"`
	Switchable bool   `json:"switchable"`
}

// Sim is a simulated set of hubs and keys behind the Hub interface. Tests
// and demos plug, unplug and jam keys; power-cycling a switchable port
// un-jams its key, which comes back with a new device number as a real
// one would. After MakeNodes, each key has a device node, made on plug
// and removed on unplug, so a lease works end to end (see MakeNodes).
type Sim struct {
	mu      sync.Mutex // guards every field below
	hubs    map[string]bool
	devs    map[string]Device
	nextDev int
	dead    map[string]bool // ports whose key a power cycle does not cure
	// nodeDir holds the keys' device nodes; "" before MakeNodes and after
	// Close.
	nodeDir string
	// mknod makes a character device node; tests replace it to act as a
	// system where that is not allowed.
	mknod func(path string) error
	// opened are the simulated CCID keys Open gave out, by port; one
	// unplugged is forgotten.
	opened map[string]*simOpened
}

// simOpened is a key Open gave out, and the device it was opened as.
type simOpened struct {
	dev Device
	key *ccid.Key
}

var (
	_ NodeMaker = (*Sim)(nil)
	_ Opener    = (*Sim)(nil)
)

// NewSim builds a simulation from cfg.
func NewSim(cfg SimConfig) (*Sim, error) {
	s := &Sim{hubs: map[string]bool{}, devs: map[string]Device{}, nextDev: 2, dead: map[string]bool{}, mknod: mknodNull, opened: map[string]*simOpened{}}
	for _, h := range cfg.Hubs {
		if !devName.MatchString(h.Port) {
			return nil, fmt.Errorf("usbhub: simulated hub port %q: use a path like 1-2", h.Port)
		}
		s.hubs[h.Port] = h.Switchable
	}
	for _, d := range cfg.Keys {
		if err := s.Plug(d); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// LoadSim reads a SimConfig file.
func LoadSim(path string) (*Sim, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cfg SimConfig
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("usbhub: %s: %w", path, err)
	}
	return NewSim(cfg)
}

func parentOf(port string) string {
	i := strings.LastIndexAny(port, ".")
	if i < 0 {
		return ""
	}
	return port[:i]
}

// Plug puts a device in its port.
func (s *Sim) Plug(d Device) error {
	if !devName.MatchString(d.Port) {
		return fmt.Errorf("usbhub: port %q: use a path like 1-2.3", d.Port)
	}
	if len(d.VendorID) != 4 || len(d.ProductID) != 4 {
		return fmt.Errorf("usbhub: key at %s: vendor and product IDs are 4 hex digits", d.Port)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.devs[d.Port]; ok {
		return fmt.Errorf("usbhub: port %s is taken", d.Port)
	}
	if d.Class == "" {
		d.Class = ClassSmartCard
	}
	d.Serial, d.Manufacturer, d.Product = cleanDescriptor(d.Serial), cleanDescriptor(d.Manufacturer), cleanDescriptor(d.Product)
	fmt.Sscanf(d.Port, "%d-", &d.Bus)
	d.Dev = s.nextDev
	d.Simulated, d.Node = true, ""
	if err := s.makeNode(d); err != nil {
		return err
	}
	s.nextDev++
	s.devs[d.Port] = d
	return nil
}

// Unplug takes the device out of port, and its node away.
func (s *Sim) Unplug(port string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.opened, port)
	d, ok := s.devs[port]
	if !ok {
		return ErrNoDevice
	}
	delete(s.devs, port)
	return s.removeNode(d)
}

// SetStuck makes the key at port stop answering, or answer again.
func (s *Sim) SetStuck(port string, stuck bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.devs[port]
	if !ok {
		return ErrNoDevice
	}
	d.Stuck = stuck
	s.devs[port] = d
	return nil
}

// SetDead makes the key at port stuck for good: power cycles re-enumerate
// it, and it still does not answer.
func (s *Sim) SetDead(port string, dead bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.devs[port]
	if !ok {
		return ErrNoDevice
	}
	s.dead[port] = dead
	d.Stuck = dead || d.Stuck
	s.devs[port] = d
	return nil
}

// Devices lists the simulated devices by port.
func (s *Sim) Devices(context.Context) ([]Device, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Device, 0, len(s.devs))
	for _, d := range s.devs {
		d.Switchable = s.hubs[parentOf(d.Port)]
		d.Node = s.nodePath(d)
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Port < out[j].Port })
	return out, nil
}

// PowerCycle re-enumerates the key at port, un-jamming it, if its hub can
// switch the port.
func (s *Sim) PowerCycle(_ context.Context, port string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.devs[port]
	if !ok {
		return ErrNoDevice
	}
	if !s.hubs[parentOf(port)] {
		return ErrNotSwitchable
	}
	if err := s.removeNode(d); err != nil {
		return err
	}
	d.Stuck = s.dead[port]
	d.Dev = s.nextDev
	s.nextDev++
	s.devs[port] = d
	return s.makeNode(d)
}

// MakeNodes gives every simulated key a device node under dir, laid out
// as /dev/bus/usb is (dir/001/002 for bus 1, device 2), now and as keys
// are plugged and power-cycled; unplugging a key removes its node, and
// Devices names each in Device.Node. So a key leased to a workload is
// one its driver can give it: the process driver hands the node to the
// workload's user, the containerd driver puts it in the container with a
// device rule for it.
//
// A node is a character device that behaves as /dev/null does (1:3:
// opens, reads nothing, takes any write) where the system lets the agent
// make one (root on Linux); elsewhere (Windows, or without the right to
// mknod) it is an empty regular file, which the process driver can still
// hand over but a container cannot be given. A simulated key is never a
// USB device, so it is never a VM's (Device.Simulated).
//
// Nodes already in dir for keys plugged now are kept as they are, with
// their owner: a workload that holds its key keeps it when the agent
// restarts; anything else in dir is removed. MakeNodes with the same dir
// again does nothing; with another it is an error. Close removes the
// nodes.
func (s *Sim) MakeNodes(dir string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.nodeDir == dir:
		return nil
	case s.nodeDir != "":
		return fmt.Errorf("usbhub: the simulated keys' nodes are in %s already, not %s", s.nodeDir, dir)
	case dir == "":
		return errors.New("usbhub: no directory for the simulated keys' nodes")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("usbhub: nodes of the simulated keys: %w", err)
	}
	s.nodeDir = dir
	keep := map[string]bool{}
	for _, d := range s.devs {
		keep[s.nodePath(d)] = true
	}
	// What an earlier run left: a node of a key plugged now stays (if it
	// is a node or a file, never a link), the rest goes.
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || path == dir || e.IsDir() {
			return err
		}
		if keep[path] && (e.Type()&fs.ModeCharDevice != 0 || e.Type().IsRegular()) {
			return nil
		}
		return os.Remove(path)
	})
	if err == nil {
		for _, d := range s.devs {
			if err = s.makeNode(d); err != nil {
				break
			}
		}
	}
	if err != nil {
		s.nodeDir = ""
		return fmt.Errorf("usbhub: nodes of the simulated keys: %w", err)
	}
	return nil
}

// Close removes the keys' nodes and their directory; the keys stay
// plugged, without nodes. Calling it again does nothing.
func (s *Sim) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodeDir == "" {
		return nil
	}
	err := os.RemoveAll(s.nodeDir)
	s.nodeDir = ""
	return err
}

// nodePath is where d's node is; "" without a node directory.
func (s *Sim) nodePath(d Device) string {
	if s.nodeDir == "" {
		return ""
	}
	return filepath.Join(s.nodeDir, fmt.Sprintf("%03d", d.Bus), fmt.Sprintf("%03d", d.Dev))
}

// makeNode makes d's node, unless one is there.
func (s *Sim) makeNode(d Device) error {
	path := s.nodePath(d)
	if path == "" {
		return nil
	}
	if _, err := os.Lstat(path); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := s.mknod(path); err == nil {
		return nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o660)
	if err != nil {
		return fmt.Errorf("usbhub: node of the simulated key at %s: %w", d.Port, err)
	}
	defer f.Close()
	return f.Chmod(0o660) // whatever the umask took
}

func (s *Sim) removeNode(d Device) error {
	if path := s.nodePath(d); path != "" {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("usbhub: node of the simulated key at %s: %w", d.Port, err)
		}
	}
	return nil
}

// Open returns the key at port as a simulated CCID smart-card key with
// its vendor, product and serial (its card signs with ccid.TestKey). The
// same key plugged in again at the same port is the same device until it
// is unplugged.
func (s *Sim) Open(_ context.Context, port string) (usbdev.Device, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.devs[port]
	switch {
	case !ok:
		return nil, fmt.Errorf("usbhub: no key at %s", port)
	case d.Stuck:
		return nil, fmt.Errorf("usbhub: the key at %s does not answer", port)
	}
	if o, ok := s.opened[port]; ok && o.dev.Serial == d.Serial && o.dev.VendorID == d.VendorID && o.dev.ProductID == d.ProductID {
		return o.key, nil
	}
	vendor, err1 := strconv.ParseUint(d.VendorID, 16, 16)
	product, err2 := strconv.ParseUint(d.ProductID, 16, 16)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("usbhub: the key at %s: %w", port, err)
	}
	k := ccid.New(uint16(vendor), uint16(product), d.Serial)
	s.opened[port] = &simOpened{dev: d, key: k}
	return k, nil
}
