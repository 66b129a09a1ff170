package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/edgebox/edgebox/api"
)

// exitError ends the CLI with a remote command's exit code, like ssh.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func execCmd() *cobra.Command {
	var workload string
	var tty, noTTY bool
	c := &cobra.Command{
		Use:   "exec BOX [--workload W] [-t] -- COMMAND [ARGS...]",
		Short: "Run a command on a box or in a workload, with its input, output and exit code",
		Long: `Run a command on a box, or in one of its workloads, through the box's
tunnel: standard input goes to it, its standard output and error come back,
and the CLI exits with its exit code, as 'ssh host cmd' does. A command
that a signal ended exits 128 + the signal's number where it has one, or
255 when the session could not run or was cut short.

-t gives the command a terminal (on by default when standard input and
output are both terminals and no command is redirected); with a terminal,
its output and errors come as one stream.

The session is recorded and audited on the console. It needs the
maintainer or admin role in the box's tenant.`,
		Example: `  edgebox exec box-17 -- uname -a
  edgebox exec box-17 --workload robot -- cat /etc/os-release
  tar -cz logs | edgebox exec box-17 -- tar -xz -C /tmp`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				return errors.New("name the box, then -- and the command: edgebox exec BOX -- COMMAND [ARGS...]")
			}
			useTTY := tty && !noTTY
			return runSession(cmd, args[0], api.SessionOptions{Workload: workload, Command: args[1:], TTY: useTTY})
		},
	}
	c.Flags().StringVar(&workload, "workload", "", "run in this workload instead of on the box itself")
	c.Flags().BoolVarP(&tty, "tty", "t", false, "give the command a terminal")
	c.Flags().BoolVarP(&noTTY, "no-tty", "T", false, "no terminal, even with -t")
	return c
}

func shellCmd() *cobra.Command {
	var workload string
	c := &cobra.Command{
		Use:   "shell BOX [--workload W]",
		Short: "Open an interactive shell on a box, in a workload, or on a VM's serial console",
		Long: `Open an interactive shell on a box through its tunnel: a login shell on
the box itself, a shell in a container or as a native workload's user, or
the serial console of a VM workload. The terminal's size follows yours, and
^C, ^Z and the like reach the remote side as they would locally.

The session is recorded (asciicast v2) and audited on the console; it ends
when the shell exits, after the console's idle time without a keystroke or
output (30 min by default), or at its time limit (8 h). It needs the
maintainer or admin role in the box's tenant.`,
		Example: `  edgebox shell box-17
  edgebox shell box-17 --workload robot`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runSession(cmd, args[0], api.SessionOptions{Workload: workload, TTY: true})
		},
	}
	c.Flags().StringVar(&workload, "workload", "", "open the shell in this workload instead of on the box itself")
	return c
}

// runSession runs one session with the CLI's standard streams.
func runSession(cmd *cobra.Command, box string, o api.SessionOptions) error {
	cl, err := client()
	if err != nil {
		return err
	}
	in, out, errOut := cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr()
	stdin, isFile := in.(*os.File)
	local := isFile && term.IsTerminal(int(stdin.Fd()))
	if o.TTY {
		o.Term = os.Getenv("TERM")
		if local {
			if w, h, err := term.GetSize(int(stdin.Fd())); err == nil {
				o.Cols, o.Rows = w, h
			}
		}
	}
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	s, err := cl.OpenSession(ctx, box, o)
	if err != nil {
		return err
	}
	defer s.Close()
	restore := func() {}
	if o.TTY && local {
		// Raw: every key, ^C included, goes to the remote terminal.
		old, err := term.MakeRaw(int(stdin.Fd()))
		if err != nil {
			return fmt.Errorf("cannot put the terminal in raw mode: %w", err)
		}
		var once sync.Once
		restore = func() { once.Do(func() { term.Restore(int(stdin.Fd()), old) }) }
		defer restore()
		stop := followSize(stdin, s)
		defer stop()
	} else {
		stop := forwardInterrupts(s)
		defer stop()
	}
	// Input, until it ends; a closed input ends the remote one.
	go func() {
		if _, err := io.Copy(s, in); err == nil {
			s.CloseInput()
		}
	}()
	exit, err := s.Run(out, errOut, func(st api.SessionStatus) {
		if st.State == "waiting_approval" {
			fmt.Fprintln(errOut, st.Message)
		}
	})
	restore() // so the messages below print as lines
	if err != nil {
		return err
	}
	if exit.Error != "" {
		fmt.Fprintf(errOut, "\r\nedgebox: %s\r\n", exit.Error)
		if exit.Code == -1 && exit.Signal == "" {
			return exitError{255}
		}
	}
	switch {
	case exit.Signal != "":
		return exitError{128 + signalNumber(exit.Signal)}
	case exit.Code != 0:
		return exitError{exit.Code}
	}
	return nil
}

