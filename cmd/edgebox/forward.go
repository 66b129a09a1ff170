package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/tunnel/forwarding"
)

func portForwardCmd() *cobra.Command {
	var listen string
	c := &cobra.Command{
		Use:   "port-forward BOX [LOCAL_PORT:]HOST:PORT",
		Short: "Forward a local port to a port on a box, or on a host of the box's LAN",
		Long: `Listen on a local port and carry each connection to it through the box's
tunnel to HOST:PORT as the box sees it: the box's own ports (127.0.0.1,
localhost), or a host on its LAN that an admin put on the box's or its
site's forward allow list ('edgebox session rules set --forward-site
SITE=HOST:PORTS'); any other target is refused. LOCAL_PORT is HOST:PORT's
port unless given; 0 picks a free one. ^C ends the forward.

The forward is audited: who, box, target, start, end, connections and
bytes. It needs the maintainer or admin role in the box's tenant.`,
		Example: `  edgebox port-forward box-17 8080:127.0.0.1:80      # the box's own web page on http://127.0.0.1:8080
  edgebox port-forward box-17 192.168.1.20:443         # a LAN host, on local port 443`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			local, target, err := splitForward(args[1])
			if err != nil {
				return err
			}
			cl, err := client()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			conn, err := cl.OpenForward(ctx, args[0], target, "")
			if api.NeedsApproval(err) {
				// A four-eyes box: ask, wait for the second maintainer.
				var id string
				if id, err = awaitApproval(ctx, cmd, cl, args[0], "forward", "", target, false); err != nil {
					return err
				}
				conn, err = cl.OpenForward(ctx, args[0], target, id)
			}
			if err != nil {
				return err
			}
			mux, err := forwarding.Client(conn)
			if err != nil {
				return err
			}
			defer mux.Close()
			ln, err := net.Listen("tcp", net.JoinHostPort(listen, local))
			if err != nil {
				return fmt.Errorf("listening on %s: %w", net.JoinHostPort(listen, local), err)
			}
			defer ln.Close()
			fmt.Fprintf(cmd.OutOrStdout(), "forwarding %s to %s on box %s; ^C ends it\n", ln.Addr(), target, args[0])
			go func() {
				select {
				case <-ctx.Done():
				case <-mux.CloseChan():
				}
				ln.Close()
			}()
			var wg sync.WaitGroup
			defer wg.Wait()
			for {
				lc, err := ln.Accept()
				if err != nil {
					if mux.IsClosed() && ctx.Err() == nil {
						return errors.New("the console ended the forward")
					}
					return nil
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer lc.Close()
					st, err := mux.OpenStream()
					if err != nil {
						return
					}
					defer st.Close()
					if err := forwarding.ReadReply(st); err != nil {
						fmt.Fprintf(cmd.ErrOrStderr(), "edgebox: a connection from %s: %v\n", lc.RemoteAddr(), err)
						return
					}
					forwarding.Join(ctx, lc, st)
				}()
			}
		},
	}
	c.Flags().StringVar(&listen, "address", "127.0.0.1", "the local address to listen on")
	return c
}

// splitForward reads [LOCAL_PORT:]HOST:PORT.
func splitForward(s string) (local, target string, err error) {
	bad := fmt.Errorf("%q: use [LOCAL_PORT:]HOST:PORT", s)
	target = s
	if first, rest, ok := strings.Cut(s, ":"); ok {
		if _, err := strconv.Atoi(first); err == nil && strings.Contains(rest, ":") && !strings.HasPrefix(rest, ":") {
			local, target = first, rest
		}
	}
	if _, _, err := forwarding.ParseTarget(target); err != nil {
		return "", "", bad
	}
	if local == "" {
		_, local, _ = net.SplitHostPort(target)
	}
	if p, err := strconv.Atoi(local); err != nil || p < 0 || p > 65535 {
		return "", "", bad
	}
	return local, target, nil
}

// awaitApproval asks for a screen's or forward's four-eyes approval and
// waits for it.
func awaitApproval(ctx context.Context, cmd *cobra.Command, cl *api.Client, box, kind, workload, target string, viewOnly bool) (string, error) {
	r, err := cl.AskSession(ctx, box, kind, workload, target, viewOnly)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "box %s needs a second maintainer's approval: they run 'edgebox session approve %s' or approve it in the web console\n", box, r.ID)
	for {
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
		r, err = cl.Session(ctx, r.ID)
		if err != nil {
			return "", err
		}
		switch {
		case r.ApprovedBy != "":
			fmt.Fprintf(cmd.ErrOrStderr(), "approved by %s\n", r.ApprovedBy)
			return r.ID, nil
		case !r.Live():
			return "", fmt.Errorf("the request ended without an approval (%s)", r.EndedBy)
		}
	}
}

func screenCmd() *cobra.Command {
	var listen string
	var viewOnly bool
	c := &cobra.Command{
		Use:   "screen BOX WORKLOAD [--view-only] [--listen ADDRESS]",
		Short: "Show a VM workload's screen in your VNC viewer, through the box's tunnel",
		Long: `Listen on a local address (127.0.0.1:5900 unless --listen says
otherwise) and carry each VNC viewer that connects to the screen of the VM
workload on the box, through its tunnel: point any VNC viewer at it (no
password). --view-only passes no key, pointer or clipboard to the VM. The
web console shows the same screen on the box's page. ^C ends it.

Every screen is audited. On a box that needs a second maintainer's
approval, the CLI asks for it and waits. Needs the maintainer or admin
role.`,
		Example: `  edgebox screen box-17 robot            # then: vncviewer 127.0.0.1:5900
  edgebox screen box-17 robot --view-only --listen 127.0.0.1:5901`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := client()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			box, workload := args[0], args[1]
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listening on %s: %w", listen, err)
			}
			defer ln.Close()
			fmt.Fprintf(cmd.OutOrStdout(), "the screen of %s on box %s is at %s (VNC, no password); ^C ends it\n", workload, box, ln.Addr())
			go func() { <-ctx.Done(); ln.Close() }()
			var wg sync.WaitGroup
			defer wg.Wait()
			for {
				lc, err := ln.Accept()
				if err != nil {
					return nil
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer lc.Close()
					sc, err := cl.OpenScreen(ctx, box, workload, viewOnly, "")
					if api.NeedsApproval(err) {
						var request string
						if request, err = awaitApproval(ctx, cmd, cl, box, "screen", workload, "", viewOnly); err == nil {
							sc, err = cl.OpenScreen(ctx, box, workload, viewOnly, request)
						}
					}
					if err != nil {
						fmt.Fprintf(cmd.ErrOrStderr(), "edgebox: a viewer from %s: %v\n", lc.RemoteAddr(), err)
						return
					}
					defer sc.Close()
					forwarding.Join(ctx, lc, sc)
				}()
			}
		},
	}
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:5900", "the local address VNC viewers connect to")
	c.Flags().BoolVar(&viewOnly, "view-only", false, "pass no key, pointer or clipboard to the VM")
	return c
}
