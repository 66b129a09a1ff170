// Package installer will install the agent as a service (systemd unit or
// Windows service) and build its packages. Until it lands, the agent runs
// in the foreground with 'edgebox-agent run'.
package installer
