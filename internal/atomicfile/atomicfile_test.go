package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWritesReplaceWholeAndLeaveNoTemporaries(t *testing.T) {
	for name, write := range map[string]func(string, []byte) error{
		"synced":   Write,
		"unsynced": WriteUnsynced,
		"mode":     func(p string, b []byte) error { return WriteMode(p, b, 0o644) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "f")
			for _, want := range []string{"first, and longer than the second", "second"} {
				if err := write(p, []byte(want)); err != nil {
					t.Fatal(err)
				}
				got, err := os.ReadFile(p)
				if err != nil || string(got) != want {
					t.Fatalf("read %q, %v; want %q", got, err, want)
				}
			}
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			wantMode := os.FileMode(0o600)
			if name == "mode" {
				wantMode = 0o644
			}
			if fi.Mode().Perm() != wantMode {
				t.Errorf("mode %v, want %v", fi.Mode().Perm(), wantMode)
			}
			entries, _ := os.ReadDir(dir)
			if len(entries) != 1 {
				t.Errorf("%d files in the directory, want the one written", len(entries))
			}
		})
	}
}

func TestAWriteIntoAMissingDirectoryFails(t *testing.T) {
	if err := WriteUnsynced(filepath.Join(t.TempDir(), "no", "f"), []byte("x")); err == nil {
		t.Fatal("wrote into a directory that does not exist")
	}
}
