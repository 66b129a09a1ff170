package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgebox/edgebox/api"
)

// keysCmd is 'edgebox keys ls|label|lease|attach|release|history'.
func keysCmd(out printer) *cobra.Command {
	c := &cobra.Command{Use: "keys", Short: "The UKEYs on every box: labels, leases, history"}
	var box string
	var labels []string
	ls := &cobra.Command{
		Use:   "ls [--box B] [--label bank=ICBC]",
		Short: "List keys, where they sit, whether they are present, and who holds them",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			want, err := parseLabels(labels)
			if err != nil {
				return err
			}
			cl, err := client()
			if err != nil {
				return err
			}
			all, err := cl.Keys(cmd.Context(), box, want)
			if err != nil {
				return err
			}
			return out(cmd, all, func(w io.Writer) {
				fmt.Fprintln(w, "KEY\tBOX\tPORT\tVID:PID\tSERIAL\tPRODUCT\tSTATE\tHOLDER\tLABELS")
				for _, k := range all {
					if k.Broken {
						k.State += ", broken"
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s:%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.BoxID, k.Port, k.VendorID, k.ProductID,
						dash(k.Serial), dash(k.Product), k.State, dash(holderText(k)), labelText(k.Labels))
				}
			})
		},
	}
	ls.Flags().StringVar(&box, "box", "", "only this box's keys (ID or name)")
	ls.Flags().StringArrayVar(&labels, "label", nil, "only keys with this label, k=v; repeatable")
	label := &cobra.Command{
		Use:   "label KEY k=v[,k=v] [k-]",
		Short: "Set (k=v) or remove (k-) labels of a key, such as bank=ICBC company=acme",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			set, err := parseLabels(args[1:])
			if err != nil {
				return err
			}
			cl, err := client()
			if err != nil {
				return err
			}
			k, err := cl.LabelKey(cmd.Context(), args[0], set)
			if err != nil {
				return err
			}
			return out(cmd, k, func(w io.Writer) { fmt.Fprintf(w, "key %s: %s\n", k.ID, labelText(k.Labels)) })
		},
	}
	var workload string
	lease := &cobra.Command{
		Use:   "lease KEY --workload W",
		Short: "Give a key to one workload on its box, exclusively",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if workload == "" {
				return fmt.Errorf("--workload is required")
			}
			cl, err := client()
			if err != nil {
				return err
			}
			k, err := cl.Lease(cmd.Context(), args[0], workload)
			if err != nil {
				return err
			}
			return out(cmd, k, func(w io.Writer) { fmt.Fprintf(w, "key %s leased to %s on box %s\n", k.ID, k.Holder, k.BoxID) })
		},
	}
	lease.Flags().StringVar(&workload, "workload", "", "the workload (an app's workload is named for the app)")
	var onBox string
	attach := &cobra.Command{
		Use:   "attach KEY --workload W --box B",
		Short: "Give a key to one workload on any box, exclusively: used from another box, it travels through the tunnels",
		Long: `Give a key to one workload on box B, exclusively. When B is not the key's
own box, the key is used from B: the console joins the two boxes' tunnels
for it while the lease lasts, and cuts them the moment it ends. A VM
workload on B sees the key on its own USB bus (no USB/IP driver in the
guest); a network blip of up to 10 s is not an unplug.`,
		Example: `  edgebox keys attach k-3f2a9c01d4e5 --workload robot --box shop-12-b
  edgebox keys ls          # HOLDER shows robot@shop-12-b
  edgebox keys release k-3f2a9c01d4e5`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if workload == "" || onBox == "" {
				return fmt.Errorf("--workload and --box are required")
			}
			cl, err := client()
			if err != nil {
				return err
			}
			k, err := cl.Attach(cmd.Context(), args[0], workload, onBox)
			if err != nil {
				return err
			}
			return out(cmd, k, func(w io.Writer) {
				if k.HolderBox != "" {
					fmt.Fprintf(w, "key %s (on box %s) leased to %s on box %s\n", k.ID, k.BoxID, k.Holder, k.HolderBox)
				} else {
					fmt.Fprintf(w, "key %s leased to %s on box %s\n", k.ID, k.Holder, k.BoxID)
				}
			})
		},
	}
	attach.Flags().StringVar(&workload, "workload", "", "the workload (an app's workload is named for the app)")
	attach.Flags().StringVar(&onBox, "box", "", "the workload's box, ID or name")
	release := &cobra.Command{
		Use:   "release KEY",
		Short: "End a key's lease",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			k, err := cl.Release(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return out(cmd, k, func(w io.Writer) { fmt.Fprintf(w, "key %s released\n", k.ID) })
		},
	}
	history := &cobra.Command{
		Use:   "history KEY",
		Short: "Every plug, unplug, lease, release and failure of a key, with time, workload and who",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			h, err := cl.KeyHistory(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return out(cmd, h, func(w io.Writer) {
				fmt.Fprintln(w, "TIME\tEVENT\tWORKLOAD\tBY\tDETAIL")
				for _, e := range h.Events {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", e.Time.Local().Format(time.RFC3339), e.Event, dash(e.Workload), dash(e.Actor), e.Detail)
				}
			})
		},
	}
	c.AddCommand(ls, label, lease, attach, release, history)
	return c
}

func labelText(l map[string]string) string { return dash(labelString(l)) }

// holderText is a key's holder: "robot", or "robot@BOX" when it is used
// from another box.
func holderText(k api.Key) string {
	if k.HolderBox != "" {
		return k.Holder + "@" + k.HolderBox
	}
	return k.Holder
}
