// Package meminfo reads a machine's memory figures from Linux's
// /proc/meminfo.
package meminfo

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// Path is where Linux keeps the figures.
const Path = "/proc/meminfo"

// Read returns MemTotal and MemAvailable from the meminfo file at path, in
// bytes; a figure the file does not give (or a file that cannot be read,
// as on other systems) is 0.
func Read(path string) (total, avail uint64) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "MemTotal":
			total = kb * 1024
		case "MemAvailable":
			avail = kb * 1024
		}
	}
	return total, avail
}
