package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgebox/edgebox/api"
)

// appCmd is 'edgebox app create|ls|rm'.
func appCmd(out printer) *cobra.Command {
	c := &cobra.Command{Use: "app", Short: "Manage apps: what operators deploy to boxes"}
	var description string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Add an app; give it releases with 'edgebox release create'",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			a, err := cl.CreateApp(cmd.Context(), args[0], description)
			if err != nil {
				return err
			}
			return out(cmd, a, func(w io.Writer) { fmt.Fprintf(w, "app %s created\n", a.Name) })
		},
	}
	create.Flags().StringVar(&description, "description", "", "what the app does")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List apps",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			all, err := cl.Apps(cmd.Context())
			if err != nil {
				return err
			}
			return out(cmd, all, func(w io.Writer) {
				fmt.Fprintln(w, "NAME\tCREATED\tBY\tDESCRIPTION")
				for _, a := range all {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", a.Name, a.CreatedAt.Local().Format(time.DateTime), a.CreatedBy, a.Description)
				}
			})
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove an app and its releases; it must be deployed nowhere",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			if err := cl.DeleteApp(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "app %s removed\n", args[0])
			return nil
		},
	}
	c.AddCommand(create, ls, rm)
	return c
}

// releaseCmd is 'edgebox release create|ls'.
func releaseCmd(out printer) *cobra.Command {
	c := &cobra.Command{Use: "release", Short: "Manage an app's immutable releases"}
	var app, cpu, memory string
	var spec api.ReleaseSpec
	var probe api.Probe
	var probeExec string
	var ports, publish, keys, vols []string
	create := &cobra.Command{
		Use:   "create --app APP --version VERSION --image REF",
		Short: "Add a release; a tag is resolved to its digest now",
		Long: `Add an immutable release to an app. For containerd and qemu the image must be
in the console's registry (push it with docker, crane or oras using your API
token); its tag is resolved to a digest now, so every box runs the same bytes.
For the process runtime, --image is the program's path on the box.

Containers and VMs get edgebox's bridge on the box, with NAT for outbound
traffic and DNS from the box's resolvers; --network picks another, --publish
makes a port reachable on the box, and --egress limits where the workload may
connect (a process runs on the box's own network and takes none of these).
The console refuses a malformed setting when the release is created; what
only the box can know (a host port another program holds) shows in
'edgebox status APP'.`,
		Example: `  edgebox release create --app clock --version 1.0.0 --image console.example:8443/robots/clock:1.0.0 \
      --env TZ=Asia/Shanghai --cpu 500m --memory 256Mi
  edgebox release create --app statements --version 2.1.0 --image console.example:8443/robots/statements:2.1.0 \
      --publish 8080:80 --egress bank.example.com --egress 203.0.113.0/24 --proxy-env
  edgebox release create --app win-robot --version 1.0 --runtime qemu --image console.example:8443/vms/win:1.0 \
      --network user --publish 127.0.0.1:3389:3389`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if app == "" || spec.Version == "" || spec.Image == "" {
				return errors.New("--app, --version and --image are required")
			}
			var err error
			if spec.CPUMillis, err = parseCPU(cpu); err != nil {
				return err
			}
			if spec.MemoryBytes, err = parseBytes(memory); err != nil {
				return err
			}
			if probeExec != "" {
				probe.Exec = strings.Fields(probeExec)
			}
			if len(probe.Exec) > 0 || probe.HTTP != "" || probe.TCP != "" {
				spec.Probes = []api.Probe{probe}
			}
			for _, v := range vols {
				vol, err := parseVolume(v)
				if err != nil {
					return err
				}
				spec.Volumes = append(spec.Volumes, vol)
			}
			for _, p := range ports {
				port, err := parsePort(p)
				if err != nil {
					return err
				}
				spec.Ports = append(spec.Ports, port)
			}
			for _, p := range publish {
				port, err := parsePublish(p)
				if err != nil {
					return err
				}
				spec.Ports = append(spec.Ports, port)
			}
			for _, k := range keys {
				labels, err := parseLabels([]string{k})
				if err != nil {
					return fmt.Errorf("--key %q: %v", k, err)
				}
				spec.Keys = append(spec.Keys, api.KeyNeed{Labels: labels})
			}
			cl, err := client()
			if err != nil {
				return err
			}
			r, err := cl.CreateRelease(cmd.Context(), app, spec)
			if err != nil {
				return err
			}
			return out(cmd, r, func(w io.Writer) {
				fmt.Fprintf(w, "release %s@%s: %s\n", r.App, r.Version, r.Image)
				if n := networkSummary(r.ReleaseSpec); n != "" {
					fmt.Fprintf(w, "  %s\n", n)
				}
			})
		},
	}
	f := create.Flags()
	f.StringVar(&app, "app", "", "the app")
	f.StringVar(&spec.Version, "version", "", "the release's version, e.g. 1.2.0")
	f.StringVar(&spec.Image, "image", "", "image reference in the console's registry (tag or digest)")
	f.StringVar(&spec.Runtime, "runtime", "containerd", "containerd, qemu or process")
	f.StringArrayVar(&spec.Env, "env", nil, "NAME=value, repeatable")
	f.StringArrayVar(&spec.Args, "arg", nil, "argument replacing the image's command, repeatable")
	f.StringVar(&cpu, "cpu", "", "CPU limit: 500m or 1.5")
	f.StringVar(&memory, "memory", "", "memory limit: 256Mi, 1Gi")
	f.StringVar(&spec.Restart, "restart", "", "always (default), on-failure or never")
	f.StringVar(&probe.HTTP, "probe-http", "", "health probe: a URL the box reaches, 2xx/3xx is healthy")
	f.StringVar(&probe.TCP, "probe-tcp", "", "health probe: a host:port the box can connect to")
	f.StringVar(&probeExec, "probe-exec", "", "health probe: a command run inside the container, exit 0 is healthy")
	f.Uint32Var(&probe.PeriodSeconds, "probe-period", 0, "seconds between probes (default 10)")
	f.Uint32Var(&probe.TimeoutSeconds, "probe-timeout", 0, "seconds a probe may take (default 1)")
	f.Uint32Var(&probe.FailureThreshold, "probe-failures", 0, "failures in a row that make it unhealthy (default 3)")
	f.StringArrayVar(&ports, "port", nil, "a port the app serves, not published on the box: 8080 or 8080/udp, repeatable")
	f.StringVar(&spec.Network, "network", "", networkHelp)
	f.StringArrayVar(&publish, "publish", nil, publishHelp)
	f.StringArrayVar(&spec.Egress, "egress", nil, egressHelp)
	f.BoolVar(&spec.ProxyEnv, "proxy-env", false, proxyEnvHelp)
	f.BoolVar(&spec.KeysHoldUpdates, "keys-hold-updates", false, "while a process on the box has one of the app's leased UKEYs open, do not update the box (rollouts wait; no key is cut mid-use)")
	f.StringArrayVar(&vols, "volume", nil, "a box-local volume kept across releases: name:/path[:ro], repeatable")
	f.StringArrayVar(&keys, "key", nil, "a UKEY the app needs, by labels: bank=ICBC[,company=acme], repeatable")
	f.BoolVar(&spec.KeepState, "keep-state", false, "qemu: keep the VM's disk changes across restarts (default: every start is clean)")
	ls := &cobra.Command{
		Use:   "ls APP",
		Short: "List an app's releases, oldest first",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			rels, err := cl.Releases(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return out(cmd, rels, func(w io.Writer) {
				fmt.Fprintln(w, "VERSION\tRUNTIME\tIMAGE\tTAG\tCREATED")
				for _, r := range rels {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.Version, r.Runtime, r.Image, r.Tag, r.CreatedAt.Local().Format(time.DateTime))
				}
			})
		},
	}
	c.AddCommand(create, ls)
	return c
}

