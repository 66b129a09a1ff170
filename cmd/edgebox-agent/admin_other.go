//go:build !windows

package main

import (
	"errors"
	"os"
)

// needAdmin refuses to touch the system's services without root.
func needAdmin() error {
	if os.Geteuid() != 0 {
		return errors.New("installing services needs root: run it with sudo")
	}
	return nil
}
