package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWorkloadProxy: workloads that ask for the box's proxy get --proxy,
// else agent.json's, else the agent's HTTPS_PROXY; never something that
// is not a proxy URL.
func TestWorkloadProxy(t *testing.T) {
	tests := []struct {
		name      string
		flag      string
		agentJSON string
		env       string
		want      string
	}{
		{name: "nothing set"},
		{name: "the environment", env: "http://env.corp:3128", want: "http://env.corp:3128"},
		{name: "agent.json over the environment", agentJSON: `{"proxy":"http://a:pw@json.corp:3128"}`, env: "http://env.corp:3128",
			want: "http://a:pw@json.corp:3128"},
		{name: "--proxy over all", flag: "https://flag.corp:8443", agentJSON: `{"proxy":"http://json.corp:3128"}`, env: "http://env.corp:3128",
			want: "https://flag.corp:8443"},
		{name: "a damaged agent.json", agentJSON: `{"proxy":"json.corp"}`, env: "http://env.corp:3128", want: "http://env.corp:3128"},
		{name: "not a URL", env: "env.corp:3128"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("HTTPS_PROXY", tt.env)
			t.Setenv("https_proxy", "")
			dir := t.TempDir()
			if tt.agentJSON != "" {
				if err := os.WriteFile(filepath.Join(dir, "agent.json"), []byte(tt.agentJSON), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if got := workloadProxy(tt.flag, dir); got != tt.want {
				t.Errorf("workloadProxy = %q, want %q", got, tt.want)
			}
		})
	}
}