// scopeFlags are --box, --site and --region, exactly one of them.
type scopeFlags struct{ box, site, region string }

func (s *scopeFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&s.box, "box", "", "one box, by ID or name (overrides site and region)")
	c.Flags().StringVar(&s.site, "site", "", "every box of a site (overrides region)")
	c.Flags().StringVar(&s.region, "region", "", "every box of a region")
}

func (s scopeFlags) get() (scope, target string, err error) {
	n := 0
	for _, v := range []string{s.box, s.site, s.region} {
		if v != "" {
			n++
		}
	}
	if n != 1 {
		return "", "", errors.New("give exactly one of --box, --site or --region")
	}
	switch {
	case s.box != "":
		return "box", s.box, nil
	case s.site != "":
		return "site", s.site, nil
	}
	return "region", s.region, nil
}

// deployCmd is 'edgebox deploy APP@VERSION --box|--site|--region'.
func deployCmd(out printer) *cobra.Command {
	var sf scopeFlags
	c := &cobra.Command{
		Use:   "deploy APP@VERSION (--box B | --site S | --region R)",
		Short: "Run a release on a box, a site or a region",
		Long: `Pin an app's release on a box, site or region. Each box runs the release of
its own pin, else its site's, else its region's; boxes that join a pinned
site or region later get the app with nothing more to do. Follow progress
with 'edgebox status APP'.`,
		Example: "  edgebox deploy clock@1.0.0 --region east\n  edgebox deploy clock@1.0.1 --box shop-7",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			app, version, ok := strings.Cut(args[0], "@")
			if !ok || app == "" || version == "" {
				return fmt.Errorf("%q: write APP@VERSION", args[0])
			}
			scope, target, err := sf.get()
			if err != nil {
				return err
			}
			cl, err := client()
			if err != nil {
				return err
			}
			r, err := cl.Deploy(cmd.Context(), app, version, scope, target)
			if err != nil {
				return err
			}
			return out(cmd, r, func(w io.Writer) {
				fmt.Fprintf(w, "%s@%s pinned on %s %s; %d boxes get new desired state\n", app, version, r.Pin.Scope, r.Pin.Target, len(r.Changed))
				problems(w, r.Problems)
			})
		},
	}
	sf.add(c)
	return c
}

