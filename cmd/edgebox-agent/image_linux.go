package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/edgebox/edgebox/agent/runtime/containerd"
)

func imageCmd(dataDir *string) *cobra.Command {
	c := &cobra.Command{Use: "image", Short: "Manage the container images on this box"}
	var addr string
	imp := &cobra.Command{
		Use:   "import FILE",
		Short: "Load images from a docker-save or OCI archive (for boxes without a way to pull)",
		Example: `  docker save robot:1.2.0 -o robot.tar   # elsewhere
  sudo edgebox-agent image import robot.tar`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			d, err := containerd.New(containerd.Config{Address: addr, LogDir: filepath.Join(*dataDir, "logs")})
			if err != nil {
				return err
			}
			defer d.Close()
			names, err := d.Import(cmd.Context(), f)
			if err != nil {
				return err
			}
			for _, n := range names {
				fmt.Fprintln(cmd.OutOrStdout(), "imported", n)
			}
			return nil
		},
	}
	imp.Flags().StringVar(&addr, "containerd", "/run/containerd/containerd.sock", "containerd's socket")
	c.AddCommand(imp)
	return c
}
