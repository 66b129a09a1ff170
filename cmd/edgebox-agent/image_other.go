//go:build !linux

package main

import "github.com/spf13/cobra"

// imageCmd is Linux-only for now: images are containerd's.
func imageCmd(*string) *cobra.Command {
	return &cobra.Command{Use: "image", Short: "Manage container images (Linux boxes)", Hidden: true}
}
