package runtime

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
)

// TailFile writes the last tail lines of the log at path (0: all) to w; a
// log not written yet is empty. Drivers that keep output in files use it.
func TailFile(path string, tail int, w io.Writer) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if tail > 0 && len(lines) > tail {
			lines = lines[1:]
		}
	}
	for _, l := range lines {
		if _, err := fmt.Fprintln(w, l); err != nil {
			return err
		}
	}
	return sc.Err()
}
