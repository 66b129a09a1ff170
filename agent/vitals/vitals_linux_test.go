package vitals

import (
	"os"
	"path/filepath"
	"testing"
)

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestVitalsFromProcAndSys: the figures of a box whose /proc and /sys
// are a test's copy.
func TestVitalsFromProcAndSys(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "proc/stat"), "cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3\n")
	write(t, filepath.Join(root, "proc/meminfo"), "MemTotal:        8000 kB\nMemFree:  1000 kB\nMemAvailable:    6000 kB\n")
	write(t, filepath.Join(root, "proc/uptime"), "3600.25 7000.00\n")
	write(t, filepath.Join(root, "sys/class/thermal/thermal_zone0/temp"), "41000\n")
	write(t, filepath.Join(root, "sys/class/thermal/thermal_zone1/temp"), "57500\n")
	write(t, filepath.Join(root, "sys/class/thermal/thermal_zone2/temp"), "garbage\n")
	r := &Reader{Dir: root, root: root}
	v := r.Read()
	if v.CpuPercent != 0 {
		t.Errorf("CPU on the first read: %v, want 0 (no interval yet)", v.CpuPercent)
	}
	if v.MemoryTotalBytes != 8000*1024 || v.MemoryUsedBytes != 2000*1024 {
		t.Errorf("memory: %d used of %d", v.MemoryUsedBytes, v.MemoryTotalBytes)
	}
	if v.UptimeSeconds != 3600 || v.TemperatureCelsius != 57.5 {
		t.Errorf("uptime %d, temperature %v", v.UptimeSeconds, v.TemperatureCelsius)
	}
	if v.DiskTotalBytes == 0 || v.DiskUsedBytes > v.DiskTotalBytes {
		t.Errorf("disk: %d used of %d", v.DiskUsedBytes, v.DiskTotalBytes)
	}
	// 1,000 jiffies later, 150 of them busy: 15 %.
	write(t, filepath.Join(root, "proc/stat"), "cpu  250 0 100 1450 200 0 0 0 0 0\n")
	if v := r.Read(); v.CpuPercent != 15 {
		t.Errorf("CPU over the interval: %v, want 15", v.CpuPercent)
	}
	// This machine's own.
	real := NewReader(t.TempDir())
	real.Read()
	if v := real.Read(); v.MemoryTotalBytes == 0 || v.UptimeSeconds == 0 || v.DiskTotalBytes == 0 {
		t.Errorf("this machine's vitals: %v", v)
	}
}
