package locks

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLocksTakeRenewExpireAndSurviveARestart(t *testing.T) {
	now := time.Date(2026, 11, 24, 15, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	path := filepath.Join(t.TempDir(), "locks.json")
	s, err := Open(path, clock)
	if err != nil {
		t.Fatal(err)
	}
	if held, _ := s.Holding(); held {
		t.Fatal("a new set holds a lock")
	}
	if _, err := s.Take("robot", "signing a payment", 0); err != nil {
		t.Fatal(err)
	}
	held, why := s.Holding()
	if !held || !strings.Contains(why, "robot") || !strings.Contains(why, "signing a payment") {
		t.Fatalf("holding: %t %q", held, why)
	}
	// Kept on disk: an agent started again still holds it.
	s, err = Open(path, clock)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Held()) != 1 {
		t.Fatalf("after a restart: %v", s.Held())
	}
	now = now.Add(9 * time.Minute)
	if _, err := s.Take("robot", "still signing", 5*time.Minute); err != nil { // renewed
		t.Fatal(err)
	}
	now = now.Add(4 * time.Minute) // 13 min after it was taken
	if len(s.Held()) != 1 {
		t.Fatal("a renewed lock expired at its first time")
	}
	now = now.Add(2 * time.Minute)
	if held, _ := s.Holding(); held {
		t.Fatal("an expired lock still holds the box")
	}
	if err := s.Release("robot"); err == nil {
		t.Error("an expired lock was released")
	}
	for _, bad := range []struct {
		holder string
		ttl    time.Duration
	}{{"Robot!", time.Minute}, {"robot", 2 * time.Hour}, {"robot", time.Millisecond}, {strings.Repeat("a", 70), time.Minute}} {
		if _, err := s.Take(bad.holder, "", bad.ttl); err == nil {
			t.Errorf("Take(%q, %s) was let through", bad.holder, bad.ttl)
		}
	}
	if _, err := s.Take("robot", strings.Repeat("x", 300), time.Minute); err == nil {
		t.Error("a 300-byte reason was let through")
	}
	for i := range MaxLocks {
		if _, err := s.Take("w"+string(rune('a'+i/26))+string(rune('a'+i%26)), "", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Take("one-more", "", time.Minute); err == nil {
		t.Errorf("lock %d was let through", MaxLocks+1)
	}
	os.WriteFile(path, []byte("{not json"), 0o600)
	if s, err := Open(path, clock); err == nil || len(s.Held()) != 0 {
		t.Errorf("a damaged file: %v, %d locks", err, len(s.Held()))
	}
}

// TestLocalAPIOverItsSocket takes, lists and releases a lock as a
// workload does, over the real unix socket, and refuses bad requests.
func TestLocalAPIOverItsSocket(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(filepath.Join(dir, "locks.json"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, addr, err := Listen(filepath.Join(dir, "api"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, ln, s, slog.New(slog.DiscardHandler)) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	sock := strings.TrimPrefix(addr, "unix://")
	if st, err := os.Stat(sock); err != nil || st.Mode().Perm() != 0o666 {
		t.Fatalf("socket %s: %v %v", sock, st.Mode(), err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	do := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://agent"+path, bytes.NewBufferString(body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := do("PUT", "/v1/locks/robot", `{"reason":"signing","ttl_seconds":120}`); code != 200 || !strings.Contains(body, `"holder":"robot"`) {
		t.Fatalf("take: %d %s", code, body)
	}
	code, body := do("GET", "/v1/locks", "")
	var l List
	if code != 200 || json.Unmarshal([]byte(body), &l) != nil || len(l.Locks) != 1 || l.Locks[0].Reason != "signing" {
		t.Fatalf("list: %d %s", code, body)
	}
	for _, bad := range []struct{ method, path, body string }{
		{"PUT", "/v1/locks/robot", `{"ttl_seconds":999999}`},
		{"PUT", "/v1/locks/robot", `{"what":1}`},
		{"PUT", "/v1/locks/Bad_Name", `{}`},
		{"PUT", "/v1/locks/robot", strings.Repeat("x", 10000)},
	} {
		if code, body := do(bad.method, bad.path, bad.body); code != 400 {
			t.Errorf("%s %s %.40q: %d %s, want 400", bad.method, bad.path, bad.body, code, body)
		}
	}
	if code, _ := do("DELETE", "/v1/locks/robot", ""); code != 204 {
		t.Errorf("release: %d", code)
	}
	if code, _ := do("DELETE", "/v1/locks/robot", ""); code != 404 {
		t.Errorf("second release: %d", code)
	}
	select {
	case <-s.Changed():
	default:
		t.Error("no change signalled")
	}
}
