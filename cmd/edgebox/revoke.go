package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgebox/edgebox/api"
)

// revokeCmd is 'edgebox boxes revoke BOX [--wipe]'; table prints boxes.
func revokeCmd(out printer, table func(io.Writer, []api.Box)) *cobra.Command {
	var req api.RevokeRequest
	c := &cobra.Command{
		Use:   "revoke BOX [--wipe]",
		Short: "Refuse a box from now on and drop its session; --wipe erases it first",
		Long: `Revoke refuses the box's certificate from now on and drops its session at
once. Its workloads keep running unless --wipe is given.

With --wipe, the box is told over its session, before the session is dropped,
to stop and remove every workload (which gives back the USB keys they held),
and to erase its desired state and its identity; the console then ends the
leases of the keys the box gave back. The box is revoked at once whatever it
answers; the command says whether the box confirmed the wipe, and the box's
record and the audit log keep it. A box that is offline is revoked all the
same, and its wipe stays unconfirmed.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if req.WipeTimeout != "" && !req.Wipe {
				return fmt.Errorf("--wipe-timeout goes with --wipe")
			}
			cl, err := client()
			if err != nil {
				return err
			}
			revoke := cl.Revoke
			if req.Wipe {
				revoke = func(ctx context.Context, id string) (api.Box, error) { return cl.RevokeWith(ctx, id, req) }
			}
			b, err := revoke(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return out(cmd, b, func(w io.Writer) {
				if req.Wipe {
					wipeSummary(w, b)
				}
				table(w, []api.Box{b})
			})
		},
	}
	c.Flags().BoolVar(&req.Wipe, "wipe", false, "first tell the box to remove its workloads, give back its keys and erase its desired state and identity")
	c.Flags().StringVar(&req.WipeTimeout, "wipe-timeout", "", "how long to wait for the box's answer (1s to 10m; default 30s)")
	return c
}

// wipeSummary says what became of a box's wipe.
func wipeSummary(w io.Writer, b api.Box) {
	fmt.Fprintf(w, "box %s (%s) revoked: refused from now on, its session dropped\n", b.ID, b.Name)
	wp := b.Wipe
	if wp == nil {
		fmt.Fprintln(w, "wipe: the console did not record it; 'edgebox audit ls --target", b.ID+"' may say why")
		return
	}
	if wp.Confirmed {
		fmt.Fprintf(w, "wipe: confirmed by the box: %d %s removed%s, %d %s given back%s; its desired state and identity are erased\n",
			len(wp.WorkloadsRemoved), plural(len(wp.WorkloadsRemoved), "workload", "workloads"), names(wp.WorkloadsRemoved),
			len(wp.KeysReleased), plural(len(wp.KeysReleased), "key", "keys"), names(wp.KeysReleased))
		fmt.Fprintln(w, "  to use that machine again, enroll it with a new token")
	} else {
		fmt.Fprintln(w, "wipe:", wp.Result)
		fmt.Fprintln(w, "  the box is refused, but what runs on it may still run, and it may keep its identity and desired state")
	}
	if wp.AnsweredAt != nil {
		fmt.Fprintf(w, "  asked by %s; took %s\n", wp.AskedBy, wp.AnsweredAt.Sub(wp.AskedAt).Round(time.Millisecond))
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func names(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return " (" + strings.Join(s, ", ") + ")"
}
