package installer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/edgebox/edgebox/agent"
)

// Options say what to install.
type Options struct {
	Layout Layout
	Token  string
	Name   string            // box name; the host name when empty
	Labels map[string]string // added to the token's labels at enrollment
	Proxy  string            // written to the agent's settings
	// Wait bounds the wait for the box to come online; 0 does not wait.
	Wait time.Duration
	Out  io.Writer
}

// step prints one numbered step.
type steps struct {
	out   io.Writer
	n, of int
}

func (s *steps) next(format string, a ...any) {
	s.n++
	fmt.Fprintf(s.out, "[%d/%d] %s\n", s.n, s.of, fmt.Sprintf(format, a...))
}

// Install installs the agent as a service, or brings an existing install
// up to date: running it again is safe. It prints each step to o.Out.
func Install(ctx context.Context, o Options) error {
	l := o.Layout
	st := &steps{out: o.Out, of: 6}
	if o.Proxy == "" {
		// The service does not inherit this shell's environment: a proxy
		// the install needed, the service needs too.
		if p := firstEnv("HTTPS_PROXY", "https_proxy"); p != "" {
			fmt.Fprintf(o.Out, "using the proxy in HTTPS_PROXY (%s) for the service too\n", redact(p))
			o.Proxy = p
		}
	}

	exe, err := os.Executable()
	if err != nil {
		return err
	}
	st.next("installing the agent binary as %s", l.Bin)
	if err := copyBinary(exe, l.Bin); err != nil {
		return fmt.Errorf("installing %s: %w", l.Bin, err)
	}

	st.next("enrolling this box")
	if id, err := agent.LoadIdentity(l.DataDir); err == nil {
		fmt.Fprintf(o.Out, "      already enrolled as %s (box %s) with %s; keeping it\n", id.Name, id.BoxID, id.ConsoleURL)
	} else if !errors.Is(err, agent.ErrNotEnrolled) {
		return err
	} else {
		if o.Token == "" {
			return errors.New("this box is not enrolled yet: give the enrollment token")
		}
		settings := agent.Settings{Proxy: o.Proxy}
		if err := settings.Validate(); err != nil {
			return err
		}
		ectx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		id, pending, err := agent.Enroll(ectx, l.DataDir, o.Token, agent.EnrollOptions{Name: o.Name, Labels: o.Labels, Proxy: settings.ProxyFunc()})
		cancel()
		if err != nil {
			return err
		}
		fmt.Fprintf(o.Out, "      enrolled as %s (box %s) with %s\n", id.Name, id.BoxID, id.ConsoleURL)
		if pending {
			fmt.Fprintf(o.Out, "      it waits for an operator: edgebox boxes approve %s\n", id.BoxID)
		}
	}

	st.next("writing the agent's settings")
	s, err := agent.ReadSettings(l.DataDir)
	if err != nil {
		return err
	}
	if o.Proxy != "" {
		s.Proxy = o.Proxy
	}
	if err := agent.WriteSettings(l.DataDir, s); err != nil {
		return err
	}
	if s.Proxy != "" {
		fmt.Fprintf(o.Out, "      proxy: %s\n", redact(s.Proxy))
	}

	svc, err := NewService(l)
	if err != nil {
		return err
	}
	st.next("installing the %s service (%s)", ServiceName, svc.Platform())
	status, err := svc.Status()
	if err != nil {
		return err
	}
	if status != StatusNotInstalled {
		// Installed before: replace its definition with this one.
		if status == StatusRunning {
			if err := svc.Stop(); err != nil {
				return fmt.Errorf("stopping the installed service: %w", err)
			}
		}
		if err := svc.Uninstall(); err != nil {
			return fmt.Errorf("replacing the installed service: %w", err)
		}
	}
	if err := svc.Install(); err != nil {
		return fmt.Errorf("installing the service: %w", err)
	}

	st.next("starting the service")
	started := time.Now()
	if err := svc.Start(); err != nil {
		return fmt.Errorf("starting the service: %w", err)
	}

	st.next("waiting for the box to come online")
	if o.Wait <= 0 {
		fmt.Fprintln(o.Out, "      not waiting; check with: edgebox-agent status")
		return nil
	}
	return waitOnline(ctx, l.DataDir, started, o.Wait, o.Out)
}

