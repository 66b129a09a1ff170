package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgebox/edgebox/api"
)

// version is set by the build.
var version = "dev"

func newRoot() *cobra.Command {
	var output string
	root := &cobra.Command{
		Use:   "edgebox",
		Short: "Operate an edgebox console: boxes, enrollment tokens, apps and deploys, audit",
		Long: `edgebox talks to an edgebox console's API.

Log in once with the URL and CA hash the console printed at its first
start, as a user (--user) or with an API token (--token); the CLI keeps
them in $EDGEBOX_CONFIG (default: your config directory). EDGEBOX_TOKEN
overrides the stored token, EDGEBOX_TENANT the tenant commands act in.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.PersistentFlags().StringVarP(&output, "output", "o", "table", "table or json")
	out := func(cmd *cobra.Command, v any, table func(w io.Writer)) error {
		switch output {
		case "json":
			e := json.NewEncoder(cmd.OutOrStdout())
			e.SetIndent("", "  ")
			return e.Encode(v)
		case "table":
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			table(tw)
			return tw.Flush()
		default:
			return fmt.Errorf("--output %q: use table or json", output)
		}
	}
	root.AddCommand(loginCmd(), whoamiCmd(out), userCmd(out), tenantCmd(out), apiTokenCmd(out), tokenCmd(out), boxesCmd(out), auditCmd(out),
		appCmd(out), releaseCmd(out), deployCmd(out), undeployCmd(out), rolloutCmd(out), alertsCmd(out), agentCmd(out), statusCmd(out), logsCmd(), imageCmd(), keysCmd(out),
		execCmd(), shellCmd(), sessionsCmd(out), portForwardCmd(), cpCmd(), screenCmd())
	return root
}

type printer func(cmd *cobra.Command, v any, table func(w io.Writer)) error

func loginCmd() *cobra.Command {
	var o loginOpts
	c := &cobra.Command{
		Use:   "login URL --ca-sha256 HASH (--user NAME | --token TOKEN)",
		Short: "Log in to a console and keep its URL, CA and an API token for later commands",
		Long: `Log in to a console and keep its URL, its CA and an API token in
$EDGEBOX_CONFIG for later commands.

With --user, the CLI asks for the password (or reads EDGEBOX_PASSWORD, or a
line of standard input when it is not a terminal) and keeps a new API token
of that user, named cli@<this host>. With --token, it keeps that token.

--tenant picks the tenant later commands act in, for users who work in
several; EDGEBOX_TENANT overrides it for one command.`,
		Example: `  edgebox login https://console.example:8443 --ca-sha256 9f86d0… --user admin
  edgebox login https://console.example:8443 --ca-sha256 9f86d0… --token ebxa_…`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.url = args[0]
			if o.caHash == "" {
				return fmt.Errorf("--ca-sha256 is required (the console prints it at its first start)")
			}
			if (o.user == "") == (o.token == "") {
				return fmt.Errorf("give --user NAME (and its password) or --token TOKEN")
			}
			if o.user != "" {
				pw, err := readPassword(cmd, "password for "+o.user+": ", "EDGEBOX_PASSWORD")
				if err != nil {
					return err
				}
				o.pw = pw
			}
			me, err := login(cmd.Context(), o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "logged in to %s as %s, %s in tenant %s (config %s)\n", o.url, me.User, me.Role, me.Tenant, configPath())
			return nil
		},
	}
	c.Flags().StringVar(&o.token, "token", os.Getenv("EDGEBOX_TOKEN"), "API token")
	c.Flags().StringVar(&o.user, "user", "", "user name: log in with its password")
	c.Flags().StringVar(&o.ttl, "token-ttl", "", "with --user, how long the new token lasts (e.g. 720h; default: until revoked)")
	c.Flags().StringVar(&o.tenant, "tenant", "", "tenant later commands act in (default: the console's choice)")
	c.Flags().StringVar(&o.caHash, "ca-sha256", "", "SHA-256 of the console CA, as printed at its first start")
	return c
}

func parseLabels(args []string) (map[string]string, error) {
	m := map[string]string{}
	for _, a := range args {
		for _, kv := range strings.Split(a, ",") {
			if kv == "" {
				continue
			}
			if k, ok := strings.CutSuffix(kv, "-"); ok && !strings.Contains(kv, "=") {
				m[k] = "" // "key-" removes
				continue
			}
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, fmt.Errorf("label %q: use key=value, or key- to remove", kv)
			}
			m[k] = v
		}
	}
	return m, nil
}

