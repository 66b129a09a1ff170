// Package testenv is edgebox's one integration environment: a real console
// and real agents on loopback, either in this process (InProcess) or as the
// built binaries (Binaries). Scenarios are written once against Harness and
// run on both.
package testenv

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
)

// Harness is a running console with a way to add agents.
type Harness interface {
	// Admin is an API client with the admin token.
	Admin() *api.Client
	// URL is the console's public URL.
	URL() string
	// CAPEM is the console's CA certificate; AdminToken the admin's API
	// token.
	CAPEM() []byte
	AdminToken() string
	// Token creates an enrollment token and returns its text.
	Token(t testing.TB, req api.TokenRequest) string
	// Enroll enrolls a new box; the agent is not started.
	Enroll(t testing.TB, token, name string) (Box, error)
	// RestartConsole stops the console and starts it again on the same
	// data and address.
	RestartConsole(t testing.TB)
}

// Box is an enrolled box whose agent can be started and stopped.
type Box interface {
	ID() string
	Start(t testing.TB)
	Stop(t testing.TB)
	// DataDir is the agent's data directory.
	DataDir() string
}

var firstStartRE = regexp.MustCompile(`admin token:\s+(\S+)`)

// parseAdminToken reads the admin token from the first-start message.
func parseAdminToken(out []byte) (string, error) {
	m := firstStartRE.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("no admin token in console output %q", out)
	}
	return string(m[1]), nil
}

// Logger logs to the test's output.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type logWriter struct{ t testing.TB }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(b, "\n")))
	return len(b), nil
}

// WaitFor polls cond every 10 ms until it holds or timeout passes.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// BoxState fetches a box through the API, failing the test on error.
func BoxState(t testing.TB, h Harness, id string) api.Box {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := h.Admin().Box(ctx, id)
	if err != nil {
		t.Fatalf("get box %s: %v", id, err)
	}
	return b
}
