package main

import (
	"errors"

	"golang.org/x/sys/windows"
)

// needAdmin refuses to touch the system's services without an elevated
// token.
func needAdmin() error {
	if !windows.GetCurrentProcessToken().IsElevated() {
		return errors.New("installing services needs an administrator: run it from an elevated PowerShell")
	}
	return nil
}
