package network

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// CreateNetns makes the network namespace <dir>/<name>, a file the new
// namespace is bind-mounted on (as `ip netns add` does), and returns its
// path. A namespace already mounted there is reused, so a caller that was
// killed half-way can call it again.
func CreateNetns(dir, name string) (string, error) {
	if err := validID(name); err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	if isNetns(path) {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("network: namespace directory: %w", err)
	}
	// The mount point is an empty file; one left by a crash is reused.
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o444)
	if err != nil {
		return "", fmt.Errorf("network: namespace %s: %w", name, err)
	}
	f.Close()

	// unshare moves the calling thread into the new namespace; the thread
	// goes back to its own before it is unlocked (see onThreadIn).
	errc := make(chan error, 1)
	go func() {
		errc <- onThreadIn(func() error {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("unshare: %w", err)
			}
			self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
			if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("bind mount: %w", err)
			}
			return nil
		})
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return "", fmt.Errorf("network: creating namespace %s: %w", name, err)
	}
	return path, nil
}

// RemoveNetns unmounts and removes the namespace at path; the namespace
// ends when nothing else holds it. A missing one is not an error.
func RemoveNetns(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("network: unmounting namespace %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("network: removing namespace %s: %w", path, err)
	}
	return nil
}

// isNetns says whether a network namespace is mounted at path.
func isNetns(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// InNetns runs fn on a thread inside the namespace at path and waits for
// it. Sockets fn opens belong to that namespace; goroutines fn starts do
// not run there.
func InNetns(path string, fn func() error) error {
	ns, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("network: opening namespace: %w", err)
	}
	defer ns.Close()
	errc := make(chan error, 1)
	go func() {
		errc <- onThreadIn(func() error {
			if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("network: entering namespace %s: %w", path, err)
			}
			return fn()
		})
	}()
	return <-errc
}

// onThreadIn runs fn, which may move its thread to another network
// namespace, on a locked thread, and then moves the thread back to the
// namespace it was in. Only then is the thread unlocked for other
// goroutines; if it cannot go back, it stays locked and Go ends it with
// the goroutine. Going back matters even then: when that thread is the
// process's main thread Go cannot end it and parks it for good, and a
// thread parked in a workload's namespace would keep that namespace, and
// its veth pair, alive after the namespace was removed.
func onThreadIn(fn func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("network: opening the thread's namespace: %w", err)
	}
	defer orig.Close()
	ferr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err == nil {
		runtime.UnlockOSThread()
	}
	return ferr
}
