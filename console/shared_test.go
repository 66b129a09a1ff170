package console

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSharedDirHoldsWhatReplicasShare: with a shared directory, the CA,
// the registry and the agent releases are made there, and the data
// directory keeps only the console's own files; a shared directory that
// is not an absolute path is refused.
func TestSharedDirHoldsWhatReplicasShare(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	tests := []struct {
		name    string
		shared  func(t *testing.T) string
		wantErr string
	}{
		{"absolute, missing", func(t *testing.T) string { return filepath.Join(t.TempDir(), "nfs", "edgebox") }, ""},
		{"relative", func(*testing.T) string { return "shared" }, "must be an absolute path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := DefaultConfig()
			cfg.DataDir, cfg.SharedDir, cfg.Listen, cfg.Out = t.TempDir(), tt.shared(t), "127.0.0.1:0", io.Discard
			c, err := New(cfg, log)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("New with --shared %q: %v, want %q", cfg.SharedDir, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{"pki/ca.pem", "pki/server-key.pem", "registry/http-secret", "agent-releases"} {
				if _, err := os.Stat(filepath.Join(cfg.SharedDir, f)); err != nil {
					t.Errorf("the shared directory lacks %s: %v", f, err)
				}
				if _, err := os.Stat(filepath.Join(cfg.DataDir, f)); !os.IsNotExist(err) {
					t.Errorf("the data directory has %s beside the shared directory's (%v)", f, err)
				}
			}
			if _, err := os.Stat(filepath.Join(cfg.DataDir, "console.db")); err != nil {
				t.Errorf("the database is not in the data directory: %v", err)
			}
		})
	}
}

// TestRegistryS3IsCheckedAtTheStart: a --registry-s3 that cannot be read,
// or whose bucket cannot be reached, stops the console at New with the
// reason.
func TestRegistryS3IsCheckedAtTheStart(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ url, want string }{
		{"s3://robots", "region"},
		{"https://robots", "want s3://"},
		// Nothing listens on port 1: the bucket cannot be used.
		{"s3://robots?endpoint=http://127.0.0.1:1", "cannot be used"},
	} {
		cfg := DefaultConfig()
		cfg.DataDir, cfg.Listen, cfg.Out, cfg.RegistryS3 = t.TempDir(), "127.0.0.1:0", io.Discard, tt.url
		c, err := New(cfg, slog.New(slog.DiscardHandler))
		if err == nil {
			c.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New with --registry-s3 %q: %v, want %q", tt.url, err, tt.want)
		}
	}
}
