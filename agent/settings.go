package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"

	"github.com/edgebox/edgebox/enroll"
)

// settingsFile holds what an operator set on the box itself (for now the
// proxy), so that the installed service runs as it was installed.
const settingsFile = "agent.json"

// Settings are the box-local settings in agent.json.
type Settings struct {
	// Proxy is an http(s):// URL, with user:password if the proxy wants
	// them, used for the tunnel and enrollment instead of HTTPS_PROXY.
	Proxy string `json:"proxy,omitempty"`
	// Consoles are the console's other addresses (host:port, at most 8):
	// its replicas, where no one name reaches them all. When set, they
	// replace those the enrollment token named. The box tries its
	// console's address and these in a random order.
	Consoles []string `json:"consoles,omitempty"`
}

// Validate reports what is wrong with s.
func (s Settings) Validate() error {
	if err := enroll.ValidateAlso(s.Consoles); err != nil {
		return fmt.Errorf("consoles: %w", err)
	}
	if s.Proxy == "" {
		return nil
	}
	u, err := url.Parse(s.Proxy)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		shown := s.Proxy
		if err == nil {
			shown = u.Redacted() // the password stays out of logs
		}
		return fmt.Errorf("proxy %q: give an http:// or https:// URL, e.g. http://user:pass@proxy:3128", shown)
	}
	return nil
}

// ProxySource names the proxy setting of agent.json in dir, as errors that
// ask the operator to correct it say it.
func ProxySource(dir string) string {
	return fmt.Sprintf("the \"proxy\" setting in %s", filepath.Join(dir, settingsFile))
}

// ProxyFunc returns the proxy to use for a request: the configured one, or
// HTTPS_PROXY/NO_PROXY from the environment.
func (s Settings) ProxyFunc() func(*url.URL) (*url.URL, error) {
	if s.Proxy == "" {
		return func(u *url.URL) (*url.URL, error) {
			return http.ProxyFromEnvironment(&http.Request{URL: u})
		}
	}
	p, _ := url.Parse(s.Proxy)
	return func(*url.URL) (*url.URL, error) { return p, nil }
}

// ReadSettings reads agent.json in dir; a missing file is empty settings.
func ReadSettings(dir string) (Settings, error) {
	var s Settings
	raw, err := os.ReadFile(filepath.Join(dir, settingsFile))
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	} else if err != nil {
		return s, err
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return s, fmt.Errorf("%s: %w", filepath.Join(dir, settingsFile), err)
	}
	return s, s.Validate()
}

// WriteSettings writes agent.json in dir (0600: the proxy URL may hold a
// password).
func WriteSettings(dir string, s Settings) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return writeJSON(filepath.Join(dir, settingsFile), s)
}