func labelString(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + m[k]
	}
	return strings.Join(keys, ",")
}

func tokenCmd(out printer) *cobra.Command {
	c := &cobra.Command{Use: "token", Short: "Create, list and revoke enrollment tokens"}
	var req api.TokenRequest
	var labels []string
	var ttl time.Duration
	create := &cobra.Command{
		Use:   "create --region R --site S",
		Short: "Create an enrollment token and print the command to run on the box",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			if req.Labels, err = parseLabels(labels); err != nil {
				return err
			}
			req.TTL = ttl.String()
			t, err := cl.CreateToken(cmd.Context(), req)
			if err != nil {
				return err
			}
			return out(cmd, t, func(w io.Writer) {
				fmt.Fprintf(w, "token %s for %s/%s: %d use(s), expires %s\n", t.ID, t.Region, t.Site, t.Uses, t.ExpiresAt.Local().Format(time.RFC3339))
				if t.RequireApproval {
					fmt.Fprintln(w, "boxes enrolled with it wait for 'edgebox boxes approve'")
				}
				fmt.Fprintf(w, "\nOn a fresh Linux box (root shell; Ubuntu, Debian, CentOS):\n  %s\n", t.InstallLinux)
				fmt.Fprintf(w, "\nOn a fresh Windows box (PowerShell as administrator):\n  %s\n", t.InstallWindows)
				fmt.Fprintf(w, "\nOn a box that has the agent already:\n  %s\n", t.EnrollCommand)
			})
		},
	}
	create.Flags().StringVar(&req.Region, "region", "", "region of the boxes (required)")
	create.Flags().StringVar(&req.Site, "site", "", "site of the boxes (required)")
	create.Flags().DurationVar(&ttl, "ttl", 24*time.Hour, "how long the token stays valid")
	create.Flags().IntVar(&req.Uses, "uses", 1, "how many boxes may enroll with it")
	create.Flags().BoolVar(&req.RequireApproval, "approve", false, "boxes wait for an operator's approval")
	create.Flags().StringSliceVar(&labels, "labels", nil, "labels for the boxes, k=v,…")
	create.MarkFlagRequired("region")
	create.MarkFlagRequired("site")

	ls := &cobra.Command{
		Use: "ls", Short: "List enrollment tokens", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			ts, err := cl.Tokens(cmd.Context())
			if err != nil {
				return err
			}
			return out(cmd, ts, func(w io.Writer) {
				fmt.Fprintln(w, "ID\tREGION\tSITE\tUSED\tEXPIRES\tSTATE")
				for _, t := range ts {
					state := "valid"
					switch {
					case t.Revoked:
						state = "revoked"
					case time.Now().After(t.ExpiresAt):
						state = "expired"
					case t.Used >= t.Uses:
						state = "used up"
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%d/%d\t%s\t%s\n", t.ID, t.Region, t.Site, t.Used, t.Uses, t.ExpiresAt.Local().Format(time.RFC3339), state)
				}
			})
		},
	}
	revoke := &cobra.Command{
		Use: "revoke ID", Short: "Stop a token from enrolling more boxes", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			if err := cl.RevokeToken(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "token", args[0], "revoked")
			return nil
		},
	}
	c.AddCommand(create, ls, revoke)
	return c
}

// vitalsLine says a box's vitals in one line: "CPU 12% · memory 1.0 of
// 4.0 GiB · disk 10 of 100 GiB · 48 °C · up 3h0m0s (reported 20s ago)".
func vitalsLine(v *api.BoxVitals) string {
	gib := func(n uint64) string { return fmt.Sprintf("%.1f", float64(n)/(1<<30)) }
	parts := []string{fmt.Sprintf("CPU %.0f%%", v.CPUPercent)}
	if v.MemoryTotalBytes > 0 {
		parts = append(parts, "memory "+gib(v.MemoryUsedBytes)+" of "+gib(v.MemoryTotalBytes)+" GiB")
	}
	if v.DiskTotalBytes > 0 {
		parts = append(parts, "disk "+gib(v.DiskUsedBytes)+" of "+gib(v.DiskTotalBytes)+" GiB")
	}
	if v.TemperatureCelsius != 0 {
		parts = append(parts, fmt.Sprintf("%.0f °C", v.TemperatureCelsius))
	}
	if v.UptimeSeconds > 0 {
		parts = append(parts, "up "+(time.Duration(v.UptimeSeconds)*time.Second).String())
	}
	at := v.ReportedAt
	return strings.Join(parts, " · ") + " (reported " + ago(&at) + ")"
}

