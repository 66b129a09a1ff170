package apps

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path"
	"strings"

	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// The types below are how a release is stored, not how the API shows it:
// httpapi converts between them and Spec. Their JSON names are
// a storage format that releases already written by a console use; keep
// them, or add a migration (TestStoredReleaseFormat holds a release stored
// by the console of 2026-11 and checks it still loads the same).

// Spec is what a release runs. For the containerd and qemu runtimes
// Image is a reference in the console's registry (by digest once
// stored); for process it is the program's path on the box.
type Spec struct {
	Version     string   `json:"version"`
	Runtime     string   `json:"runtime"`
	Image       string   `json:"image"`
	Env         []string `json:"env,omitempty"`
	Args        []string `json:"args,omitempty"`
	CPUMillis   int64    `json:"cpu_millis,omitempty"`
	MemoryBytes int64    `json:"memory_bytes,omitempty"`
	Restart     string   `json:"restart,omitempty"`
	// KeepState, for VMs: the disk overlay survives restarts.
	KeepState bool      `json:"keep_state,omitempty"`
	Probes    []Probe   `json:"probes,omitempty"`
	Ports     []Port    `json:"ports,omitempty"`
	Keys      []KeyNeed `json:"keys,omitempty"`
	Volumes   []Volume  `json:"volumes,omitempty"`
	// Network is how a container or VM reaches the network: "" or
	// "bridge" (edgebox's bridge with NAT, the default), "host" (the
	// box's own; containerd only), "user" (QEMU's user-mode network; qemu
	// only) or "none" (loopback only). Processes use the box's network.
	Network string `json:"network,omitempty"`
	// Egress limits where the workload may connect: DNS names, IPv4
	// addresses and IPv4 CIDR prefixes. Empty, or the single word "any",
	// allows everything.
	Egress []string `json:"egress,omitempty"`
	// ProxyEnv passes the box's proxy to the workload as HTTPS_PROXY and
	// HTTP_PROXY.
	ProxyEnv bool `json:"proxy_env,omitempty"`
	// KeysHoldUpdates: while a process on the box has one of the app's
	// leased UKEYs open, the box is not updated; a key is not cut mid-use.
	KeysHoldUpdates bool `json:"keys_hold_updates,omitempty"`
}

// Probe is one health check: exactly one of Exec, HTTP and TCP.
type Probe struct {
	Exec             []string `json:"exec,omitempty"`
	HTTP             string   `json:"http,omitempty"`
	TCP              string   `json:"tcp,omitempty"`
	PeriodSeconds    uint32   `json:"period_seconds,omitempty"`
	TimeoutSeconds   uint32   `json:"timeout_seconds,omitempty"`
	FailureThreshold uint32   `json:"failure_threshold,omitempty"`
	InitialDelay     uint32   `json:"initial_delay_seconds,omitempty"`
}

// Port is a port an app serves; with HostPort it is published on the
// box: HostPort on the box (on HostIP only, if set) reaches Port in the
// workload.
type Port struct {
	Name     string `json:"name,omitempty"`
	Port     uint16 `json:"port"`
	Protocol string `json:"protocol,omitempty"` // tcp (default) or udp
	// HostPort is 0 (not published) or 1 to 65535; an int so that a
	// number out of range reaches validation and is named there.
	HostPort int    `json:"host_port,omitempty"`
	HostIP   string `json:"host_ip,omitempty"`
}

// KeyNeed is one UKEY an app needs: any key whose labels include these.
type KeyNeed struct {
	Labels map[string]string `json:"labels"`
}

// Volume is a box-local directory the app keeps across releases, seen at
// Path.
type Volume struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

