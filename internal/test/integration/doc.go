// Package integration holds the end-to-end scenarios of edgebox, run
// against a real console and real agents on loopback: once in process and
// once as the built binaries.
package integration
