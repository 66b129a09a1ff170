// Package boxvitals keeps the latest figures each box reports of itself
// (CPU, memory, disk, temperature, uptime), in memory: one report a box,
// replaced by the next, so an idle box costs a few hundred bytes and no
// writes. After a console restart a box's figures are back with its next
// report, within a minute.
package boxvitals

import (
	"fmt"
	"math"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Report is a box's latest vitals and when they came.
type Report struct {
	Vitals *edgeboxv1.Vitals
	At     time.Time
}

// Store holds the latest report of each box. It is safe for concurrent
// use.
type Store struct {
	mu sync.Mutex
	m  map[string]Report
}

// New returns an empty store.
func New() *Store { return &Store{m: map[string]Report{}} }

// Put keeps v as box's latest vitals, unless they cannot be true.
func (s *Store) Put(box string, v *edgeboxv1.Vitals, at time.Time) error {
	if err := check(v); err != nil {
		return errdefs.Invalid("vitals: %v", err)
	}
	s.mu.Lock()
	s.m[box] = Report{Vitals: proto.Clone(v).(*edgeboxv1.Vitals), At: at}
	s.mu.Unlock()
	return nil
}

// Get returns box's latest vitals.
func (s *Store) Get(box string) (Report, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.m[box]
	return r, ok
}

func check(v *edgeboxv1.Vitals) error {
	cpu, temp := float64(v.GetCpuPercent()), float64(v.GetTemperatureCelsius())
	switch {
	case math.IsNaN(cpu) || cpu < 0 || cpu > 100:
		return fmt.Errorf("a CPU share of %v%%", cpu)
	case math.IsNaN(temp) || temp < -60 || temp > 200:
		return fmt.Errorf("a temperature of %v °C", temp)
	case v.GetMemoryUsedBytes() > v.GetMemoryTotalBytes():
		return fmt.Errorf("%d bytes of memory used of %d", v.GetMemoryUsedBytes(), v.GetMemoryTotalBytes())
	case v.GetDiskUsedBytes() > v.GetDiskTotalBytes():
		return fmt.Errorf("%d bytes of disk used of %d", v.GetDiskUsedBytes(), v.GetDiskTotalBytes())
	}
	return nil
}
