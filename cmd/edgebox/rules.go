package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/edgebox/edgebox/api"
)

// rulesSpec says what a tenant's rules of one kind are and how they are
// read and replaced.
type rulesSpec[R any] struct {
	short, long string // the command's; long describes the file
	get         func(*api.Client, context.Context) (R, error)
	set         func(*api.Client, context.Context, R) (R, error)
	said        func(R) string // what a set did, in a line
}

// rulesCmd is 'rules show|set FILE' for one kind of a tenant's rules:
// show prints them as JSON, set replaces them with a JSON file's.
func rulesCmd[R any](out printer, s rulesSpec[R]) *cobra.Command {
	c := &cobra.Command{Use: "rules", Short: s.short}
	show := &cobra.Command{
		Use:   "show",
		Short: "Print the rules as JSON, ready to edit and set",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			r, err := s.get(cl, cmd.Context())
			if err != nil {
				return err
			}
			return printJSON(cmd, r)
		},
	}
	set := &cobra.Command{
		Use:   "set FILE",
		Short: "Replace the rules with those in a JSON file ('-' reads standard input)",
		Long:  s.long,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var r R
			if err := readJSONArg(cmd, args[0], &r); err != nil {
				return err
			}
			cl, err := client()
			if err != nil {
				return err
			}
			if r, err = s.set(cl, cmd.Context(), r); err != nil {
				return err
			}
			return out(cmd, r, func(w io.Writer) { fmt.Fprintln(w, s.said(r)) })
		},
	}
	c.AddCommand(show, set)
	return c
}

// readJSONArg decodes the JSON file name ("-": standard input, at most
// 1 MiB) into v, refusing fields v does not have.
func readJSONArg(cmd *cobra.Command, name string, v any) error {
	var raw []byte
	var err error
	if name == "-" {
		raw, err = io.ReadAll(io.LimitReader(cmd.InOrStdin(), 1<<20))
	} else {
		raw, err = os.ReadFile(name)
	}
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// printJSON prints v as indented JSON, ready to edit and set again.
func printJSON(cmd *cobra.Command, v any) error {
	enc := json.NewEncoder(cmd.OutOrStdout())
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
