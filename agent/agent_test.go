package agent

import (
	"context"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/enroll"
)

func TestRenewAtTwoThirds(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		life time.Duration
		want time.Duration
	}{
		{30 * 24 * time.Hour, 20 * 24 * time.Hour},
		{9 * time.Second, 6 * time.Second},
	}
	for _, tc := range cases {
		leaf := &x509.Certificate{NotBefore: start, NotAfter: start.Add(tc.life)}
		if got := renewAt(leaf).Sub(start); got != tc.want {
			t.Errorf("life %v: renew after %v, want %v", tc.life, got, tc.want)
		}
	}
}

func TestNotEnrolled(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := New(DefaultConfig(dir), nil); !errors.Is(err, ErrNotEnrolled) {
		t.Fatalf("New on an empty dir: %v", err)
	}
	if _, err := ReadStatus(dir); !errors.Is(err, ErrNotEnrolled) {
		t.Fatalf("ReadStatus on an empty dir: %v", err)
	}
}

func TestEnrollRefusesBadTokenAndEnrolledDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, _, err := Enroll(context.Background(), dir, "not-a-token", EnrollOptions{}); err == nil || !strings.Contains(err.Error(), "not a valid enrollment token") {
		t.Fatalf("bad token: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("a refused enrollment wrote %d files", len(entries))
	}
	os.WriteFile(filepath.Join(dir, identityFile), []byte("{}"), 0o600)
	tok := enroll.Token{ConsoleURL: "https://127.0.0.1:1", CAHash: [32]byte{1},
		ID: make([]byte, enroll.IDLen), Secret: make([]byte, enroll.SecretLen)}
	_, _, err := Enroll(context.Background(), dir, tok.String(), EnrollOptions{})
	if err == nil || !strings.Contains(err.Error(), "already holds an enrolled box") {
		t.Fatalf("enrolled dir: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig("")
	if err := cfg.Validate(); err == nil {
		t.Fatal("empty data dir accepted")
	}
	cfg = DefaultConfig(t.TempDir())
	cfg.RPCIdle = 0
	if err := cfg.Validate(); err == nil {
		t.Fatal("zero RPCIdle accepted")
	}
}
