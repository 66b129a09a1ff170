package meminfo

import (
	"os"
	"path/filepath"
	"testing"
)

func TestRead(t *testing.T) {
	p := filepath.Join(t.TempDir(), "meminfo")
	body := "MemTotal:       24576000 kB\nMemFree:         1000 kB\nMemAvailable:   12288000 kB\nHugePages_Total:       0\n"
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if total, avail := Read(p); total != 24576000*1024 || avail != 12288000*1024 {
		t.Fatalf("Read: total %d, available %d", total, avail)
	}
	if total, avail := Read(filepath.Join(t.TempDir(), "missing")); total != 0 || avail != 0 {
		t.Fatalf("a missing file: total %d, available %d", total, avail)
	}
}
