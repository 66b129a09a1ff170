package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgebox/edgebox/api"
)

// stateCmd is 'edgebox boxes state BOX'.
func stateCmd(out printer) *cobra.Command {
	var events int
	c := &cobra.Command{
		Use:   "state BOX",
		Short: "Show a box's desired objects, how far it stored them, and what it reports of them",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			s, err := cl.BoxState(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return out(cmd, s, func(w io.Writer) { stateTable(w, s, events) })
		},
	}
	c.Flags().IntVar(&events, "events", 10, "show this many of the latest events")
	return c
}

func stateTable(w io.Writer, s api.BoxState, events int) {
	synced := "in sync"
	if s.Acked < s.Revision {
		synced = fmt.Sprintf("%d revisions not yet stored by the box", s.Revision-s.Acked)
	}
	fmt.Fprintf(w, "box %s: revision %d, stored %d (%s)\n\n", s.BoxID, s.Revision, s.Acked, synced)
	status := map[string]api.ObjectStatus{}
	for _, st := range s.Statuses {
		status[st.Kind+"/"+st.Name] = st
	}
	fmt.Fprintln(w, "KIND\tNAME\tREVISION\tPHASE\tOBSERVED\tMESSAGE")
	for _, o := range s.Objects {
		st, ok := status[o.Kind+"/"+o.Name]
		phase, observed := "-", "-"
		if ok {
			phase, observed = st.Phase, fmt.Sprint(st.ObservedRevision)
			if st.ObservedRevision < o.Revision {
				phase += " (older revision)"
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\n", o.Kind, o.Name, o.Revision, phase, observed, st.Message)
	}
	networkTable(w, s.Statuses)
	if events <= 0 || len(s.Events) == 0 {
		return
	}
	evs := s.Events[max(0, len(s.Events)-events):]
	fmt.Fprintln(w, "\nTIME\tOBJECT\tREASON\tMESSAGE")
	for _, e := range evs {
		reason := e.Reason
		if e.Warning {
			reason = "! " + reason
		}
		fmt.Fprintf(w, "%s\t%s/%s\t%s\t%s\n", e.Time.Local().Format(time.RFC3339), e.Kind, e.Name, reason, e.Message)
	}
}

// desiredCmd is 'edgebox boxes desired put|rm'.
func desiredCmd() *cobra.Command {
	c := &cobra.Command{Use: "desired", Short: "Write or delete one desired object of a box"}
	var file, spec string
	put := &cobra.Command{
		Use:   "put BOX KIND/NAME (-f FILE | --spec JSON)",
		Short: "Write one desired object; its spec is protobuf JSON of the kind",
		Example: `  edgebox boxes desired put shop-12 Workload/robot --spec '{"app":"robot","release":"1.2.0","runtime":"containerd"}'
  edgebox boxes desired put shop-12 AgentConfig/main -f config.json`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, name, err := objectRef(args[1])
			if err != nil {
				return err
			}
			raw, err := specArg(file, spec)
			if err != nil {
				return err
			}
			cl, err := client()
			if err != nil {
				return err
			}
			rev, err := cl.PutDesired(cmd.Context(), args[0], kind, name, raw)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s/%s written at box revision %d\n", kind, name, rev)
			return nil
		},
	}
	put.Flags().StringVarP(&file, "file", "f", "", "read the spec from FILE ('-' for stdin)")
	put.Flags().StringVar(&spec, "spec", "", "the spec as JSON")
	rm := &cobra.Command{
		Use: "rm BOX KIND/NAME", Short: "Delete one desired object", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, name, err := objectRef(args[1])
			if err != nil {
				return err
			}
			cl, err := client()
			if err != nil {
				return err
			}
			rev, err := cl.DeleteDesired(cmd.Context(), args[0], kind, name)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s/%s deleted (box revision %d)\n", kind, name, rev)
			return nil
		},
	}
	c.AddCommand(put, rm)
	return c
}

func objectRef(s string) (kind, name string, err error) {
	kind, name, ok := strings.Cut(s, "/")
	if !ok || kind == "" || name == "" {
		return "", "", fmt.Errorf("%q: name the object as KIND/NAME, e.g. Workload/robot", s)
	}
	return kind, name, nil
}

func specArg(file, spec string) (json.RawMessage, error) {
	var raw []byte
	var err error
	switch {
	case file != "" && spec != "":
		return nil, fmt.Errorf("give either -f or --spec, not both")
	case file == "-":
		raw, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	case file != "":
		raw, err = os.ReadFile(file)
	case spec != "":
		raw = []byte(spec)
	default:
		return nil, fmt.Errorf("give the spec with -f FILE or --spec JSON")
	}
	if err != nil {
		return nil, err
	}
	if !json.Valid(raw) {
		return nil, fmt.Errorf("the spec is not valid JSON")
	}
	return raw, nil
}
