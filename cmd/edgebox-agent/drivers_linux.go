package main

import (
	"log/slog"
	"os"
	"path/filepath"

	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/agent/runtime/containerd"
)

// drivers returns the runtimes this box has: containerd when its socket
// is there. A box without it runs no containers and says so in each
// container workload's status.
func drivers(dataDir, containerdAddr string, log *slog.Logger) (ds []runtime.Driver, closeAll func()) {
	closeAll = func() {}
	if _, err := os.Stat(containerdAddr); err != nil {
		log.Info("no containerd on this box; container workloads cannot run", "socket", containerdAddr)
		return nil, closeAll
	}
	d, err := containerd.New(containerd.Config{Address: containerdAddr, LogDir: filepath.Join(dataDir, "logs")})
	if err != nil {
		log.Warn("containerd is not usable; container workloads cannot run", "err", err)
		return nil, closeAll
	}
	return []runtime.Driver{d}, func() { d.Close() }
}