// undeployCmd is 'edgebox undeploy APP --box|--site|--region'.
func undeployCmd(out printer) *cobra.Command {
	var sf scopeFlags
	c := &cobra.Command{
		Use:   "undeploy APP (--box B | --site S | --region R)",
		Short: "Remove an app's pin; its boxes fall back to a wider pin or stop the app",
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
			r, err := cl.Undeploy(cmd.Context(), args[0], scope, target)
			if err != nil {
				return err
			}
			return out(cmd, r, func(w io.Writer) {
				fmt.Fprintf(w, "%s unpinned from %s %s; %d boxes get new desired state\n", args[0], scope, target, len(r.Changed))
				problems(w, r.Problems)
			})
		},
	}
	sf.add(c)
	return c
}

// statusCmd is 'edgebox status APP'.
func statusCmd(out printer) *cobra.Command {
	return &cobra.Command{
		Use:   "status APP",
		Short: "Show, per box, the release an app should run, the one it runs, how it is, and its address and published ports",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			s, err := cl.AppStatus(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return out(cmd, s, func(w io.Writer) { appStatusTable(w, s) })
		},
	}
}

// logsCmd is 'edgebox logs BOX WORKLOAD'.
func logsCmd() *cobra.Command {
	var tail int
	c := &cobra.Command{
		Use:   "logs BOX WORKLOAD",
		Short: "Print the last lines a workload wrote on a box (an app's workload is named for the app)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			l, err := cl.Logs(cmd.Context(), args[0], args[1], tail)
			if err != nil {
				return err
			}
			if l.Truncated {
				fmt.Fprintln(cmd.ErrOrStderr(), "(only the last MiB is shown)")
			}
			_, err = io.WriteString(cmd.OutOrStdout(), l.Text)
			return err
		},
	}
	c.Flags().IntVar(&tail, "tail", 200, "lines to show, at most 10000")
	return c
}

// problems prints what a deploy could not do yet.
func problems(w io.Writer, ps []string) {
	if len(ps) == 0 {
		return
	}
	fmt.Fprintln(w, "not done yet (the console tries again every minute):")
	for _, p := range ps {
		fmt.Fprintln(w, "  "+p)
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// parseCPU reads "500m" (thousandths) or "1.5" (CPUs).
func parseCPU(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	if m, ok := strings.CutSuffix(s, "m"); ok {
		n, err := strconv.ParseInt(m, 10, 64)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("--cpu %q: write 500m or 1.5", s)
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= 0 || f > 1024 {
		return 0, fmt.Errorf("--cpu %q: write 500m or 1.5", s)
	}
	return int64(f * 1000), nil
}

// parseBytes reads 256Mi, 1Gi, 512Ki or a plain number of bytes.
func parseBytes(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	mult := int64(1)
	for suffix, m := range map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30} {
		if v, ok := strings.CutSuffix(s, suffix); ok {
			s, mult = v, m
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > (1<<50)/mult {
		return 0, fmt.Errorf("memory %q: write 256Mi, 1Gi or a number of bytes", s)
	}
	return n * mult, nil
}

// parseVolume reads name:/path or name:/path:ro.
func parseVolume(s string) (api.Volume, error) {
	name, rest, ok := strings.Cut(s, ":")
	if !ok || name == "" || !strings.HasPrefix(rest, "/") {
		return api.Volume{}, fmt.Errorf("--volume %q: write name:/path or name:/path:ro", s)
	}
	v := api.Volume{Name: name, Path: rest}
	if p, ok := strings.CutSuffix(rest, ":ro"); ok {
		v.Path, v.ReadOnly = p, true
	}
	return v, nil
}

// parsePort reads 8080, 8080/tcp or 53/udp.
func parsePort(s string) (api.Port, error) {
	num, proto, _ := strings.Cut(s, "/")
	n, err := strconv.ParseUint(num, 10, 16)
	if err != nil || n == 0 {
		return api.Port{}, fmt.Errorf("--port %q: write 8080 or 8080/udp", s)
	}
	return api.Port{Port: uint16(n), Protocol: proto}, nil
}
