package main

import (
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
	return api.NewClient(c.Console, c.Token, []byte(c.CAPEM))
}

// login fetches the console's CA over a connection pinned to caHash, checks
// the token works, and stores all three.
func login(ctx context.Context, consoleURL, token, caHashHex string) error {
	u, err := enroll.ParseConsoleURL(consoleURL)
	if err != nil {
		return err
	}
	hb, err := hex.DecodeString(strings.TrimPrefix(strings.ToLower(caHashHex), "sha256:"))
	if err != nil || len(hb) != sha256.Size {
		return fmt.Errorf("--ca-sha256 must be the 64 hex digits the console printed at its first start")
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: enroll.PinnedTLS([32]byte(hb), u.Hostname()), Proxy: http.ProxyFromEnvironment}}
	base := "https://" + u.Host
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/ca", nil)
	resp, err := hc.Do(req)
	if err != nil {
		if errors.Is(err, enroll.ErrWrongConsole) {
			return fmt.Errorf("%s presented a CA other than %s; check the URL and the hash", consoleURL, caHashHex)
		}
		return fmt.Errorf("cannot reach %s: %w", consoleURL, err)
	}
	defer resp.Body.Close()
	caPEM, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return err
	}
	blk, _ := pem.Decode(caPEM)
	if blk == nil || sha256.Sum256(blk.Bytes) != [32]byte(hb) {
		return errors.New("the console served a CA that does not match --ca-sha256")
	}
	cl, err := api.NewClient(base, token, caPEM)
	if err != nil {
		return err
	}
	if _, err := cl.Boxes(ctx); err != nil {
		return fmt.Errorf("the console refused the token: %w", err)
	}
	return saveConfig(cliConfig{Console: base, Token: token, CAPEM: string(caPEM)})
}
