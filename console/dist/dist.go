// Package dist serves what boxes download to install the agent: the agent
// binaries of a release and their SHA256SUMS, from one directory.
package dist

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/edgebox/edgebox/internal/atomicfile"
)

// SumsFile lists the SHA-256 of every file served, as sha256sum writes it.
const SumsFile = "SHA256SUMS"

// Dir is a directory of downloads: only the files SHA256SUMS lists are
// served.
type Dir struct {
	dir  string
	sums map[string]string
}

// Open reads dir's SHA256SUMS. Without one, it hashes the agent binaries
// in dir (edgebox-agent-*) and writes it, so the sums are fixed from then
// on: a binary changed later no longer matches. A missing dir serves
// nothing.
func Open(dir string) (*Dir, error) {
	d := &Dir{dir: dir, sums: map[string]string{}}
	raw, err := os.ReadFile(filepath.Join(dir, SumsFile))
	switch {
	case err == nil:
		return d, d.parse(string(raw))
	case !errors.Is(err, os.ErrNotExist):
		return nil, err
	}
	paths, err := filepath.Glob(filepath.Join(dir, "edgebox-agent-*"))
	if err != nil || len(paths) == 0 {
		return d, err
	}
	names := make([]string, len(paths))
	for i, p := range paths {
		names[i] = filepath.Base(p)
	}
	sums, err := WriteSums(dir, names)
	if err != nil {
		return nil, err
	}
	return d, d.parse(sums)
}

// WriteSums writes dir's SHA256SUMS for the files names, as sha256sum
// does, and returns what it wrote.
func WriteSums(dir string, names []string) (string, error) {
	names = append([]string(nil), names...)
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		sum, err := fileSum(filepath.Join(dir, n))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, n)
	}
	return b.String(), atomicfile.Write(filepath.Join(dir, SumsFile), []byte(b.String()))
}

func (d *Dir) parse(s string) error {
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 || len(f[0]) != 64 {
			return fmt.Errorf("dist: %s: bad line %q", SumsFile, sc.Text())
		}
		name := strings.TrimPrefix(f[1], "*")
		if name != filepath.Base(name) {
			return fmt.Errorf("dist: %s: %q is not a file name", SumsFile, name)
		}
		d.sums[name] = f[0]
	}
	return sc.Err()
}

func fileSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Path returns the file to serve for name: SHA256SUMS or a file it lists.
func (d *Dir) Path(name string) (string, bool) {
	if _, ok := d.sums[name]; !ok && (name != SumsFile || len(d.sums) == 0) {
		return "", false
	}
	return filepath.Join(d.dir, name), true
}

// Sum returns the hex SHA-256 SHA256SUMS lists for name.
func (d *Dir) Sum(name string) (string, bool) {
	sum, ok := d.sums[name]
	return sum, ok
}

// Files lists the files served, besides SHA256SUMS.
func (d *Dir) Files() []string {
	out := make([]string, 0, len(d.sums))
	for n := range d.sums {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
