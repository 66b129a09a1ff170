package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgebox/edgebox/api"
)

// rolloutCmd is 'edgebox rollout create|ls|show|pause|resume|abort|approve|rules'.
func rolloutCmd(out printer) *cobra.Command {
	c := &cobra.Command{
		Use:   "rollout",
		Short: "Move boxes from one release of an app to another, in waves, region by region",
		Long: `A rollout moves the boxes of some regions (one after another), a site, the
boxes with some labels, or a list of boxes, from one release of an app to
another. Each region goes in waves (by default 1 box, then 10 %, 50 % and
100 %); a wave's boxes must run the new release healthy for the gate time
before the next wave starts. A box that fails goes back to the old release
from its own cache; past the failure threshold the rollout stops. Boxes
wait while their maintenance window is closed ('edgebox rollout rules').`,
	}
	c.AddCommand(rolloutCreateCmd(out), rolloutLsCmd(out), rolloutShowCmd(out),
		rolloutActionCmd(out, "pause", "Start no more boxes; those updating finish"),
		rolloutActionCmd(out, "resume", "Take a paused rollout on"),
		rolloutActionCmd(out, "abort", "End a rollout; with --revert, send every box it moved back"),
		rolloutActionCmd(out, "approve", "Give the approval a rollout waits for (not its creator's)"),
		rolloutRulesCmd(out))
	return c
}

func rolloutCreateCmd(out printer) *cobra.Command {
	var q api.RolloutRequest
	var regions, selector string
	var failure float64
	c := &cobra.Command{
		Use:   "create APP FROM TO (--regions R1,R2,... | --site S | --selector k=v,... | --boxes B1,B2,...)",
		Short: "Start a rollout of APP from release FROM to release TO",
		Example: `  edgebox rollout create clock 1.0.0 1.1.0 --regions north,east,south
  edgebox rollout create clock 1.0.0 1.1.0 --site shop-7 --gate 10m
  edgebox rollout create clock 1.0.0 1.1.0 --selector tier=pilot --waves 1,100%`,
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			q.App, q.From, q.To = args[0], args[1], args[2]
			if regions != "" {
				q.Regions = splitList(regions)
			}
			if selector != "" {
				l, err := parseLabels(splitList(selector))
				if err != nil {
					return err
				}
				q.Selector = l
			}
			if cmd.Flags().Changed("failure-percent") {
				q.FailurePercent = &failure
			}
			cl, err := client()
			if err != nil {
				return err
			}
			r, err := cl.CreateRollout(cmd.Context(), q)
			if err != nil {
				return err
			}
			return out(cmd, r, func(w io.Writer) {
				fmt.Fprintf(w, "rollout %s created: %s@%s to %s on %s, %d boxes, %s\n", r.ID, r.App, r.From, r.To, r.Scope, r.Progress.Total, r.State)
				if len(r.Skipped) > 0 {
					fmt.Fprintf(w, "%d boxes of the scope left alone ('edgebox rollout show %s' says why)\n", len(r.Skipped), r.ID)
				}
			})
		},
	}
	f := c.Flags()
	f.StringVar(&regions, "regions", "", "regions, comma-separated, taken in this order")
	f.StringVar(&q.Site, "site", "", "one site")
	f.StringVar(&selector, "selector", "", "boxes with these labels, as k=v,k=v")
	f.StringSliceVar(&q.Boxes, "boxes", nil, "boxes by ID, comma-separated")
	f.StringSliceVar(&q.Waves, "waves", nil, "cumulative wave sizes of each region, as 1,10%,50%,100% (the default)")
	f.StringVar(&q.Gate, "gate", "", "how long a wave's boxes must run healthy before the next wave (default 5m)")
	f.StringVar(&q.BoxTimeout, "box-timeout", "", "how long a box may take to run the new release healthy (default 15m)")
	f.IntVar(&q.MaxUnavailable, "max-unavailable", 0, "boxes of one site updating at once (default 1)")
	f.Float64Var(&failure, "failure-percent", 10, "stop when more than this share of a wave failed (any failure of the first wave stops it)")
	f.BoolVar(&q.RevertAll, "revert-all", false, "when the rollout stops, send every box it moved back, not only those that failed")
	return c
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func rolloutLsCmd(out printer) *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List rollouts, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			all, err := cl.Rollouts(cmd.Context())
			if err != nil {
				return err
			}
			return out(cmd, all, func(w io.Writer) {
				fmt.Fprintln(w, "ID\tAPP\tFROM\tTO\tSCOPE\tSTATE\tPROGRESS\tCREATED\tBY")
				for _, r := range all {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.App, r.From, r.To, r.Scope, r.State,
						progress(r.Progress), r.CreatedAt.Local().Format(time.DateTime), r.CreatedBy)
				}
			})
		},
	}
}

