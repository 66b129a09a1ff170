package vitals

import (
	"unsafe"

	"golang.org/x/sys/windows"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// The kernel32 calls x/sys/windows does not wrap.
var (
	kernel32                 = windows.NewLazySystemDLL("kernel32.dll")
	procGetSystemTimes       = kernel32.NewProc("GetSystemTimes")
	procGlobalMemoryStatusEx = kernel32.NewProc("GlobalMemoryStatusEx")
)

// memoryStatusEx is Windows' MEMORYSTATUSEX.
type memoryStatusEx struct {
	length               uint32
	memoryLoad           uint32
	totalPhys            uint64
	availPhys            uint64
	totalPageFile        uint64
	availPageFile        uint64
	totalVirtual         uint64
	availVirtual         uint64
	availExtendedVirtual uint64
}

// read reads the CPU times of all CPUs, physical memory, the data
// directory's volume and the time since boot. Windows tells a
// temperature only through WMI's ACPI thermal zones, which most
// mini-PCs leave empty: it stays 0, unknown.
func (r *Reader) read(v *edgeboxv1.Vitals) {
	var idle, kernel, user windows.Filetime
	if ok, _, _ := procGetSystemTimes.Call(uintptr(unsafe.Pointer(&idle)), uintptr(unsafe.Pointer(&kernel)), uintptr(unsafe.Pointer(&user))); ok != 0 {
		// Kernel time includes the idle time.
		all := filetime(kernel) + filetime(user)
		v.CpuPercent = r.cpuShare(all-min(all, filetime(idle)), all)
	}
	m := memoryStatusEx{length: uint32(unsafe.Sizeof(memoryStatusEx{}))}
	if ok, _, _ := procGlobalMemoryStatusEx.Call(uintptr(unsafe.Pointer(&m))); ok != 0 {
		v.MemoryTotalBytes = m.totalPhys
		if m.availPhys <= m.totalPhys {
			v.MemoryUsedBytes = m.totalPhys - m.availPhys
		}
	}
	if r.Dir != "" {
		if dir, err := windows.UTF16PtrFromString(r.Dir); err == nil {
			var callerFree, total, free uint64
			if windows.GetDiskFreeSpaceEx(dir, &callerFree, &total, &free) == nil && free <= total {
				v.DiskTotalBytes, v.DiskUsedBytes = total, total-free
			}
		}
	}
	v.UptimeSeconds = uint64(windows.DurationSinceBoot().Seconds())
}

func filetime(f windows.Filetime) uint64 { return uint64(f.HighDateTime)<<32 | uint64(f.LowDateTime) }