func ago(t *time.Time) string {
	if t == nil {
		return "never"
	}
	return time.Since(*t).Round(time.Second).String() + " ago"
}

func boxesCmd(out printer) *cobra.Command {
	c := &cobra.Command{Use: "boxes", Aliases: []string{"box"}, Short: "List, inspect, label, approve and revoke boxes"}
	table := func(w io.Writer, bs []api.Box) {
		fmt.Fprintln(w, "ID\tNAME\tREGION\tSITE\tSTATE\tONLINE\tLAST SEEN\tOS/ARCH\tAGENT\tLABELS")
		for _, b := range bs {
			online := "no"
			if b.Health != "" && b.Health != "online" {
				online = "no: " + b.Health // disconnected-running, down or unknown
			}
			if b.Online {
				online = "yes"
				if b.RTTMillis > 0 {
					online = fmt.Sprintf("yes (%.0fms)", b.RTTMillis)
				}
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s/%s\t%s\t%s\n", b.ID, b.Name, b.Region, b.Site, b.State, online,
				ago(b.LastSeen), b.OS, b.Arch, b.AgentVersion, labelString(b.Labels))
		}
	}
	ls := &cobra.Command{
		Use: "ls", Short: "List boxes", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			bs, err := cl.Boxes(cmd.Context())
			if err != nil {
				return err
			}
			return out(cmd, bs, func(w io.Writer) { table(w, bs) })
		},
	}
	one := func(use, short string, do func(cl *api.Client, cmd *cobra.Command, args []string) (api.Box, error)) *cobra.Command {
		return &cobra.Command{
			Use: use, Short: short, Args: cobra.MinimumNArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				cl, err := client()
				if err != nil {
					return err
				}
				b, err := do(cl, cmd, args)
				if err != nil {
					return err
				}
				return out(cmd, b, func(w io.Writer) {
					table(w, []api.Box{b})
					if b.HealthDetail != "" {
						fmt.Fprintf(w, "\nhealth: %s: %s\n", b.Health, b.HealthDetail)
					}
					if b.RanUntil != nil && !b.Online {
						fmt.Fprintf(w, "ran until: %s, as its site's votes show\n", b.RanUntil.Local().Format(time.DateTime))
					}
					if v := b.Vitals; v != nil {
						fmt.Fprintf(w, "\nvitals: %s\n", vitalsLine(v))
					}
				})
			},
		}
	}
	get := one("get BOX", "Show one box (by ID or name)", func(cl *api.Client, cmd *cobra.Command, a []string) (api.Box, error) {
		return cl.Box(cmd.Context(), a[0])
	})
	label := one("label BOX key=value… | key-…", "Set or remove labels", func(cl *api.Client, cmd *cobra.Command, a []string) (api.Box, error) {
		m, err := parseLabels(a[1:])
		if err != nil {
			return api.Box{}, err
		}
		if len(m) == 0 {
			return api.Box{}, fmt.Errorf("give at least one key=value or key-")
		}
		return cl.Label(cmd.Context(), a[0], m)
	})
	approve := one("approve BOX", "Let a box out of the waiting room", func(cl *api.Client, cmd *cobra.Command, a []string) (api.Box, error) {
		return cl.Approve(cmd.Context(), a[0])
	})
	revoke := revokeCmd(out, table)
	c.AddCommand(ls, get, label, approve, revoke, stateCmd(out), desiredCmd())
	return c
}

func auditCmd(out printer) *cobra.Command {
	c := &cobra.Command{Use: "audit", Short: "Read the audit log"}
	var limit int
	var target string
	ls := &cobra.Command{
		Use: "ls", Short: "List the newest audit entries", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			es, err := cl.Audit(cmd.Context(), limit, target)
			if err != nil {
				return err
			}
			return out(cmd, es, func(w io.Writer) {
				fmt.Fprintln(w, "TIME\tACTOR\tACTION\tTARGET\tFROM\tRESULT\tDETAIL")
				for _, e := range es {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Time.Local().Format(time.RFC3339), e.Actor, e.Action, e.Target, e.Remote, e.Result, e.Detail)
				}
			})
		},
	}
	ls.Flags().IntVar(&limit, "limit", 50, "at most this many entries")
	ls.Flags().StringVar(&target, "target", "", "only entries about this box or token ID")
	c.AddCommand(ls)
	return c
}
