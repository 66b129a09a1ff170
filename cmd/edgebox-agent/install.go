package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgebox/edgebox/installer"
)

// layout is the standard layout with the data directory of --data. An
// agent installed by the .deb or .rpm (in /usr/bin) is its own installed
// binary.
func layout(dataDir string) installer.Layout {
	l := installer.DefaultLayout()
	l.DataDir = dataDir
	if exe, err := os.Executable(); err == nil && exe == "/usr/bin/edgebox-agent" {
		l.Bin = exe
	}
	return l
}

func installCmd(dataDir *string) *cobra.Command {
	var name, proxy string
	var labels []string
	var wait time.Duration
	c := &cobra.Command{
		Use:   "install TOKEN",
		Short: "Install this agent as a service, enroll the box and start it",
		Long: `Install puts this binary in the standard place for the OS, enrolls the box
with TOKEN (unless it is enrolled already), installs and starts the
edgebox-agent service (a systemd unit, a SysV script where there is no
systemd, or a Windows service that restarts on failure), and waits until
the box is online. Running it again is safe: it keeps the box's identity
and brings the binary and the service up to date.`,
		Example: `  sudo edgebox-agent install ebx1.… --name shop-12-robot --labels bank=icbc
  sudo edgebox-agent install ebx1.… --proxy http://user:pass@proxy.corp:3128`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := needAdmin(); err != nil {
				return err
			}
			m := map[string]string{}
			for _, kv := range labels {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return fmt.Errorf("--labels %q: use key=value", kv)
				}
				m[k] = v
			}
			tok := ""
			if len(args) == 1 {
				tok = args[0]
			}
			err := installer.Install(cmd.Context(), installer.Options{Layout: layout(*dataDir), Token: tok, Name: name,
				Labels: m, Proxy: proxy, Wait: wait, Out: cmd.OutOrStdout()})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "installed; 'edgebox-agent service status' and 'edgebox-agent status' show how it runs")
			return nil
		},
	}
	c.Flags().StringVar(&name, "name", "", "box name (default: the host name)")
	c.Flags().StringSliceVar(&labels, "labels", nil, "labels for the box besides the token's, k=v,…")
	c.Flags().StringVar(&proxy, "proxy", "", "proxy for the tunnel and enrollment, http:// or https:// (its certificate checked against the system roots or SSL_CERT_FILE), e.g. http://user:pass@proxy:3128 (default: HTTPS_PROXY)")
	c.Flags().DurationVar(&wait, "wait", 2*time.Minute, "how long to wait for the box to come online (0: do not wait)")
	return c
}

func uninstallCmd(dataDir *string) *cobra.Command {
	var purge bool
	c := &cobra.Command{
		Use:   "uninstall",
		Short: "Stop and remove the service and the installed binary",
		Long: `Uninstall stops and removes the edgebox-agent service and the installed
binary. The box's identity and state stay, so installing again brings the
same box back; --purge removes them too. Running it again is safe.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needAdmin(); err != nil {
				return err
			}
			return installer.Uninstall(layout(*dataDir), purge, cmd.OutOrStdout())
		},
	}
	c.Flags().BoolVar(&purge, "purge", false, "also remove the box's identity, keys, state and logs")
	return c
}

func serviceCmd(dataDir *string) *cobra.Command {
	c := &cobra.Command{Use: "service", Short: "Status, start, stop or restart the installed service"}
	for _, op := range []struct{ use, short string }{
		{"status", "Say whether the service is installed and running"},
		{"start", "Start the service"},
		{"stop", "Stop the service"},
		{"restart", "Restart the service"},
	} {
		c.AddCommand(&cobra.Command{
			Use: op.use, Short: op.short, Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				svc, err := installer.NewService(layout(*dataDir))
				if err != nil {
					return err
				}
				if op.use != "status" {
					if err := needAdmin(); err != nil {
						return err
					}
				}
				switch op.use {
				case "start":
					err = svc.Start()
				case "stop":
					err = svc.Stop()
				case "restart":
					err = svc.Restart()
				}
				if err != nil {
					return fmt.Errorf("%s: %w", op.use, err)
				}
				st, err := svc.Status()
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s (%s): %s\n", installer.ServiceName, svc.Platform(), st)
				return nil
			},
		})
	}
	return c
}
