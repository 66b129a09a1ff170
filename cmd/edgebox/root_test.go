package main

import (
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
)

func TestVitalsLine(t *testing.T) {
	v := &api.BoxVitals{CPUPercent: 12.4, MemoryUsedBytes: 1 << 30, MemoryTotalBytes: 4 << 30, DiskUsedBytes: 10 << 30,
		DiskTotalBytes: 100 << 30, TemperatureCelsius: 48, UptimeSeconds: 3 * 3600, ReportedAt: time.Now().Add(-20 * time.Second)}
	got := vitalsLine(v)
	for _, want := range []string{"CPU 12%", "memory 1.0 of 4.0 GiB", "disk 10.0 of 100.0 GiB", "48 °C", "up 3h0m0s", "(reported 20s ago)"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
	// A box that tells no temperature, memory or disk (not Linux yet).
	if got := vitalsLine(&api.BoxVitals{UptimeSeconds: 60, ReportedAt: time.Now()}); strings.Contains(got, "°C") || strings.Contains(got, "memory") {
		t.Errorf("figures not told are shown: %q", got)
	}
}
