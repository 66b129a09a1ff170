// Package vitals reads a box's own figures for the console: CPU, memory,
// disk, temperature and uptime, each as the operating system tells it
// now. A figure it cannot read is 0.
package vitals

import (
	"math"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Reader reads the box's vitals; the CPU share is of the time since its
// last Read.
type Reader struct {
	// Dir is a directory on the file system whose space is reported
	// (the agent's data directory).
	Dir string
	// root is where /proc and /sys are; tests point it at a copy.
	root     string
	lastBusy uint64
	lastAll  uint64
}

// NewReader returns a reader of the vitals of the file system holding
// dir.
func NewReader(dir string) *Reader { return &Reader{Dir: dir, root: "/"} }

// cpuShare is the percentage of busy time since the last call, from the
// busy and total CPU times counted since boot (in any unit); 0 the
// first time.
func (r *Reader) cpuShare(busy, all uint64) float32 {
	var share float32
	if r.lastAll != 0 && all > r.lastAll {
		share = float32(float64(busy-min(busy, r.lastBusy)) * 100 / float64(all-r.lastAll))
	}
	r.lastBusy, r.lastAll = busy, all
	return share
}

// Read reads the vitals now.
func (r *Reader) Read() *edgeboxv1.Vitals {
	v := &edgeboxv1.Vitals{}
	r.read(v)
	if math.IsNaN(float64(v.CpuPercent)) || v.CpuPercent < 0 {
		v.CpuPercent = 0
	}
	v.CpuPercent = min(v.CpuPercent, 100)
	return v
}