// waitOnline polls the agent's status until it reports a live tunnel on
// which the console answered the box's hello (whether it is approved is
// known only then). Only a status written after since counts: an older one
// may be from the agent that ran before.
func waitOnline(ctx context.Context, dir string, since time.Time, wait time.Duration, out io.Writer) error {
	deadline := time.Now().Add(wait)
	var last agent.Status
	for {
		s, err := agent.ReadStatus(dir)
		if err == nil && s.Greeted() && !s.UpdatedAt.Before(since.Add(-time.Second)) && s.PID != os.Getpid() {
			if s.Approved {
				fmt.Fprintf(out, "      online: %s (box %s) is connected to %s\n", s.Name, s.BoxID, s.ConsoleURL)
			} else {
				fmt.Fprintf(out, "      online, waiting for an operator: edgebox boxes approve %s\n", s.BoxID)
			}
			return nil
		}
		if err == nil {
			last = s
		}
		if time.Now().After(deadline) {
			msg := "the agent runs but has not reached the console"
			if last.LastError != "" {
				msg += ": " + last.LastError
			}
			return fmt.Errorf("%s after %v (check the network, the proxy, and 'edgebox-agent status')", msg, wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// copyBinary puts the running binary at dst, unless it is there already.
func copyBinary(src, dst string) error {
	if same(src, dst) {
		return nil
	}
	raw, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, raw) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return placeBinary(dst, raw, osFiles)
}

// files are the file operations placeBinary needs; tests act as Windows
// with their own.
type files struct {
	rename func(from, to string) error
	remove func(path string) error
}

var osFiles = files{rename: os.Rename, remove: os.Remove}

// asideSuffix marks an old binary set aside by placeBinary.
const asideSuffix = ".old-"

// placeBinary writes raw beside dst and renames it over dst: a running
// old agent keeps its file, and a crash leaves the old binary or the new
// one. Windows refuses to replace the file of a running program (the
// service being installed again) but lets it be renamed: then the old one
// is set aside as dst.old-N first, and removed by this or a later install
// (or uninstall) once its program has ended.
func placeBinary(dst string, raw []byte, fs files) error {
	removeAside(dst, fs)
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".tmp-*")
	if err != nil {
		return err
	}
	defer fs.remove(tmp.Name())
	_, err = tmp.Write(raw)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o755)
	}
	if err != nil {
		return err
	}
	err = fs.rename(tmp.Name(), dst)
	if err == nil {
		return nil
	}
	if _, serr := os.Stat(dst); serr != nil {
		return err // nothing there to set aside
	}
	aside := dst + asideSuffix + strconv.FormatInt(time.Now().UnixNano(), 36)
	if aerr := fs.rename(dst, aside); aerr != nil {
		return fmt.Errorf("%w; setting the old binary aside failed too: %v", err, aerr)
	}
	if err := fs.rename(tmp.Name(), dst); err != nil {
		fs.rename(aside, dst)
		return err
	}
	removeAside(dst, fs)
	return nil
}

// removeAside removes the old binaries set aside beside dst whose
// programs have ended.
func removeAside(dst string, fs files) {
	old, _ := filepath.Glob(dst + asideSuffix + "*")
	for _, f := range old {
		fs.remove(f)
	}
}

func same(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// Uninstall stops and removes the service and the binary; with purge also
// the box's identity, keys and state. Running it again is safe.
func Uninstall(l Layout, purge bool, out io.Writer) error {
	svc, err := NewService(l)
	if err != nil {
		return err
	}
	status, err := svc.Status()
	if err != nil {
		return err
	}
	switch status {
	case StatusNotInstalled:
		fmt.Fprintf(out, "the %s service is not installed\n", ServiceName)
	default:
		if status == StatusRunning {
			fmt.Fprintf(out, "stopping the %s service\n", ServiceName)
			if err := svc.Stop(); err != nil {
				return fmt.Errorf("stopping the service: %w", err)
			}
		}
		fmt.Fprintf(out, "removing the %s service\n", ServiceName)
		if err := svc.Uninstall(); err != nil {
			return fmt.Errorf("removing the service: %w", err)
		}
	}
	if err := os.Remove(l.Bin); err == nil {
		fmt.Fprintf(out, "removed %s\n", l.Bin)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	removeAside(l.Bin, osFiles)
	if purge {
		if _, err := os.Stat(l.DataDir); err == nil {
			if err := os.RemoveAll(l.DataDir); err != nil {
				return err
			}
			fmt.Fprintf(out, "removed %s (this box's identity and state; enroll again to come back)\n", l.DataDir)
		}
		for _, f := range logFiles(l) {
			os.Remove(f)
		}
	}
	return nil
}

// logFiles are the service's output files on SysV systems.
func logFiles(l Layout) []string {
	return []string{filepath.Join(l.LogDir, ServiceName+".log"), filepath.Join(l.LogDir, ServiceName+".err")}
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// redact hides a password in a proxy URL.
func redact(u string) string {
	if i, j := bytes.IndexByte([]byte(u), '@'), bytes.Index([]byte(u), []byte("://")); i > 0 && j > 0 && i > j {
		return u[:j+3] + "…@" + u[i+1:]
	}
	return u
}
