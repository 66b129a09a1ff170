package usbhub

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
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
// one would.
type Sim struct {
	mu      sync.Mutex // guards hubs, devs and nextDev
	hubs    map[string]bool
	devs    map[string]Device
	nextDev int
	dead    map[string]bool // ports whose key a power cycle does not cure
}

// NewSim builds a simulation from cfg.
func NewSim(cfg SimConfig) (*Sim, error) {
	s := &Sim{hubs: map[string]bool{}, devs: map[string]Device{}, nextDev: 2, dead: map[string]bool{}}
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
	s.nextDev++
	s.devs[d.Port] = d
	return nil
}

// Unplug takes the device out of port.
func (s *Sim) Unplug(port string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.devs[port]; !ok {
		return ErrNoDevice
	}
	delete(s.devs, port)
	return nil
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
	d.Stuck = s.dead[port]
	d.Dev = s.nextDev
	s.nextDev++
	s.devs[port] = d
	return nil
}