func validateSpec(s Spec) error {
	var errs []error
	if !versionRE.MatchString(s.Version) {
		errs = append(errs, fmt.Errorf("version %q: use 1-64 letters, digits, '.', '+', '_' or '-'", s.Version))
	}
	switch s.Runtime {
	case edgeboxv1.RuntimeContainerd, edgeboxv1.RuntimeQEMU, edgeboxv1.RuntimeProcess:
	default:
		errs = append(errs, fmt.Errorf("runtime %q: use containerd, qemu or process", s.Runtime))
	}
	if s.Image == "" {
		errs = append(errs, errors.New("image is required (for process: the program's path on the box)"))
	}
	switch s.Restart {
	case "", edgeboxv1.RestartAlways, edgeboxv1.RestartOnFailure, edgeboxv1.RestartNever:
	default:
		errs = append(errs, fmt.Errorf("restart %q: use always, on-failure or never", s.Restart))
	}
	if s.CPUMillis < 0 || s.MemoryBytes < 0 {
		errs = append(errs, errors.New("cpu_millis and memory_bytes cannot be negative"))
	}
	if len(s.Env) > 256 || len(s.Args) > 256 {
		errs = append(errs, errors.New("at most 256 env entries and 256 args"))
	}
	for _, e := range s.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" || len(e) > 4096 {
			errs = append(errs, fmt.Errorf("env %q: use NAME=value, at most 4 KiB", clipText(e, 40)))
			break
		}
	}
	for _, arg := range s.Args {
		if len(arg) > 4096 {
			errs = append(errs, errors.New("an arg is longer than 4 KiB"))
			break
		}
	}
	if len(s.Ports) > 64 || len(s.Keys) > 16 {
		errs = append(errs, errors.New("at most 64 ports and 16 keys"))
	}
	for _, p := range s.Ports {
		if p.Port == 0 || (p.Protocol != "" && p.Protocol != "tcp" && p.Protocol != "udp") || len(p.Name) > 63 {
			errs = append(errs, fmt.Errorf("port %d/%s: give a port from 1 to 65535, protocol tcp or udp", p.Port, clipText(p.Protocol, 10)))
			break
		}
	}
	errs = append(errs, validateNetwork(s)...)
	for i, k := range s.Keys {
		if len(k.Labels) == 0 {
			errs = append(errs, fmt.Errorf("key %d: say which key by its labels (bank=ICBC)", i+1))
		} else if err := fleet.ValidateLabels(k.Labels); err != nil {
			errs = append(errs, fmt.Errorf("key %d: %v", i+1, err))
		}
	}
	for _, v := range s.Volumes {
		if !edgeboxv1.ValidObjectName(v.Name) || !path.IsAbs(v.Path) || path.Clean(v.Path) == "/" || len(v.Path) > 1024 {
			errs = append(errs, fmt.Errorf("volume %q at %q: give a name (lower-case letters, digits, '-') and an absolute path other than /",
				clipText(v.Name, 40), clipText(v.Path, 60)))
			break
		}
	}
	if len(s.Probes) > 8 {
		errs = append(errs, errors.New("at most 8 probes"))
	}
	for i, p := range s.Probes {
		if err := validProbe(p); err != nil {
			errs = append(errs, fmt.Errorf("probe %d: %v", i+1, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return errdefs.Wrap(errdefs.ErrInvalid, err)
	}
	return nil
}

func validProbe(p Probe) error {
	n := 0
	if len(p.Exec) > 0 {
		n++
		if len(p.Exec) > 64 {
			return errors.New("exec: at most 64 arguments")
		}
	}
	if p.HTTP != "" {
		n++
		u, err := url.Parse(p.HTTP)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(p.HTTP) > 2048 {
			return fmt.Errorf("http %q: give an http:// or https:// URL", clipText(p.HTTP, 60))
		}
	}
	if p.TCP != "" {
		n++
		if _, _, err := net.SplitHostPort(p.TCP); err != nil {
			return fmt.Errorf("tcp %q: give host:port", clipText(p.TCP, 60))
		}
	}
	if n != 1 {
		return errors.New("give exactly one of exec, http and tcp")
	}
	if p.PeriodSeconds > 3600 || p.TimeoutSeconds > 600 || p.FailureThreshold > 100 || p.InitialDelay > 3600 {
		return errors.New("period up to 3600 s, timeout up to 600 s, failure threshold up to 100, initial delay up to 3600 s")
	}
	return nil
}

func clipText(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// Workload is the desired object a release becomes on a box.
func (r Release) Workload() *edgeboxv1.Workload {
	return &edgeboxv1.Workload{App: r.App, Release: r.Version, Runtime: r.Runtime, Image: r.Image,
		Env: r.Env, Args: r.Args, CpuMillis: r.CPUMillis, MemoryBytes: r.MemoryBytes, Restart: r.Restart, KeepState: r.KeepState, Probes: probes(r.Probes), Volumes: volumes(r.Volumes),
		Network: r.Network, Ports: portMappings(r.Ports), Egress: egressRules(r.Egress), ProxyEnv: r.ProxyEnv,
		KeysHoldUpdates: r.KeysHoldUpdates}
}

func volumes(vs []Volume) []*edgeboxv1.Volume {
	var out []*edgeboxv1.Volume
	for _, v := range vs {
		out = append(out, &edgeboxv1.Volume{Name: v.Name, Path: v.Path, ReadOnly: v.ReadOnly})
	}
	return out
}

func probes(ps []Probe) []*edgeboxv1.Probe {
	var out []*edgeboxv1.Probe
	for _, p := range ps {
		out = append(out, &edgeboxv1.Probe{Exec: p.Exec, Http: p.HTTP, Tcp: p.TCP, PeriodSeconds: p.PeriodSeconds,
			TimeoutSeconds: p.TimeoutSeconds, FailureThreshold: p.FailureThreshold, InitialDelaySeconds: p.InitialDelay})
	}
	return out
}
