package console

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgebox/edgebox/internal/test/leak"
)

// breakingListener is a real TCP listener whose Accept fails for good, as
// a listener whose socket went away does, once break_ is called.
type breakingListener struct {
	net.Listener
	once  sync.Once
	broke chan struct{}
}

var errListenerBroke = errors.New("the test broke the listener")

func (l *breakingListener) break_() {
	l.once.Do(func() { close(l.broke) })
	// Wake the Accept that is waiting.
	if c, err := net.Dial("tcp", l.Addr().String()); err == nil {
		c.Close()
	}
}

func (l *breakingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	select {
	case <-l.broke:
		if c != nil {
			c.Close()
		}
		return nil, errListenerBroke
	default:
	}
	return c, err
}

// TestRunEndsWithItsFirstFailure runs a whole console and checks how it
// ends: with the public listener's error when that listener fails for
// good, with nil when its context ends, and in both cases with every
// goroutine it started gone. It is not parallel: it counts the process's
// goroutines.
func TestRunEndsWithItsFirstFailure(t *testing.T) {
	tests := []struct {
		name    string
		stop    func(cancel context.CancelFunc, ln *breakingListener)
		wantErr error
	}{
		{"public listener fails", func(_ context.CancelFunc, ln *breakingListener) { ln.break_() }, errListenerBroke},
		{"context ends", func(cancel context.CancelFunc, _ *breakingListener) { cancel() }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, _ := leak.Count()
			tcp, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ln := &breakingListener{Listener: tcp, broke: make(chan struct{})}
			cfg := DefaultConfig()
			cfg.DataDir = t.TempDir()
			cfg.Listener = ln
			cfg.PublicURL = "https://" + tcp.Addr().String()
			cfg.Out = io.Discard
			c, err := New(cfg, slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ran := make(chan error, 1)
			go func() { ran <- c.Run(ctx) }()
			select {
			case <-c.Ready():
			case err := <-ran:
				t.Fatalf("Run returned before the console was up: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("the console is not up after 30s")
			}

			// It serves, first.
			hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
			defer hc.CloseIdleConnections()
			resp, err := hc.Get("https://" + tcp.Addr().String() + "/healthz")
			if err != nil {
				t.Fatalf("the console does not serve: %v", err)
			}
			resp.Body.Close()
			hc.CloseIdleConnections()

			tt.stop(cancel, ln)
			select {
			case err := <-ran:
				if tt.wantErr == nil && err != nil {
					t.Fatalf("Run returned %v, want nil", err)
				}
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Fatalf("Run returned %v, want %v", err, tt.wantErr)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Run has not returned 30s after the stop")
			}
			// Nothing listens on the public port any more.
			if conn, err := net.DialTimeout("tcp", tcp.Addr().String(), 5*time.Second); err == nil {
				conn.Close()
				t.Error("the public port still accepts connections after Run returned")
			}

			n, all := leak.Settle(before, 10*time.Second)
			if n > before {
				t.Errorf("%d goroutines before Run, %d after it returned; all goroutines:\n%s", before, n, all)
			}
		})
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestNewAndCloseReleaseWhatNewOpened: a console New could not finish, or
// one that never ran and was closed, leaves its database, its port and a
// listener it was given free for the next console.
func TestNewAndCloseReleaseWhatNewOpened(t *testing.T) {
	t.Parallel()
	log := func(t *testing.T) *slog.Logger {
		return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	config := func(t *testing.T, dataDir, listen string) Config {
		cfg := DefaultConfig()
		cfg.DataDir, cfg.Listen, cfg.Out = dataDir, listen, io.Discard
		return cfg
	}
	tests := []struct {
		name string
		// first makes a console that does not run and returns the address
		// it had (or was refused).
		first func(t *testing.T, dataDir string) string
	}{
		{"New fails on a taken port, after opening the database", func(t *testing.T, dataDir string) string {
			taken, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer taken.Close()
			_, err = New(config(t, dataDir, taken.Addr().String()), log(t))
			if err == nil || !strings.Contains(err.Error(), "listen on") {
				t.Fatalf("New on a taken port: %v, want a listen error", err)
			}
			return taken.Addr().String()
		}},
		{"New never run, then closed", func(t *testing.T, dataDir string) string {
			c, err := New(config(t, dataDir, "127.0.0.1:0"), log(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := c.Close(); err != nil {
				t.Fatalf("a second Close: %v", err)
			}
			if err := c.Run(context.Background()); err == nil {
				t.Fatal("Run after Close returned nil")
			}
			return c.Addr().String()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dataDir := t.TempDir()
			addr := tt.first(t, dataDir)
			// The same database and port, at once: a port still held is
			// "in use", a database still open waits for its lock.
			opened := make(chan error, 1)
			go func() {
				c, err := New(config(t, dataDir, addr), log(t))
				if err == nil {
					err = c.Close()
				}
				opened <- err
			}()
			select {
			case err := <-opened:
				if err != nil {
					t.Fatalf("a second console on the same data and port: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("a second console on the same data is still opening after 30s: the first still holds its database")
			}
		})
	}

	t.Run("New fails, and closes the listener it was given", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		notADir := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(notADir, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := config(t, notADir, "127.0.0.1:0")
		cfg.Listener = ln
		if _, err := New(cfg, log(t)); err == nil {
			t.Fatal("New with a file for its data directory succeeded")
		}
		if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept on the listener given to a failed New: %v, want net.ErrClosed", err)
		}
	})
}
