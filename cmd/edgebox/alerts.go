package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgebox/edgebox/api"
)

// alertsCmd is 'edgebox alerts ls|rules|silence|silences|unsilence'.
func alertsCmd(out printer) *cobra.Command {
	c := &cobra.Command{
		Use:   "alerts",
		Short: "See the tenant's alerts; set its alert rules, webhooks and silences",
		Long: `The tenant's alert rules raise an incident for each thing that holds a
rule's condition for the rule's minutes: a box without a tunnel
(box-offline), one its site says is down (box-down), a UKEY stuck or broken
(key-broken), a workload whose probes fail or that failed
(workload-unhealthy), a rollout its failure policy stopped
(rollout-stopped), a box certificate near its end (cert-expiry).

Each incident is posted to the tenant's webhooks once when it fires and once
when it is resolved, tried again with back-off until a webhook takes it. A
silence keeps the incidents it matches from the webhooks until it ends.`,
	}
	c.AddCommand(alertsLsCmd(out), alertRulesCmd(out), silenceCmd(out), silencesCmd(out), unsilenceCmd())
	return c
}

func alertsLsCmd(out printer) *cobra.Command {
	var resolved int
	c := &cobra.Command{
		Use:   "ls",
		Short: "List the open incidents, firing first (and with --resolved N, the last N resolved)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			l, err := cl.Alerts(cmd.Context(), resolved)
			if err != nil {
				return err
			}
			return out(cmd, l, func(w io.Writer) {
				fmt.Fprintln(w, "STATE\tKIND\tSUBJECT\tSINCE\tSUMMARY")
				for _, in := range append(l.Open, l.Resolved...) {
					state := in.State
					if in.Silenced {
						state += " (silenced)"
					}
					since := in.Since.Local().Format(time.DateTime)
					if !in.ResolvedAt.IsZero() {
						since += " to " + in.ResolvedAt.Local().Format(time.DateTime)
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", state, in.Kind, in.Subject, since, in.Summary)
				}
			})
		},
	}
	c.Flags().IntVar(&resolved, "resolved", 0, "also list the last N resolved incidents (at most 500)")
	return c
}

func alertRulesCmd(out printer) *cobra.Command {
	c := rulesCmd(out, rulesSpec[api.AlertRules]{
		short: "Show or set the tenant's alert rules and webhooks; test the webhooks",
		long: `Replace the tenant's alert rules and webhooks. The file is JSON such as:

  {
    "rules": [
      {"kind": "box-offline", "for_minutes": 10},
      {"kind": "box-down", "for_minutes": 2},
      {"kind": "key-broken"},
      {"kind": "workload-unhealthy", "for_minutes": 5},
      {"kind": "rollout-stopped"},
      {"kind": "cert-expiry", "days": 14}
    ],
    "webhooks": [
      {"url": "https://ops.example.com/edgebox", "secret": "a shared secret"}
    ]
  }

A webhook receives a POST of JSON: delivery (the same on every try of one
notice), status (firing, resolved or test), tenant, console and incident.
With a secret, X-Edgebox-Signature is sha256= and the hex HMAC-SHA256 of
the body under it. A webhook named without a secret keeps the one it had.`,
		get: (*api.Client).GetAlertRules,
		set: (*api.Client).SetAlertRules,
		said: func(r api.AlertRules) string {
			return fmt.Sprintf("alert rules set: %d rules, %d webhooks", len(r.Rules), len(r.Webhooks))
		},
	})
	test := &cobra.Command{
		Use:   "test",
		Short: "Post a test notice to each webhook now and say what each answered",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			res, err := cl.TestWebhooks(cmd.Context())
			if err != nil {
				return err
			}
			failed := 0
			for _, r := range res.Webhooks {
				if r.Error != "" {
					failed++
				}
			}
			if err := out(cmd, res, func(w io.Writer) {
				fmt.Fprintln(w, "WEBHOOK\tRESULT")
				for _, r := range res.Webhooks {
					result := "took it"
					if r.Error != "" {
						result = r.Error
					}
					fmt.Fprintf(w, "%s\t%s\n", r.URL, result)
				}
			}); err != nil {
				return err
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d webhooks did not take the test notice", failed, len(res.Webhooks))
			}
			return nil
		},
	}
	c.AddCommand(test)
	return c
}

func silenceCmd(out printer) *cobra.Command {
	var q api.SilenceRequest
	c := &cobra.Command{
		Use:   "silence (--kind K | --box B | --site S) --for DURATION [--comment TEXT]",
		Short: "Keep the incidents of a kind, a box or a site from the webhooks for a while",
		Long: `Keep the incidents that match from the webhooks until the silence ends: those
of --kind, on --box (its ID or name) and in --site, for what is given. An
incident that fires under a silence is posted when the silence ends, if it
still fires then; one that ends under it is never posted.`,
		Example: `  edgebox alerts silence --box teller-7 --for 2h --comment "replacing its disk"
  edgebox alerts silence --site branch-12 --kind box-offline --for 1d`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			sil, err := cl.Silence(cmd.Context(), q)
			if err != nil {
				return err
			}
			return out(cmd, sil, func(w io.Writer) {
				fmt.Fprintf(w, "silence %s until %s\n", sil.ID, sil.Until.Local().Format(time.DateTime))
			})
		},
	}
	f := c.Flags()
	f.StringVar(&q.Kind, "kind", "", "the incidents of this kind (box-offline, box-down, key-broken, workload-unhealthy, rollout-stopped, cert-expiry)")
	f.StringVar(&q.Box, "box", "", "the incidents on this box (ID or name)")
	f.StringVar(&q.Site, "site", "", "the incidents in this site")
	f.StringVar(&q.For, "for", "", "how long: 30m, 2h, ... (at most 720h)")
	f.StringVar(&q.Comment, "comment", "", "why, for whoever reads the silences")
	c.MarkFlagRequired("for")
	return c
}

func silencesCmd(out printer) *cobra.Command {
	return &cobra.Command{
		Use:   "silences",
		Short: "List the silences that have not ended",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			l, err := cl.Silences(cmd.Context())
			if err != nil {
				return err
			}
			return out(cmd, l, func(w io.Writer) {
				fmt.Fprintln(w, "ID\tKIND\tBOX\tSITE\tUNTIL\tBY\tCOMMENT")
				for _, s := range l.Silences {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, orAny(s.Kind), orAny(s.Box), orAny(s.Site),
						s.Until.Local().Format(time.DateTime), s.CreatedBy, s.Comment)
				}
			})
		},
	}
}

func orAny(s string) string {
	if s == "" {
		return "*"
	}
	return s
}

func unsilenceCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "unsilence ID",
		Short: "End a silence now; the incidents it kept that still fire are posted",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			if err := cl.Unsilence(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "silence %s ended\n", args[0])
			return nil
		},
	}
}
