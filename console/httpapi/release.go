package httpapi

import (
	"maps"
	"slices"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console/apps"
)

// A release crosses the API in api.ReleaseSpec and is stored as
// apps.Spec; the two convert field by field here and nowhere else, so
// either side can grow or rename a field without changing the other.

// specFrom is the release an operator asked for, as apps keeps it.
func specFrom(s api.ReleaseSpec) apps.Spec {
	return apps.Spec{
		Version: s.Version, Runtime: s.Runtime, Image: s.Image,
		Env: slices.Clone(s.Env), Args: slices.Clone(s.Args),
		CPUMillis: s.CPUMillis, MemoryBytes: s.MemoryBytes, Restart: s.Restart, KeepState: s.KeepState,
		Probes: convert(s.Probes, func(p api.Probe) apps.Probe {
			return apps.Probe{Exec: slices.Clone(p.Exec), HTTP: p.HTTP, TCP: p.TCP, PeriodSeconds: p.PeriodSeconds,
				TimeoutSeconds: p.TimeoutSeconds, FailureThreshold: p.FailureThreshold, InitialDelay: p.InitialDelay}
		}),
		Ports: convert(s.Ports, func(p api.Port) apps.Port {
			return apps.Port{Name: p.Name, Port: p.Port, Protocol: p.Protocol, HostPort: p.HostPort, HostIP: p.HostIP}
		}),
		Keys: convert(s.Keys, func(k api.KeyNeed) apps.KeyNeed {
			return apps.KeyNeed{Labels: maps.Clone(k.Labels)}
		}),
		Volumes: convert(s.Volumes, func(v api.Volume) apps.Volume {
			return apps.Volume{Name: v.Name, Path: v.Path, ReadOnly: v.ReadOnly}
		}),
		Network: s.Network, Egress: slices.Clone(s.Egress), ProxyEnv: s.ProxyEnv, KeysHoldUpdates: s.KeysHoldUpdates,
	}
}

// specView is a stored release as the API shows it.
func specView(s apps.Spec) api.ReleaseSpec {
	return api.ReleaseSpec{
		Version: s.Version, Runtime: s.Runtime, Image: s.Image,
		Env: slices.Clone(s.Env), Args: slices.Clone(s.Args),
		CPUMillis: s.CPUMillis, MemoryBytes: s.MemoryBytes, Restart: s.Restart, KeepState: s.KeepState,
		Probes: convert(s.Probes, func(p apps.Probe) api.Probe {
			return api.Probe{Exec: slices.Clone(p.Exec), HTTP: p.HTTP, TCP: p.TCP, PeriodSeconds: p.PeriodSeconds,
				TimeoutSeconds: p.TimeoutSeconds, FailureThreshold: p.FailureThreshold, InitialDelay: p.InitialDelay}
		}),
		Ports: convert(s.Ports, func(p apps.Port) api.Port {
			return api.Port{Name: p.Name, Port: p.Port, Protocol: p.Protocol, HostPort: p.HostPort, HostIP: p.HostIP}
		}),
		Keys: convert(s.Keys, func(k apps.KeyNeed) api.KeyNeed {
			return api.KeyNeed{Labels: maps.Clone(k.Labels)}
		}),
		Volumes: convert(s.Volumes, func(v apps.Volume) api.Volume {
			return api.Volume{Name: v.Name, Path: v.Path, ReadOnly: v.ReadOnly}
		}),
		Network: s.Network, Egress: slices.Clone(s.Egress), ProxyEnv: s.ProxyEnv, KeysHoldUpdates: s.KeysHoldUpdates,
	}
}

// convert maps each element of in with f; nil stays nil.
func convert[From, To any](in []From, f func(From) To) []To {
	if in == nil {
		return nil
	}
	out := make([]To, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}
