// Package bench holds the benchmarks that need a whole console and real
// agents: console memory per idle connected box and the reconnect storm
// after a console restart, Sync latency, image pulls through the tunnel
// against direct TLS, and deploy-to-running with a real containerd.
package bench
