package filelock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestAcquireExcludesGoroutines: goroutines that each read a counter, wait
// and write it back one higher, under the lock, lose no increment.
func TestAcquireExcludesGoroutines(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	lockPath, counter := filepath.Join(dir, "lock"), filepath.Join(dir, "counter")
	if err := os.WriteFile(counter, []byte("0"), 0o600); err != nil {
		t.Fatal(err)
	}
	const n = 8
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			l, err := Acquire(ctx, lockPath)
			if err != nil {
				errs <- err
				return
			}
			defer l.Unlock()
			b, err := os.ReadFile(counter)
			if err != nil {
				errs <- err
				return
			}
			v, _ := strconv.Atoi(string(b))
			time.Sleep(10 * time.Millisecond) // long enough for the others to read the same value, were they let in
			errs <- os.WriteFile(counter, []byte(strconv.Itoa(v+1)), 0o600)
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if b, _ := os.ReadFile(counter); string(b) != strconv.Itoa(n) {
		t.Fatalf("the counter is %s after %d increments under the lock", b, n)
	}
}

// TestAcquireWaitsForAnotherProcess: while another process holds the lock,
// Acquire waits and gives up when its context ends; once that process is
// killed, holding the lock, Acquire takes it at once.
func TestAcquireWaitsForAnotherProcess(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "lock")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "EDGEBOX_FILELOCK_HOLD="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "locked\n" {
		t.Fatalf("the holder said %q, %v", line, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if l, err := Acquire(ctx, path); !errors.Is(err, context.DeadlineExceeded) {
		if l != nil {
			l.Unlock()
		}
		t.Fatalf("Acquire while another process holds the lock: %v, want the context's deadline", err)
	}

	cmd.Process.Kill()
	cmd.Wait()
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := Acquire(ctx, path)
	if err != nil {
		t.Fatalf("Acquire after the holder was killed: %v", err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatalf("a second Unlock: %v", err)
	}
}

// TestMain runs the test binary as TestAcquireWaitsForAnotherProcess's
// holder when EDGEBOX_FILELOCK_HOLD names a lock: it takes it, says so
// and holds it until it is killed.
func TestMain(m *testing.M) {
	path := os.Getenv("EDGEBOX_FILELOCK_HOLD")
	if path == "" {
		os.Exit(m.Run())
	}
	if _, err := Acquire(context.Background(), path); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Stdout.WriteString("locked\n")
	time.Sleep(time.Hour)
}
