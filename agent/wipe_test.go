package agent

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPendingWipe: what a wipe record means at start, with or without an
// identity: finish the wipe, refuse to run, or start as the box enrolled
// since.
func TestPendingWipe(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	cases := []struct {
		name     string
		record   string // wipe.json; "" for none
		identity string // identity.json's box ID; "" for none
		pending  bool
		wiped    bool
		kept     bool // wipe.json is still there
	}{
		{name: "no record"},
		{name: "wiping, same box", record: `{"box_id":"b-1","state":"wiping"}`, identity: "b-1", pending: true, kept: true},
		{name: "wiping, identity erased", record: `{"box_id":"b-1","state":"wiping"}`, pending: true, kept: true},
		{name: "wiped", record: `{"box_id":"b-1","state":"wiped","finished_at":"2026-11-24T10:00:00Z"}`, wiped: true, kept: true},
		{name: "wiped, enrolled since", record: `{"box_id":"b-1","state":"wiped"}`, identity: "b-2"},
		{name: "wiping, enrolled since", record: `{"box_id":"b-1","state":"wiping"}`, identity: "b-2"},
		{name: "unreadable record", record: `{"box_`, identity: "b-1", pending: true, kept: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if tc.record != "" {
				os.WriteFile(filepath.Join(dir, wipeFile), []byte(tc.record), 0o600)
			}
			if tc.identity != "" {
				writeJSON(filepath.Join(dir, identityFile), Identity{BoxID: tc.identity})
			}
			rec, err := pendingWipe(dir, slog.New(slog.DiscardHandler))
			if (rec != nil) != tc.pending {
				t.Errorf("pending %v, want %v", rec, tc.pending)
			}
			if errors.Is(err, ErrWiped) != tc.wiped || (err != nil && !tc.wiped) {
				t.Errorf("error %v, want wiped %v", err, tc.wiped)
			}
			if tc.wiped && (!strings.Contains(err.Error(), "b-1") || !strings.Contains(err.Error(), at.Format(time.RFC3339)) ||
				!strings.Contains(err.Error(), "edgebox-agent enroll")) {
				t.Errorf("the error does not say which box, when, and what to do: %v", err)
			}
			if _, err := os.Stat(filepath.Join(dir, wipeFile)); (err == nil) != tc.kept {
				t.Errorf("wipe.json kept: %v, want %v", err == nil, tc.kept)
			}
		})
	}
}