// signalNumber is a signal's usual number; 127 for one it does not know,
// so the exit code still says "a signal".
func signalNumber(name string) int {
	switch strings.TrimPrefix(name, "SIG") {
	case "HUP":
		return 1
	case "INT":
		return 2
	case "QUIT":
		return 3
	case "KILL":
		return 9
	case "TERM":
		return 15
	}
	return 127
}

// sessionsCmd lists and ends remote sessions.
func sessionsCmd(out printer) *cobra.Command {
	c := &cobra.Command{Use: "session", Aliases: []string{"sessions"}, Short: "List and end remote sessions (shells and commands on boxes)"}
	var live bool
	var box string
	ls := &cobra.Command{
		Use:   "ls [--live] [--box BOX]",
		Short: "List the tenant's remote sessions, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			ss, err := cl.Sessions(cmd.Context(), live, box)
			if err != nil {
				return err
			}
			return out(cmd, ss, func(w io.Writer) {
				fmt.Fprintln(w, "ID\tUSER\tBOX\tWORKLOAD\tKIND\tSTARTED\tENDED\tBY\tEXIT")
				for _, s := range ss {
					ended, exit := "live", "-"
					if s.Ended != nil {
						ended = s.Ended.Sub(s.Started).Round(time.Second).String() + " later"
					}
					if s.ExitCode != nil {
						exit = fmt.Sprint(*s.ExitCode)
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.User, orDash(s.BoxName), orDash(s.Workload), s.Kind,
						s.Started.Local().Format(time.DateTime), ended, orDash(s.EndedBy), exit)
				}
			})
		},
	}
	ls.Flags().BoolVar(&live, "live", false, "only sessions still open")
	ls.Flags().StringVar(&box, "box", "", "only sessions on this box")
	end := &cobra.Command{
		Use:   "end ID",
		Short: "End a live session: your own, or any as an admin",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			if err := cl.EndSession(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "ended session %s\n", args[0])
			return nil
		},
	}
	var file string
	rec := &cobra.Command{
		Use:   "recording ID [-f FILE]",
		Short: "Download a session's recording (asciicast v2: 'asciinema play FILE' plays it); needs the auditor or admin role",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if file != "" {
				f, err := os.Create(file)
				if err != nil {
					return err
				}
				defer f.Close()
				w = f
			}
			return cl.SessionRecording(cmd.Context(), args[0], w)
		},
	}
	rec.Flags().StringVarP(&file, "file", "f", "", "write it to this file instead of standard output")
	verify := &cobra.Command{
		Use:   "verify ID",
		Short: "Check a session's recording against its hash chain; names the first altered or missing chunk",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			r, err := cl.VerifySession(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if err := out(cmd, r, func(w io.Writer) {
				if r.OK {
					fmt.Fprintf(w, "intact: %d chunks, ending on %s\n", r.Chunks, r.Head)
				} else {
					fmt.Fprintf(w, "NOT intact: %s (%d chunks before it verify)\n", r.Problem, r.Chunks)
				}
				if r.Unchained > 0 {
					fmt.Fprintf(w, "%d bytes after the last chunk were written as the console stopped and are not verified\n", r.Unchained)
				}
			}); err != nil {
				return err
			}
			if !r.OK {
				return exitError{2}
			}
			return nil
		},
	}
	approve := &cobra.Command{
		Use:   "approve ID",
		Short: "Approve another user's four-eyes session that waits; you may then watch and end it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			if err := cl.ApproveSession(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "approved session %s; watch it with 'edgebox session watch %s'\n", args[0], args[0])
			return nil
		},
	}
	watch := &cobra.Command{
		Use:   "watch ID",
		Short: "Watch a live session's terminal, read only: one you approved, or any as an admin",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			s, err := cl.WatchSession(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			defer s.Close()
			exit, err := s.Run(cmd.OutOrStdout(), cmd.ErrOrStderr(), func(st api.SessionStatus) {
				switch {
				case st.State == "resized":
					// The watched screen is drawn for this size: a terminal
					// of another size shows it wrapped or cut.
					fmt.Fprintf(cmd.ErrOrStderr(), "\r\n[the session's terminal is now %dx%d]\r\n", st.Cols, st.Rows)
				case st.Message != "":
					fmt.Fprintln(cmd.ErrOrStderr(), st.Message)
				}
			})
			if err != nil {
				return err
			}
			if exit.Error != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "\r\nthe session ended: %s\r\n", exit.Error)
			} else {
				fmt.Fprintf(cmd.ErrOrStderr(), "\r\nthe session ended with exit code %d\r\n", exit.Code)
			}
			return nil
		},
	}
	c.AddCommand(ls, end, rec, verify, approve, watch, sessionRulesCmd(out))
	return c
}

