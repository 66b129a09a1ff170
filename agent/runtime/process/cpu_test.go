package process

import "testing"

func TestCPURate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		millis int64
		cpus   int
		want   uint32
	}{{500, 2, 2500}, {1000, 1, 10000}, {4000, 2, 10000}, {1, 64, 1}, {250, 4, 625}, {500, 0, 5000}} {
		if got := cpuRate(c.millis, c.cpus); got != c.want {
			t.Errorf("cpuRate(%d, %d) = %d, want %d", c.millis, c.cpus, got, c.want)
		}
	}
}
