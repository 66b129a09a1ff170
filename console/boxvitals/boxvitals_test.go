package boxvitals

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

func TestTheLatestReportIsKept(t *testing.T) {
	s := New()
	at := time.Now()
	ok := &edgeboxv1.Vitals{CpuPercent: 12.5, MemoryUsedBytes: 1 << 30, MemoryTotalBytes: 4 << 30, DiskUsedBytes: 10, DiskTotalBytes: 100,
		TemperatureCelsius: 48, UptimeSeconds: 3600}
	if err := s.Put("bx-1", ok, at); err != nil {
		t.Fatal(err)
	}
	ok.CpuPercent = 99 // the caller's message is not kept by reference
	if r, found := s.Get("bx-1"); !found || r.Vitals.GetCpuPercent() != 12.5 || !r.At.Equal(at) {
		t.Fatalf("got %v %v", r, found)
	}
	for name, v := range map[string]*edgeboxv1.Vitals{
		"CPU over 100":        {CpuPercent: 101},
		"CPU not a number":    {CpuPercent: float32(math.NaN())},
		"hotter than the sun": {TemperatureCelsius: 5000},
		"more memory used":    {MemoryUsedBytes: 2, MemoryTotalBytes: 1},
		"more disk used":      {DiskUsedBytes: 2, DiskTotalBytes: 1},
	} {
		if err := s.Put("bx-1", v, at); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if r, _ := s.Get("bx-1"); r.Vitals.GetCpuPercent() != 12.5 {
		t.Fatalf("a refused report replaced the latest: %v", r)
	}
	if _, found := s.Get("bx-2"); found {
		t.Fatal("a box that never reported has vitals")
	}
}
