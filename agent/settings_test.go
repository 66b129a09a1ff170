package agent

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSettings(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if s, err := ReadSettings(dir); err != nil || s.Proxy != "" {
		t.Fatalf("no agent.json: %+v %v", s, err)
	}
	for _, bad := range []string{"proxy:3128", "ftp://proxy", "http://"} {
		if err := WriteSettings(dir, Settings{Proxy: bad}); err == nil {
			t.Errorf("proxy %q was accepted", bad)
		}
	}
	if err := WriteSettings(dir, Settings{Proxy: "http://u:p@proxy.corp:3128"}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, settingsFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("agent.json mode %v (%v): it may hold a proxy password", fi.Mode(), err)
	}
	s, err := ReadSettings(dir)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.ProxyFunc()(&url.URL{Scheme: "https", Host: "console:8443"})
	if err != nil || p.Host != "proxy.corp:3128" || p.User.Username() != "u" {
		t.Fatalf("proxy for the console: %v %v", p, err)
	}
	os.WriteFile(filepath.Join(dir, settingsFile), []byte("{"), 0o600)
	if _, err := ReadSettings(dir); err == nil {
		t.Fatal("a damaged agent.json was read")
	}
}

func TestSettingsErrorsNameTheSettingNotThePassword(t *testing.T) {
	t.Parallel()
	err := Settings{Proxy: "socks5://u:secret@proxy:1080"}.Validate()
	if err == nil || strings.Contains(err.Error(), "secret") || !strings.Contains(err.Error(), "socks5://u:xxxxx@proxy:1080") {
		t.Fatalf("got %v, want the URL shown without its password", err)
	}
	dir := t.TempDir()
	if got, want := ProxySource(dir), `the "proxy" setting in `+filepath.Join(dir, "agent.json"); got != want {
		t.Fatalf("ProxySource %q, want %q", got, want)
	}
}

func TestSettingsConsoles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, bad := range [][]string{{"console-b"}, {"https://console-b:8443"}, {"b:1", "c:2", "d:3", "e:4", "f:5", "g:6", "h:7", "i:8", "j:9"}} {
		if err := WriteSettings(dir, Settings{Consoles: bad}); err == nil {
			t.Errorf("consoles %q were accepted", bad)
		} else if !strings.HasPrefix(err.Error(), "consoles: ") {
			t.Errorf("%q: %v does not name the setting", bad, err)
		}
	}
	want := []string{"console-b.corp:8443", "10.1.2.3:8443"}
	if err := WriteSettings(dir, Settings{Consoles: want}); err != nil {
		t.Fatal(err)
	}
	s, err := ReadSettings(dir)
	if err != nil || strings.Join(s.Consoles, " ") != strings.Join(want, " ") {
		t.Fatalf("read back %q (%v), want %q", s.Consoles, err, want)
	}
}
