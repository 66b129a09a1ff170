package main

// runtimeFlags say where the box's runtimes are.
type runtimeFlags struct {
	containerd string // containerd's socket
	runcRoot   string // runc's state directory; empty is runc's default
}
