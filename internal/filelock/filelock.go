// Package filelock takes an exclusive lock on a file that every process
// opening the same path sees, on a local disk or on a share mounted on
// several machines: flock(2) on Unix, LockFileEx on Windows. The system
// drops a lock when its holder exits, however it exits, so a crashed
// holder leaves no stale lock behind.
//
// On Linux, flock on NFS is carried by the NFS lock protocol, so it holds
// across machines on NFSv4, and on NFSv3 with lockd; a share mounted with
// nolock or local_lock=flock (or all) locks on one machine only.
//
// A lock belongs to the open file, not to the process: two goroutines of
// one process that each Acquire the same path exclude each other, as two
// processes do.
package filelock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// Lock is a lock Acquire took. Unlock releases it.
type Lock struct {
	f    *os.File
	once sync.Once
	err  error
}

// errBusy is what tryLock returns when another holds the lock.
var errBusy = errors.New("filelock: held by another")

// Polling bounds: a lock is held for milliseconds (writing a few small
// files), so a waiter asks again soon, and no more than 5 times a second
// while a holder takes longer.
const (
	pollMin = 5 * time.Millisecond
	pollMax = 200 * time.Millisecond
)

// Acquire takes the exclusive lock on path, creating the file (mode 0600)
// if it is missing; the file is never removed, as a removed lock file
// would let two holders lock two files of one name. While another holds
// the lock, Acquire waits until it is released or ctx ends, and then
// returns ctx's error.
func Acquire(ctx context.Context, path string) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("filelock: %w", err)
	}
	wait := pollMin
	for {
		err := tryLock(f)
		if err == nil {
			return &Lock{f: f}, nil
		}
		if !errors.Is(err, errBusy) {
			f.Close()
			return nil, fmt.Errorf("filelock: locking %s: %w", path, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			f.Close()
			return nil, fmt.Errorf("filelock: waiting for %s, held by another: %w", path, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, pollMax)
	}
}

// Unlock releases the lock and closes its file. It may be called more
// than once; later calls return what the first did.
func (l *Lock) Unlock() error {
	l.once.Do(func() {
		err := unlock(l.f)
		if cerr := l.f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			l.err = fmt.Errorf("filelock: unlocking %s: %w", l.f.Name(), err)
		}
	})
	return l.err
}
