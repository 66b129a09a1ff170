package agent

import (
	"bufio"
	"os"
	"runtime"
	"strings"

	"github.com/edgebox/edgebox/internal/meminfo"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// hostFacts describes this machine; fields it cannot read stay empty.
func hostFacts(version string) *edgeboxv1.BoxInfo {
	host, _ := os.Hostname()
	info := &edgeboxv1.BoxInfo{
		Hostname: host, Os: runtime.GOOS, Arch: runtime.GOARCH,
		AgentVersion: version, Cpus: uint32(runtime.NumCPU()),
	}
	if runtime.GOOS == "linux" {
		info.OsVersion = osRelease("/etc/os-release")
		info.MemoryBytes, _ = meminfo.Read(meminfo.Path)
		if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
			info.Kernel = strings.TrimSpace(string(b))
		}
	}
	return info
}

func osRelease(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}
