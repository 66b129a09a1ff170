package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/edgebox/edgebox/api"
)

// copyRetries bounds how often a copy goes on after its connection broke.
const copyRetries = 20

func cpCmd() *cobra.Command {
	var volume string
	c := &cobra.Command{
		Use:   "cp SOURCE DESTINATION",
		Short: "Copy a file to or from a box, or a workload's volume on it; resumes after a cut",
		Long: `Copy a file to a box (DESTINATION is BOX:PATH) or from one (SOURCE is
BOX:PATH), through the box's tunnel. PATH is absolute on the box, or, with
--volume APP/VOLUME, within that workload volume.

A copy whose connection breaks goes on where it stopped, by itself, up to
20 times; run the same command again to go on after that. A file lands
whole or not at all: on the box it is checked against its SHA-256 and
renamed into place; here, the download is kept in FILE.edgebox-part until
it is whole and checked. Files up to 4 GiB. Needs the maintainer or admin
role; every copy is audited.`,
		Example: `  edgebox cp ./robot.cfg box-17:/etc/robot/robot.cfg
  edgebox cp box-17:/var/log/robot.log ./robot.log
  edgebox cp statement.pdf box-17:inbox/statement.pdf --volume robot/data`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			srcBox, srcPath := splitRemote(args[0])
			dstBox, dstPath := splitRemote(args[1])
			switch {
			case srcBox != "" && dstBox != "":
				return errors.New("copy between a box and this machine: one of SOURCE and DESTINATION is BOX:PATH, the other local")
			case srcBox == "" && dstBox == "":
				return errors.New("name the box: BOX:PATH as SOURCE or DESTINATION")
			case dstBox != "":
				return upload(cmd.Context(), cmd, cl, srcPath, dstBox, dstPath, volume)
			default:
				return download(cmd.Context(), cmd, cl, srcBox, srcPath, volume, dstPath)
			}
		},
	}
	c.Flags().StringVar(&volume, "volume", "", "APP/VOLUME: the box path is within this workload volume")
	return c
}

