//go:build linux

package runtimetest

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Processes counts the copies of a workload running on this box by its
// processes: those whose environment or command line holds
// GREETING=greeting and whose parent's does not (a copy's children are
// part of it). Zombies do not count.
func Processes(t *testing.T, greeting string) int {
	t.Helper()
	mark := []byte("GREETING=" + greeting + "\x00")
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	marked := map[int]int{} // pid -> parent
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, live := parent(pid)
		if !live {
			continue
		}
		if has(pid, mark) {
			marked[pid] = ppid
		}
	}
	n := 0
	for _, ppid := range marked {
		if _, child := marked[ppid]; !child {
			n++
		}
	}
	return n
}

// parent returns pid's parent, and whether pid is a live process (not a
// zombie).
func parent(pid int) (int, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 || f[0] == "Z" || f[0] == "X" {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

func has(pid int, mark []byte) bool {
	for _, f := range []string{"environ", "cmdline"} {
		b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), f))
		if bytes.Contains(append(b, 0), mark) {
			return true
		}
	}
	return false
}