// sessionRulesCmd shows and sets the tenant's session rules.
func sessionRulesCmd(out printer) *cobra.Command {
	c := &cobra.Command{Use: "rules", Short: "Show or set which boxes need a second maintainer's approval for a session"}
	show := &cobra.Command{
		Use:  "show",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			r, err := cl.GetSessionRules(cmd.Context())
			if err != nil {
				return err
			}
			return out(cmd, r, func(w io.Writer) { printSessionRules(w, r) })
		},
	}
	var labels, regions, sites, fwdSites, fwdBoxes []string
	set := &cobra.Command{
		Use:   "set [--four-eyes-labels K=V,...]... [--four-eyes-region R]... [--four-eyes-site S]... [--forward-site SITE=TARGETS]... [--forward-box BOX=TARGETS]...",
		Short: "Replace the tenant's session rules (admins): four-eyes boxes, and the LAN hosts port forwards may reach",
		Long: `Replace the tenant's session rules. A session on a box that any rule
matches opens only once a second user with the maintainer or admin role
approves it ('edgebox session approve ID', or the web console); that user
may watch it live and end it. Each --four-eyes-labels is one rule: every
label it lists must match.

--forward-site and --forward-box allow port forwards from a site's boxes,
or one box's, to LAN hosts: ADDRESS[/BITS]:PORTS or HOSTNAME:PORTS, PORTS
being a port, LOW-HIGH or *; several separated by commas. A box's own
ports need no entry. With no flags, no box needs approval and forwards
reach only the boxes themselves.`,
		Example: `  edgebox session rules set --four-eyes-labels money=yes
  edgebox session rules set --four-eyes-labels money=yes,bank=icbc --four-eyes-site branch-12
  edgebox session rules set --forward-site shop-12=192.168.1.0/24:80,192.168.1.20:443 --forward-box BOX=printer.lan:631`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			var r api.SessionRules
			for _, l := range labels {
				m := api.BoxMatch{Labels: map[string]string{}}
				for _, kv := range strings.Split(l, ",") {
					k, v, ok := strings.Cut(kv, "=")
					if !ok || k == "" {
						return fmt.Errorf("--four-eyes-labels %q: use KEY=VALUE[,KEY=VALUE...]", l)
					}
					m.Labels[k] = v
				}
				r.FourEyes = append(r.FourEyes, m)
			}
			for _, g := range regions {
				r.FourEyes = append(r.FourEyes, api.BoxMatch{Region: g})
			}
			for _, s := range sites {
				r.FourEyes = append(r.FourEyes, api.BoxMatch{Site: s})
			}
			lists := func(flag string, in []string) (map[string][]string, error) {
				if len(in) == 0 {
					return nil, nil
				}
				out := map[string][]string{}
				for _, f := range in {
					name, targets, ok := strings.Cut(f, "=")
					if !ok || name == "" || targets == "" {
						return nil, fmt.Errorf("--%s %q: use NAME=TARGET[,TARGET...]", flag, f)
					}
					out[name] = append(out[name], strings.Split(targets, ",")...)
				}
				return out, nil
			}
			if r.ForwardSites, err = lists("forward-site", fwdSites); err != nil {
				return err
			}
			if r.ForwardBoxes, err = lists("forward-box", fwdBoxes); err != nil {
				return err
			}
			r, err = cl.SetSessionRules(cmd.Context(), r)
			if err != nil {
				return err
			}
			return out(cmd, r, func(w io.Writer) { printSessionRules(w, r) })
		},
	}
	set.Flags().StringArrayVar(&labels, "four-eyes-labels", nil, "boxes with these labels need approval (repeatable; each is one rule)")
	set.Flags().StringArrayVar(&regions, "four-eyes-region", nil, "boxes of this region need approval (repeatable)")
	set.Flags().StringArrayVar(&sites, "four-eyes-site", nil, "boxes of this site need approval (repeatable)")
	set.Flags().StringArrayVar(&fwdSites, "forward-site", nil, "SITE=TARGET[,TARGET...]: LAN hosts port forwards from the site's boxes may reach (repeatable)")
	set.Flags().StringArrayVar(&fwdBoxes, "forward-box", nil, "BOX_ID=TARGET[,TARGET...]: LAN hosts port forwards from that box may reach (repeatable)")
	c.AddCommand(show, set)
	return c
}

func printSessionRules(w io.Writer, r api.SessionRules) {
	for _, l := range []struct {
		what  string
		lists map[string][]string
	}{{"site", r.ForwardSites}, {"box", r.ForwardBoxes}} {
		names := make([]string, 0, len(l.lists))
		for n := range l.lists {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Fprintf(w, "port forwards from %s %s may reach %s\n", l.what, n, strings.Join(l.lists[n], ", "))
		}
	}
	if len(r.FourEyes) == 0 {
		fmt.Fprintln(w, "no box needs a second maintainer's approval for a session")
		return
	}
	fmt.Fprintln(w, "sessions need a second maintainer's approval on boxes with:")
	for _, m := range r.FourEyes {
		var parts []string
		for k, v := range m.Labels {
			parts = append(parts, k+"="+v)
		}
		if m.Region != "" {
			parts = append(parts, "region "+m.Region)
		}
		if m.Site != "" {
			parts = append(parts, "site "+m.Site)
		}
		sort.Strings(parts)
		fmt.Fprintf(w, "  %s\n", strings.Join(parts, ", "))
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
