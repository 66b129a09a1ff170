package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// agentCmd is 'edgebox agent upload|ls|pin|unpin|pins': the agent's own
// releases, and which version each region, site or box runs.
func agentCmd(out printer) *cobra.Command {
	c := &cobra.Command{
		Use:   "agent",
		Short: "Release new versions of the box agent, and pin where they run",
		Long: `The agent updates itself: a box told to run another version fetches its
binary through its tunnel, checks the console's signature and digest, and runs
it on probation (10 minutes by default). A version that exits, hangs or cannot
reach the console in that time is stopped, the box goes back to the version it
ran, with no download, and it never tries that version again by itself.
Workloads keep running while the agent changes.

Move boxes in waves with a rollout of the app "edgebox-agent":
  edgebox rollout create edgebox-agent 1.4.0 1.5.0 --regions north,east`,
	}
	var files []string
	var probation string
	upload := &cobra.Command{
		Use:     "upload VERSION --file OS/ARCH=PATH ...",
		Short:   "Upload a new agent version's binaries (console admins)",
		Example: "  edgebox agent upload 1.5.0 --file linux/amd64=dist/edgebox-agent-linux-amd64 --file windows/amd64=dist/edgebox-agent-windows-amd64.exe",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(files) == 0 {
				return fmt.Errorf("give at least one --file OS/ARCH=PATH")
			}
			cl, err := client()
			if err != nil {
				return err
			}
			for _, f := range files {
				platform, path, ok := strings.Cut(f, "=")
				if !ok {
					return fmt.Errorf("--file %q: write OS/ARCH=PATH, as linux/amd64=./edgebox-agent", f)
				}
				fh, err := os.Open(path)
				if err != nil {
					return err
				}
				rel, err := cl.UploadAgentRelease(cmd.Context(), args[0], platform, probation, fh)
				fh.Close()
				if err != nil {
					return fmt.Errorf("%s: %w", platform, err)
				}
				b := rel.Binaries[platform]
				if err := out(cmd, rel, func(w io.Writer) {
					fmt.Fprintf(w, "agent %s for %s uploaded: %d bytes, sha256 %s, signed\n", rel.Version, platform, b.Size, b.SHA256)
				}); err != nil {
					return err
				}
			}
			return nil
		},
	}
	upload.Flags().StringArrayVar(&files, "file", nil, "a platform's binary, as OS/ARCH=PATH (repeat for each)")
	upload.Flags().StringVar(&probation, "probation", "", "how long boxes run the version on trial (default 10m)")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List agent releases",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			all, err := cl.AgentReleases(cmd.Context())
			if err != nil {
				return err
			}
			return out(cmd, all, func(w io.Writer) {
				fmt.Fprintln(w, "VERSION\tPLATFORMS\tPROBATION\tCREATED\tBY")
				for _, r := range all {
					var ps []string
					for p := range r.Binaries {
						ps = append(ps, p)
					}
					slices.Sort(ps)
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.Version, strings.Join(ps, ","), r.Probation, r.CreatedAt.Local().Format(time.DateTime), r.CreatedBy)
				}
			})
		},
	}
	var sf scopeFlags
	pin := &cobra.Command{
		Use:   "pin VERSION (--box B | --site S | --region R)",
		Short: "Run an agent version on a box, a site or a region at once (a rollout goes in waves)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			scope, target, err := sf.get()
			if err != nil {
				return err
			}
			cl, err := client()
			if err != nil {
				return err
			}
			if err := cl.PinAgent(cmd.Context(), args[0], scope, target); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "agent %s pinned on %s %s\n", args[0], scope, target)
			return nil
		},
	}
	sf.add(pin)
	var uf scopeFlags
	unpin := &cobra.Command{
		Use:   "unpin (--box B | --site S | --region R)",
		Short: "Remove an agent pin; its boxes follow a wider pin, or keep what they run",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			scope, target, err := uf.get()
			if err != nil {
				return err
			}
			cl, err := client()
			if err != nil {
				return err
			}
			if err := cl.UnpinAgent(cmd.Context(), scope, target); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "agent unpinned from %s %s\n", scope, target)
			return nil
		},
	}
	uf.add(unpin)
	pins := &cobra.Command{
		Use:   "pins",
		Short: "List where agent versions are pinned",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			all, err := cl.AgentPins(cmd.Context())
			if err != nil {
				return err
			}
			return out(cmd, all, func(w io.Writer) {
				fmt.Fprintln(w, "SCOPE\tTARGET\tVERSION\tAT\tBY")
				for _, p := range all {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", p.Scope, p.Target, p.Version, p.At.Local().Format(time.DateTime), p.By)
				}
			})
		},
	}
	c.AddCommand(upload, ls, pin, unpin, pins)
	return c
}
