package main

import (
	"os"

	"github.com/edgebox/edgebox/agent"
)

// runtimeFlags say where the box's runtimes are.
type runtimeFlags struct {
	containerd string // containerd's socket
	runcRoot   string // runc's state directory; empty is runc's default
	// proxy is the box's proxy, passed to workloads that ask for it
	// (proxy_env); empty: none.
	proxy string
	// firstUID is the first of the 10,000 user IDs native workloads run
	// as; 0 is the process driver's default. Two agents on one host
	// (tests, demos) need ranges of their own: each ends processes of
	// its range that it does not know.
	firstUID int
	// vmAccel is QEMU's accelerator list for VMs; empty is the qemu
	// driver's choice (kvm where /dev/kvm opens, else tcg).
	vmAccel string
}

// workloadProxy is the box's proxy as workloads get it: --proxy, else the
// proxy in agent.json, else the agent's own HTTPS_PROXY. A proxy that is
// not an http:// or https:// URL is not passed on.
func workloadProxy(flag, dataDir string) string {
	p := flag
	if p == "" {
		if s, err := agent.ReadSettings(dataDir); err == nil {
			p = s.Proxy
		}
	}
	if p == "" {
		p = os.Getenv("HTTPS_PROXY")
	}
	if p == "" {
		p = os.Getenv("https_proxy")
	}
	if (agent.Settings{Proxy: p}).Validate() != nil {
		return ""
	}
	return p
}