// progress sums a rollout's boxes up: "12/40 done, 1 failed".
func progress(p api.RolloutProgress) string {
	s := fmt.Sprintf("%d/%d done", p.Done, p.Total)
	for _, x := range []struct {
		n    int
		what string
	}{{p.Updating + p.Gating, "updating"}, {p.Held, "held"}, {p.Failed, "failed"}} {
		if x.n > 0 {
			s += fmt.Sprintf(", %d %s", x.n, x.what)
		}
	}
	return s
}

func rolloutShowCmd(out printer) *cobra.Command {
	var all bool
	c := &cobra.Command{
		Use:   "show ID",
		Short: "Show a rollout: its state, its groups and waves, and each box's phase and why it waits or failed",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			r, err := cl.Rollout(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return out(cmd, r, func(w io.Writer) { rolloutTable(w, r, all) })
		},
	}
	c.Flags().BoolVar(&all, "all", false, "list boxes whose wave has not started too")
	return c
}

func rolloutTable(w io.Writer, r api.Rollout, all bool) {
	fmt.Fprintf(w, "rollout %s: %s@%s to %s on %s\n", r.ID, r.App, r.From, r.To, r.Scope)
	state := r.State
	if r.Reason != "" {
		state += " (" + r.Reason + ")"
	}
	fmt.Fprintf(w, "state: %s\nprogress: %s\n", state, progress(r.Progress))
	if p := r.Prefetch; p != nil {
		fmt.Fprintf(w, "pre-pull of %s: %d of %d boxes have it on disk", p.Image, p.OnDisk, p.Asked)
		if p.Failed > 0 {
			fmt.Fprintf(w, ", %d failed", p.Failed)
		}
		fmt.Fprintln(w)
	}
	s := r.Settings
	fmt.Fprintf(w, "waves %s, gate %s, box timeout %s, at most %d per site, stop past %g %% of a wave\n",
		strings.Join(s.Waves, ","), s.Gate, s.BoxTimeout, s.MaxUnavailable, s.FailurePercent)
	for _, a := range r.Approvals {
		fmt.Fprintf(w, "approved (%s) by %s at %s\n", a.Stage, a.By, a.At.Local().Format(time.DateTime))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "GROUP\tWAVE\tBOX\tSITE\tPHASE\tSINCE\tWHY")
	for gi, g := range r.Groups {
		for _, b := range g.Boxes {
			if !all && b.Phase == "waiting" && (gi > r.Group || b.Wave > g.Wave) {
				continue
			}
			phase := b.Phase
			if b.Reverted {
				phase += ", back on " + r.From
			}
			since := ""
			if !b.Since.IsZero() {
				since = b.Since.Local().Format(time.TimeOnly)
			}
			fmt.Fprintf(w, "%s\t%d/%d\t%s\t%s\t%s\t%s\t%s\n", g.Name, b.Wave+1, g.Waves, b.ID, b.Site, phase, since, b.Reason)
		}
	}
	for _, sk := range r.Skipped {
		fmt.Fprintf(w, "-\t-\t%s\t-\tleft alone\t\t%s\n", sk.Box, sk.Reason)
	}
}

func rolloutActionCmd(out printer, action, short string) *cobra.Command {
	var a api.RolloutAction
	c := &cobra.Command{
		Use:   action + " ID",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			r, err := cl.RolloutDo(cmd.Context(), args[0], action, a)
			if err != nil {
				return err
			}
			return out(cmd, r, func(w io.Writer) {
				msg := r.State
				if r.Reason != "" {
					msg += ": " + r.Reason
				}
				fmt.Fprintf(w, "rollout %s is %s\n", r.ID, msg)
			})
		},
	}
	switch action {
	case "pause":
		c.Flags().StringVar(&a.Reason, "reason", "", "why, for the others")
	case "abort":
		c.Flags().BoolVar(&a.Revert, "revert", false, "send every box the rollout moved back to the release it ran before")
	}
	return c
}

func rolloutRulesCmd(out printer) *cobra.Command {
	return rulesCmd(out, rulesSpec[api.RolloutRules]{
		short: "Show or set the tenant's rollout rules: approvals and maintenance windows",
		long: `Replace the tenant's rollout rules. The file is JSON such as:

  {
    "approve_start": true,
    "regions": {
      "north": {"zone": "Asia/Shanghai",
                "deny": [{"days": "workdays", "from": "15:00", "to": "17:30"}]}
    },
    "sites": {
      "branch-7": {"zone": "Asia/Shanghai",
                   "allow": [{"days": "every-day", "from": "22:00", "to": "06:00"}]}
    },
    "calendar": {"holidays": ["2026-10-01"], "extra_workdays": ["2026-09-27"]}
  }

A box follows its site's policy where there is one, else its region's.
"workdays" are Monday to Friday less the holidays, plus the extra
workdays. A policy that never opens within 14 days is refused.`,
		get: (*api.Client).RolloutRules,
		set: (*api.Client).SetRolloutRules,
		said: func(r api.RolloutRules) string {
			return fmt.Sprintf("rollout rules set: %d region and %d site policies", len(r.Regions), len(r.Sites))
		},
	})
}
