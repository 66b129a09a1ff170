package main

import (
	"bytes"
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgebox/edgebox/agent"
)

func TestRunProxyChoice(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		flag      string
		agentJSON string // "" for no agent.json
		wantHost  string // "" for no proxy of our own (the environment's)
		wantUser  string
		wantFrom  string
		wantErr   string
	}{
		{name: "nothing set", wantFrom: ""},
		{name: "agent.json", agentJSON: `{"proxy":"http://a:pw@json.corp:3128"}`,
			wantHost: "json.corp:3128", wantUser: "a", wantFrom: `the "proxy" setting in `},
		{name: "--proxy alone", flag: "http://f:pw@flag.corp:8080",
			wantHost: "flag.corp:8080", wantUser: "f", wantFrom: "the --proxy flag"},
		{name: "--proxy overrides agent.json", flag: "http://f:pw@flag.corp:8080", agentJSON: `{"proxy":"http://a:pw@json.corp:3128"}`,
			wantHost: "flag.corp:8080", wantUser: "f", wantFrom: "the --proxy flag"},
		{name: "--proxy overrides a damaged agent.json", flag: "http://flag.corp:8080", agentJSON: `{"proxy":"json.corp"}`,
			wantHost: "flag.corp:8080", wantFrom: "the --proxy flag"},
		{name: "a damaged agent.json without --proxy", agentJSON: `{"proxy":"json.corp"}`,
			wantErr: "give an http:// or https:// URL"},
		{name: "--proxy without a scheme", flag: "proxy.corp:3128", wantErr: "give an http:// or https:// URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if tt.agentJSON != "" {
				if err := os.WriteFile(filepath.Join(dir, "agent.json"), []byte(tt.agentJSON), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			proxy, from, err := tunnelProxy(tt.flag, dir)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want an error saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(from, tt.wantFrom) || (tt.wantFrom == "") != (from == "") {
				t.Errorf("source %q, want %q", from, tt.wantFrom)
			}
			if tt.wantFrom != "" && strings.HasPrefix(tt.wantFrom, "the \"proxy\"") && from != agent.ProxySource(dir) {
				t.Errorf("source %q does not name %s", from, filepath.Join(dir, "agent.json"))
			}
			if tt.wantHost == "" {
				if proxy != nil {
					t.Fatal("a proxy of our own, want the tunnel's default (the environment)")
				}
				return
			}
			u, err := proxy(&url.URL{Scheme: "https", Host: "console.corp:8443"})
			if err != nil || u == nil || u.Host != tt.wantHost || u.User.Username() != tt.wantUser {
				t.Fatalf("proxy for the console: %v (%v), want %s with user %q", u, err, tt.wantHost, tt.wantUser)
			}
		})
	}
}

// TestRunProxyFlagValidatedAsInstallIs runs 'edgebox-agent run --proxy' with
// values install refuses: run refuses them with install's words, before it
// starts anything (the data directory holds no box).
func TestRunProxyFlagValidatedAsInstallIs(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"proxy.corp:3128", "ftp://proxy.corp", "http://", "socks5://u:secret@proxy:1080"} {
		t.Run(bad, func(t *testing.T) {
			t.Parallel()
			want := agent.Settings{Proxy: bad}.Validate()
			if want == nil {
				t.Fatalf("install accepts %q", bad)
			}
			root := newRoot()
			var out bytes.Buffer
			root.SetOut(&out)
			root.SetErr(&out)
			root.SetArgs([]string{"run", "--data", t.TempDir(), "--log-level", "error", "--proxy", bad})
			err := root.ExecuteContext(context.Background())
			if err == nil || err.Error() != want.Error() {
				t.Fatalf("run --proxy %q: got %v, want %v", bad, err, want)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Fatalf("the error shows the password: %v", err)
			}
		})
	}
}
