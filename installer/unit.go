package installer

import (
	"fmt"
	"strings"

	"github.com/edgebox/edgebox/agent"
)

// SystemdUnit is the agent's systemd unit for l: restarted on any exit
// after 5 s but that of a wiped box (agent.ExitWiped), never given up on,
// started once the network is up.
func SystemdUnit(l Layout) string {
	return fmt.Sprintf(`[Unit]
Description=edgebox agent: this box's tunnel to its console
Documentation=https://github.com/edgebox/edgebox
Wants=network-online.target
After=network-online.target
StartLimitIntervalSec=0

[Service]
Type=simple
ExecStart=%s run --data %s
Restart=always
RestartSec=5
# A box its console wiped has no identity left: it exits with this status
# and waits for a new enrollment instead of being started again and again.
RestartPreventExitStatus=%d
KillSignal=SIGTERM
TimeoutStopSec=60
# The box's key lives in the data directory: only root reads it.
UMask=0077
LimitNOFILE=65536

[Install]
WantedBy=multi-user.target
`, systemdQuote(l.Bin), systemdQuote(l.DataDir), agent.ExitWiped)
}

// systemdQuote quotes a path for ExecStart when it needs it.
func systemdQuote(s string) string {
	if !strings.ContainsAny(s, " \t\"'\\") {
		return s
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
