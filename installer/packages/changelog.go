package packages

import (
	"compress/gzip"
	"fmt"
	"os"
	"time"
)

// writeChangelog writes the one-entry Debian changelog a native package
// carries.
func writeChangelog(path string, s Spec, when time.Time) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	zw, _ := gzip.NewWriterLevel(f, gzip.BestCompression)
	zw.ModTime = when
	fmt.Fprintf(zw, "%s (%s-1) unstable; urgency=medium\n\n  * edgebox %s.\n\n -- edgebox <edgebox@example.com>  %s\n",
		s.Program.Name, debianVersion(s.Version), s.Version, when.Format("Mon, 02 Jan 2006 15:04:05 -0700"))
	if err := zw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
