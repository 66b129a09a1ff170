package admission

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// maxRememberedRate bounds a rate read back from RateFile: the file is the
// console's own, but a number past this is no measurement.
const maxRememberedRate = 1e6

// readRate returns the rate kept in path, or 0 when there is none or it
// does not parse (a file torn by a crash is no worse than no file).
func readRate(path string) float64 {
	b, err := os.ReadFile(path)
	if err != nil || len(b) > 64 {
		return 0
	}
	r, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	if err != nil || !(r >= 1 && r <= maxRememberedRate) {
		return 0
	}
	return r
}

// writeRate replaces path with rate, whole or not at all.
func writeRate(path string, rate float64) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = fmt.Fprintf(tmp, "%.1f\n", rate)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