// splitRemote reads BOX:PATH; a local path (C:\x on Windows included)
// has no box.
func splitRemote(s string) (box, path string) {
	i := strings.IndexByte(s, ':')
	if i <= 1 || strings.ContainsAny(s[:i], `/\`) {
		return "", s
	}
	return s[:i], s[i+1:]
}

// retryable says whether a copy may go on after err: the connection
// broke, or the console or box was briefly unavailable.
func retryable(err error) bool {
	var se *api.StatusError
	if errors.As(err, &se) {
		return se.Status == http.StatusServiceUnavailable || se.Status >= 500 || se.Status == http.StatusConflict
	}
	return err != nil && !errors.Is(err, context.Canceled)
}

func backoff(ctx context.Context, try int) error {
	d := min(time.Duration(1<<min(try, 4))*time.Second/2, 10*time.Second)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func upload(ctx context.Context, cmd *cobra.Command, cl *api.Client, local, box, path, volume string) error {
	f, err := os.Open(local)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a file", local)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	p := newCopyProgress(cmd, fi.Size())
	for try := 0; ; try++ {
		st, err := cl.StatFile(ctx, box, path, volume, false)
		var fi2 api.FileInfo
		if err == nil {
			if st.PartSize > fi.Size() {
				return fmt.Errorf("the box holds %d bytes of an earlier upload to %s, more than this file's %d; remove %s%s on the box", st.PartSize, path, fi.Size(), path, ".edgebox-part")
			}
			p.at(st.PartSize)
			if _, err = f.Seek(st.PartSize, io.SeekStart); err == nil {
				fi2, err = cl.UploadFile(ctx, box, path, volume, st.PartSize, fi.Size(), sum, uint32(fi.Mode().Perm()), p.reader(f))
			}
		}
		if err == nil && fi2.Complete {
			p.done(fmt.Sprintf("copied %s to %s:%s (%s, SHA-256 %s)", local, box, path, size(fi.Size()), sum[:16]))
			return nil
		}
		if (err != nil && !retryable(err)) || try >= copyRetries {
			p.stop()
			return orBody(err)
		}
		p.note(fmt.Sprintf("the copy stopped (%v); going on", orBody(err)))
		if err := backoff(ctx, try); err != nil {
			return err
		}
	}
}

func download(ctx context.Context, cmd *cobra.Command, cl *api.Client, box, path, volume, local string) error {
	if st, err := os.Stat(local); err == nil && st.IsDir() {
		local = filepath.Join(local, filepath.Base(path))
	}
	st, err := cl.StatFile(ctx, box, path, volume, true)
	if err != nil {
		return err
	}
	if !st.Exists || st.IsDir || len(st.SHA256) != 64 {
		return fmt.Errorf("no file %s on box %s (a regular file is copied, not a directory or a device)", path, box)
	}
	part := local + ".edgebox-part"
	f, err := os.OpenFile(part, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	p := newCopyProgress(cmd, st.Size)
	for try := 0; ; try++ {
		have, err := f.Seek(0, io.SeekEnd)
		if err != nil {
			return err
		}
		if have > st.Size {
			f.Truncate(0)
			have, _ = f.Seek(0, io.SeekStart)
		}
		p.at(have)
		if have < st.Size {
			var body io.ReadCloser
			body, _, err = cl.DownloadFile(ctx, box, path, volume, have)
			if err == nil {
				_, err = io.Copy(f, p.reader(body))
				body.Close()
			}
		}
		if err == nil {
			if n, _ := f.Seek(0, io.SeekEnd); n == st.Size {
				break
			}
			err = errors.New("the download ended early")
		}
		if !retryable(err) || try >= copyRetries {
			p.stop()
			return err
		}
		p.note(fmt.Sprintf("the copy stopped (%v); going on", err))
		if err := backoff(ctx, try); err != nil {
			return err
		}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != st.SHA256 {
		f.Close()
		os.Remove(part)
		p.stop()
		return fmt.Errorf("the file changed on the box while it was copied (SHA-256 %s, the box said %s); copy it again", got[:16], st.SHA256[:16])
	}
	if err := f.Sync(); err != nil {
		return err
	}
	f.Close()
	if err := os.Rename(part, local); err != nil {
		return err
	}
	p.done(fmt.Sprintf("copied %s:%s to %s (%s, SHA-256 %s)", box, path, local, size(st.Size), st.SHA256[:16]))
	return nil
}

func orBody(err error) error {
	if err == nil {
		return errors.New("the connection ended before the whole file")
	}
	return err
}

// copyProgress shows how far a copy is, on standard error when it is a
// terminal.
type copyProgress struct {
	w     io.Writer
	tty   bool
	total int64
	n     atomic.Int64
	start time.Time
	last  time.Time
}

func newCopyProgress(cmd *cobra.Command, total int64) *copyProgress {
	w := cmd.ErrOrStderr()
	f, ok := w.(*os.File)
	return &copyProgress{w: w, tty: ok && term.IsTerminal(int(f.Fd())), total: total, start: time.Now()}
}

func (p *copyProgress) at(n int64) { p.n.Store(n); p.show(true) }

func (p *copyProgress) show(force bool) {
	if !p.tty || (!force && time.Since(p.last) < 200*time.Millisecond) {
		return
	}
	p.last = time.Now()
	n := p.n.Load()
	rate := float64(n) / max(time.Since(p.start).Seconds(), 0.001)
	fmt.Fprintf(p.w, "\r%s of %s (%.0f%%), %s/s   ", size(n), size(p.total), 100*float64(n)/float64(max(p.total, 1)), size(int64(rate)))
}

func (p *copyProgress) note(msg string) {
	p.stop()
	fmt.Fprintln(p.w, "edgebox:", msg)
}

func (p *copyProgress) stop() {
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

func (p *copyProgress) done(msg string) {
	p.stop()
	fmt.Fprintln(p.w, msg)
}

func (p *copyProgress) reader(r io.Reader) io.Reader {
	return readerFunc(func(b []byte) (int, error) {
		n, err := r.Read(b)
		p.n.Add(int64(n))
		p.show(false)
		return n, err
	})
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(b []byte) (int, error) { return f(b) }

func size(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
