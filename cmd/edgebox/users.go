package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/edgebox/edgebox/api"
)

// readPassword reads a password from the environment variable env, or the
// terminal without echo, or one line of standard input.
func readPassword(cmd *cobra.Command, prompt, env string) (string, error) {
	if v := os.Getenv(env); v != "" {
		return v, nil
	}
	in := cmd.InOrStdin()
	if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprint(cmd.ErrOrStderr(), prompt)
		b, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(cmd.ErrOrStderr())
		return string(b), err
	}
	line, err := bufio.NewReader(io.LimitReader(in, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("no password: set %s or type it", env)
	}
	return line, nil
}

func roleString(m map[string]string) string {
	ts := make([]string, 0, len(m))
	for t, r := range m {
		ts = append(ts, t+"="+r)
	}
	sort.Strings(ts)
	return strings.Join(ts, ",")
}

func whoamiCmd(out printer) *cobra.Command {
	return &cobra.Command{
		Use:   "whoami",
		Short: "Show who the stored token belongs to, and its roles",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			me, err := cl.Me(cmd.Context())
			if err != nil {
				return err
			}
			return out(cmd, me, func(w io.Writer) {
				fmt.Fprintf(w, "USER\tTENANT\tROLE\tALL ROLES\n%s\t%s\t%s\t%s\n", me.User, me.Tenant, me.Role, roleString(me.Roles))
			})
		},
	}
}

func userCmd(out printer) *cobra.Command {
	c := &cobra.Command{
		Use:   "user",
		Short: "Manage the users of your tenant (admins), or your own password",
		Long: `Users log in to the web console and the CLI with a password, and hold one
role in each tenant they work in:

  viewer      reads the fleet, apps and keys
  auditor     a viewer who also reads the audit log
  operator    a viewer who deploys, labels, approves boxes and leases keys
  maintainer  an operator who opens remote sessions on boxes
  admin       everything in the tenant: users, API and enrollment tokens

The commands act in the tenant you are logged in to (see 'edgebox whoami').`,
	}
	var role string
	create := &cobra.Command{
		Use:   "create NAME --role ROLE",
		Short: "Make a user with a role in your tenant; its password is asked for",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			pw, err := readPassword(cmd, "password for "+args[0]+": ", "EDGEBOX_NEW_PASSWORD")
			if err != nil {
				return err
			}
			u, err := cl.CreateUser(cmd.Context(), api.UserRequest{Name: args[0], Password: pw, Role: role})
			if err != nil {
				return err
			}
			return out(cmd, u, func(w io.Writer) { fmt.Fprintf(w, "user %s made: %s\n", u.Name, roleString(u.Roles)) })
		},
	}
	create.Flags().StringVar(&role, "role", "viewer", "viewer, auditor, operator, maintainer or admin")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the users of your tenant",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			us, err := cl.Users(cmd.Context())
			if err != nil {
				return err
			}
			return out(cmd, us, func(w io.Writer) {
				fmt.Fprintln(w, "NAME\tROLES\tCREATED")
				for _, u := range us {
					fmt.Fprintf(w, "%s\t%s\t%s\n", u.Name, roleString(u.Roles), u.CreatedAt.Local().Format("2006-01-02 15:04"))
				}
			})
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Take a user's role in your tenant away; a user left with none is deleted",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			if err := cl.DeleteUser(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "user %s removed\n", args[0])
			return nil
		},
	}
	roleCmd := &cobra.Command{
		Use:   "role NAME ROLE",
		Short: "Give a user (of any tenant, by name) a role in your tenant; ROLE - takes it away",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			r := args[1]
			if r == "-" {
				r = ""
			}
			u, err := cl.SetRole(cmd.Context(), args[0], r)
			if err != nil {
				return err
			}
			return out(cmd, u, func(w io.Writer) { fmt.Fprintf(w, "user %s: %s\n", u.Name, roleString(u.Roles)) })
		},
	}
	passwd := &cobra.Command{
		Use:   "passwd [NAME]",
		Short: "Change your own password, or (admins) another user's; the user's browser sessions end",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			if len(args) == 1 {
				pw, err := readPassword(cmd, "new password for "+args[0]+": ", "EDGEBOX_NEW_PASSWORD")
				if err != nil {
					return err
				}
				if err := cl.SetPassword(cmd.Context(), args[0], pw); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "password of %s changed\n", args[0])
				return nil
			}
			old, err := readPassword(cmd, "current password: ", "EDGEBOX_PASSWORD")
			if err != nil {
				return err
			}
			pw, err := readPassword(cmd, "new password: ", "EDGEBOX_NEW_PASSWORD")
			if err != nil {
				return err
			}
			if err := cl.ChangePassword(cmd.Context(), old, pw); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "password changed")
			return nil
		},
	}
	c.AddCommand(create, ls, rm, roleCmd, passwd)
	return c
}

func tenantCmd(out printer) *cobra.Command {
	c := &cobra.Command{Use: "tenant", Short: "List tenants, or make one (admins of the console's own tenant)"}
	var name string
	create := &cobra.Command{
		Use:   "create ID [--name NAME]",
		Short: "Make a tenant; then 'edgebox user role' gives people roles in it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			t, err := cl.CreateTenant(cmd.Context(), args[0], name)
			if err != nil {
				return err
			}
			return out(cmd, t, func(w io.Writer) { fmt.Fprintf(w, "tenant %s (%s) made\n", t.ID, t.Name) })
		},
	}
	create.Flags().StringVar(&name, "name", "", "display name (default: the ID)")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the tenants you work in",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			ts, err := cl.Tenants(cmd.Context())
			if err != nil {
				return err
			}
			return out(cmd, ts, func(w io.Writer) {
				fmt.Fprintln(w, "ID\tNAME")
				for _, t := range ts {
					fmt.Fprintf(w, "%s\t%s\n", t.ID, t.Name)
				}
			})
		},
	}
	c.AddCommand(create, ls)
	return c
}

func apiTokenCmd(out printer) *cobra.Command {
	c := &cobra.Command{Use: "apitoken", Short: "Make, list and revoke your own API tokens (for scripts and CI)"}
	var ttl string
	create := &cobra.Command{
		Use:   "create NAME [--ttl 720h]",
		Short: "Make an API token that acts as you, with your roles as they are at each call",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			t, err := cl.CreateAPIToken(cmd.Context(), api.APITokenRequest{Name: args[0], TTL: ttl})
			if err != nil {
				return err
			}
			return out(cmd, t, func(w io.Writer) {
				fmt.Fprintf(w, "API token %s (shown once):\n%s\n", t.Name, t.Token)
			})
		},
	}
	create.Flags().StringVar(&ttl, "ttl", "", "how long it lasts (default: until revoked)")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List your API tokens",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			ts, err := cl.APITokens(cmd.Context())
			if err != nil {
				return err
			}
			return out(cmd, ts, func(w io.Writer) {
				fmt.Fprintln(w, "ID\tNAME\tCREATED\tEXPIRES")
				for _, t := range ts {
					exp := "never"
					if !t.ExpiresAt.IsZero() {
						exp = t.ExpiresAt.Local().Format("2006-01-02 15:04")
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", t.ID, t.Name, t.CreatedAt.Local().Format("2006-01-02 15:04"), exp)
				}
			})
		},
	}
	rm := &cobra.Command{
		Use:   "rm ID",
		Short: "Revoke one of your API tokens",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			if err := cl.RevokeAPIToken(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "API token %s revoked\n", args[0])
			return nil
		},
	}
	c.AddCommand(create, ls, rm)
	return c
}
