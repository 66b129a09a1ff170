//go:build !linux

package usbhub

import "errors"

// mknodNull cannot make device nodes here: simulated keys' nodes are
// regular files.
func mknodNull(string) error { return errors.New("usbhub: no device nodes on this system") }
