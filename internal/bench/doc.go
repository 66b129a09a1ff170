// Package bench holds fleet-scale benchmarks: console memory per idle
// connected box and the reconnect storm after a console restart, measured
// with real agents against the built console binary.
package bench
