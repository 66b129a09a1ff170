package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/enroll"
)

// cliConfig is what 'edgebox login' stores.
type cliConfig struct {
	Console string `json:"console"`
	Token   string `json:"token"`
	CAPEM   string `json:"ca_pem"`
	// Tenant is the tenant commands act in; empty: the console's choice.
	Tenant string `json:"tenant,omitempty"`
}

// configPath is $EDGEBOX_CONFIG or <user config dir>/edgebox/cli.json.
func configPath() string {
	if p := os.Getenv("EDGEBOX_CONFIG"); p != "" {
		return p
	}
	d, err := os.UserConfigDir()
	if err != nil {
		d = os.TempDir()
	}
	return filepath.Join(d, "edgebox", "cli.json")
}

func loadConfig() (cliConfig, error) {
	var c cliConfig
	raw, err := os.ReadFile(configPath())
	if errors.Is(err, os.ErrNotExist) {
		return c, fmt.Errorf("not logged in: run 'edgebox login URL --token TOKEN --ca-sha256 HASH' (config %s)", configPath())
	} else if err != nil {
		return c, err
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return c, fmt.Errorf("%s: %w", configPath(), err)
	}
	if v := os.Getenv("EDGEBOX_TOKEN"); v != "" {
		c.Token = v
	}
	if v := os.Getenv("EDGEBOX_TENANT"); v != "" {
		c.Tenant = v
	}
	return c, nil
}

func saveConfig(c cliConfig) error {
	p := configPath()
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	raw, _ := json.MarshalIndent(c, "", "  ")
	return os.WriteFile(p, append(raw, '\n'), 0o600)
}

func client() (*api.Client, error) {
	c, err := loadConfig()
	if err != nil {
		return nil, err
	}
	cl, err := api.NewClient(c.Console, c.Token, []byte(c.CAPEM))
	if err != nil {
		return nil, err
	}
	return cl.InTenant(c.Tenant), nil
}

// loginOpts are what 'edgebox login' was given: a token, or a user whose
// password makes one.
type loginOpts struct {
	url, caHash   string
	token         string
	user, pw, ttl string
	tenant        string
}

// login fetches the console's CA over a connection pinned to caHash, gets
// a token from the user's password when given a user, checks the token
// works, and stores the URL, the CA and the token.
func login(ctx context.Context, o loginOpts) (api.Me, error) {
	var me api.Me
	u, err := enroll.ParseConsoleURL(o.url)
	if err != nil {
		return me, err
	}
	hb, err := hex.DecodeString(strings.TrimPrefix(strings.ToLower(o.caHash), "sha256:"))
	if err != nil || len(hb) != sha256.Size {
		return me, fmt.Errorf("--ca-sha256 must be the 64 hex digits the console printed at its first start")
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: enroll.PinnedTLS([32]byte(hb), u.Hostname()), Proxy: http.ProxyFromEnvironment}}
	base := "https://" + u.Host
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/ca", nil)
	resp, err := hc.Do(req)
	if err != nil {
		if errors.Is(err, enroll.ErrWrongConsole) {
			return me, fmt.Errorf("%s presented a CA other than %s; check the URL and the hash", o.url, o.caHash)
		}
		if errors.Is(err, enroll.ErrNameMismatch) {
			return me, fmt.Errorf("%s is the console of that CA, but its certificate does not name %s: use a name it has, or start it with --host %s", o.url, u.Hostname(), u.Hostname())
		}
		return me, fmt.Errorf("cannot reach %s: %w", o.url, err)
	}
	defer resp.Body.Close()
	caPEM, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return me, err
	}
	blk, _ := pem.Decode(caPEM)
	if blk == nil || sha256.Sum256(blk.Bytes) != [32]byte(hb) {
		return me, errors.New("the console served a CA that does not match --ca-sha256")
	}
	token := o.token
	if o.user != "" {
		anon, err := api.NewClient(base, "", caPEM)
		if err != nil {
			return me, err
		}
		host, _ := os.Hostname()
		m, err := anon.Login(ctx, o.user, o.pw, "cli@"+cmp.Or(host, "unknown"), o.ttl)
		if err != nil {
			return me, fmt.Errorf("logging in as %s: %w", o.user, err)
		}
		token = m.Token
	}
	cl, err := api.NewClient(base, token, caPEM)
	if err != nil {
		return me, err
	}
	if me, err = cl.InTenant(o.tenant).Me(ctx); err != nil {
		return me, fmt.Errorf("the console refused the token: %w", err)
	}
	return me, saveConfig(cliConfig{Console: base, Token: token, CAPEM: string(caPEM), Tenant: o.tenant})
}
