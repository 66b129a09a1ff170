package vitals

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/edgebox/edgebox/internal/meminfo"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

func (r *Reader) read(v *edgeboxv1.Vitals) {
	if busy, all, ok := cpuTimes(filepath.Join(r.root, "proc/stat")); ok {
		v.CpuPercent = r.cpuShare(busy, all)
	}
	total, avail := meminfo.Read(filepath.Join(r.root, "proc/meminfo"))
	v.MemoryTotalBytes = total
	if avail <= total {
		v.MemoryUsedBytes = total - avail
	}
	var fs syscall.Statfs_t
	if r.Dir != "" && syscall.Statfs(r.Dir, &fs) == nil {
		v.DiskTotalBytes = fs.Blocks * uint64(fs.Bsize)
		v.DiskUsedBytes = (fs.Blocks - fs.Bfree) * uint64(fs.Bsize)
	}
	v.TemperatureCelsius = hottest(filepath.Join(r.root, "sys/class/thermal"))
	if b, err := os.ReadFile(filepath.Join(r.root, "proc/uptime")); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if s, err := strconv.ParseFloat(f[0], 64); err == nil && s > 0 {
				v.UptimeSeconds = uint64(s)
			}
		}
	}
}

// cpuTimes reads the busy and total jiffies of all CPUs from /proc/stat.
func cpuTimes(path string) (busy, all uint64, ok bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, 0, false
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0, false
	}
	for i, s := range fields[1:] {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		if i >= 8 { // guest time is counted in user time already
			break
		}
		all += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, all, true
}

// hottest is the highest temperature of the thermal zones under dir, in
// °C; 0 when none tells one.
func hottest(dir string) float32 {
	zones, _ := filepath.Glob(filepath.Join(dir, "thermal_zone*", "temp"))
	var hot float32
	for _, z := range zones {
		b, err := os.ReadFile(z)
		if err != nil {
			continue
		}
		milli, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || milli < -50_000 || milli > 200_000 {
			continue
		}
		if c := float32(milli) / 1000; c > hot {
			hot = c
		}
	}
	return hot
}
