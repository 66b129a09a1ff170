// Command edgebox-agent runs on a box: it enrolls with a token, then keeps
// an outbound tunnel to the console up and serves it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/runtime"
	"github.com/edgebox/edgebox/tunnel"
)

// version is set by the build.
var version = "dev"

func main() {
	if err := newRoot().Execute(); err != nil {
		if errors.Is(err, agent.ErrRestart) {
			restartIntoNewVersion()
		}
		fmt.Fprintln(os.Stderr, "edgebox-agent:", err)
		if errors.Is(err, agent.ErrWiped) {
			os.Exit(agent.ExitWiped) // not restarted by the service manager
		}
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	var dataDir, logLevel string
	root := &cobra.Command{
		Use:           "edgebox-agent",
		Short:         "The edgebox agent: runs a box for its console",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.PersistentFlags().StringVar(&dataDir, "data", agent.DefaultDataDir(), "data directory (identity, keys, state)")
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	logger := func() (*slog.Logger, error) {
		var lv slog.Level
		if err := lv.UnmarshalText([]byte(logLevel)); err != nil {
			return nil, fmt.Errorf("--log-level %q: %v", logLevel, err)
		}
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv})), nil
	}

	var name string
	enrollCmd := &cobra.Command{
		Use:   "enroll TOKEN",
		Short: "Enroll this box with the console that made TOKEN",
		Long: `Enroll makes a key on this box, sends a certificate request with the
token to the console the token names, and stores the certificate it gets
back. The token pins the console's CA: nothing else is trusted.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			fmt.Fprintln(cmd.OutOrStdout(), "enrolling...")
			id, pending, err := agent.Enroll(ctx, dataDir, args[0], agent.EnrollOptions{Name: name})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "enrolled as %s (box %s) with %s\n", id.Name, id.BoxID, id.ConsoleURL)
			if pending {
				fmt.Fprintln(cmd.OutOrStdout(), "this box waits for an operator: edgebox boxes approve", id.BoxID)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "start it with: edgebox-agent run --data %s\n", dataDir)
			return nil
		},
	}
	enrollCmd.Flags().StringVar(&name, "name", "", "box name (default: the host name)")

	var rt runtimeFlags
	var usbSim, proxy, keyServer, siteFlag, metricsListen string
	runCmd := &cobra.Command{
		Use:   "run",
		Short: "Run the agent in the foreground until interrupted",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logger()
			if err != nil {
				return err
			}
			if launch, err := launched(dataDir); err != nil {
				return err
			} else if launch {
				// The box took an agent update: this binary launches
				// the version to run, and takes a new one through its
				// probation.
				ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				return runLauncher(ctx, dataDir, log)
			}
			cfg := agent.DefaultConfig(dataDir)
			cfg.Version = version
			if cfg.Proxy, cfg.ProxySource, err = tunnelProxy(proxy, dataDir); err != nil {
				return err
			}
			hub, err := usbInventory(usbSim)
			if err != nil {
				return err
			}
			if c, ok := hub.(io.Closer); ok {
				defer c.Close() // a simulated hub removes the device nodes it made
			}
			cfg.USB = hub
			cfg.KeyServer = keyServer
			cfg.MetricsListen = metricsListen
			if cfg.SiteListen, err = siteListen(siteFlag); err != nil {
				return err
			}
			rt.proxy = workloadProxy(proxy, dataDir)
			ds, beside, closeDrivers := drivers(dataDir, rt, log)
			defer closeDrivers()
			cfg.Drivers = ds
			a, err := agent.New(cfg, log)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runWithDrivers(ctx, a.Run, append(runnersOf(ds), beside...), log)
		},
	}

	runCmd.Flags().StringVar(&rt.containerd, "containerd", "/run/containerd/containerd.sock", "containerd's socket, for container workloads (Linux)")
	runCmd.Flags().StringVar(&proxy, "proxy", "", "proxy for the tunnel for this run, http:// or https://, e.g. http://user:pass@proxy:3128 (default: the proxy in agent.json, else HTTPS_PROXY)")
	runCmd.Flags().StringVar(&usbSim, "usb-sim", "", "simulate the box's USB keys from this JSON file (hubs and keys), for demos and tests")
	runCmd.Flags().StringVar(&keyServer, "key-server", "", "loopback address where keys of other boxes leased to this box's containers and programs are offered over USB/IP (default 127.0.0.1:3240; \"off\" for none)")
	runCmd.Flags().StringVar(&siteFlag, "site-listen", "off", "where this box hears the other boxes of its site, so the console can tell its line being down from its death: \"auto\" (its private LAN addresses, UDP port 7946), addresses such as 192.168.1.20:7946 separated by commas, or \"off\"")
	runCmd.Flags().StringVar(&metricsListen, "metrics-listen", agent.DefaultMetricsListen, "loopback address where the box's Prometheus metrics are served at /metrics (tunnel, workloads, vitals, desired revision, site peers), or \"off\"; other addresses are refused")
	runCmd.Flags().IntVar(&rt.firstUID, "workload-uids", 0, "first of the 10,000 user IDs native workloads run as (default 690000); give each agent its own when several share a host")
	runCmd.Flags().StringVar(&rt.vmAccel, "vm-accel", "", "QEMU accelerator for VM workloads, such as kvm, tcg or whpx:tcg (default: kvm where /dev/kvm opens, else tcg on Linux; whpx:tcg on Windows)")
	runCmd.Flags().StringVar(&rt.runcRoot, "runc-root", "", "runc's state directory, when another containerd on this host uses the namespace \"edgebox\" too")

	var asJSON bool
	statusCmd := &cobra.Command{
		Use:   "status",
		Short: "Show what the agent on this box last reported",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := agent.ReadStatus(dataDir)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				e := json.NewEncoder(out)
				e.SetIndent("", "  ")
				return e.Encode(s)
			}
			state := "disconnected"
			if s.Connected {
				state = "connected"
			}
			switch {
			case s.Connected && !s.Greeted():
				state += ", saying hello"
			case s.Connected && !s.Approved:
				state += ", waiting for approval"
			}
			if !processAlive(s.PID) {
				state = "not running"
			}
			fmt.Fprintf(out, "box:          %s (%s)\nconsole:      %s\nstate:        %s since %s\ncertificate:  valid until %s\n",
				s.Name, s.BoxID, s.ConsoleURL, state, s.Since.Local().Format(time.RFC3339), s.CertNotAfter.Local().Format(time.RFC3339))
			if s.LastError != "" {
				fmt.Fprintf(out, "last error:   %s\n", s.LastError)
			}
			return nil
		},
	}
	statusCmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	root.AddCommand(enrollCmd, runCmd, statusCmd, installCmd(&dataDir), uninstallCmd(&dataDir), serviceCmd(&dataDir), imageCmd(&dataDir))
	return root
}

// beside is work that runs beside the agent until it stops: a driver's
// own (the qemu driver's DHCP server for bridged VMs), or the egress
// policies following their names.
type beside struct {
	name string
	run  func(ctx context.Context) error
}

// runnersOf are the drivers with work of their own while the agent runs.
func runnersOf(ds []runtime.Driver) []beside {
	var out []beside
	for _, d := range ds {
		if r, ok := d.(interface{ Run(context.Context) error }); ok {
			out = append(out, beside{"runtime " + d.Runtime(), r.Run})
		}
	}
	return out
}

// runWithDrivers runs the agent and, beside it, the work of rs, until ctx
// ends or the agent returns; it returns the agent's error once the work
// beside it has ended too.
func runWithDrivers(ctx context.Context, agentRun func(context.Context) error, rs []beside, log *slog.Logger) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel() // the work beside ends with the agent
		wg.Wait()
	}()
	for _, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.run(ctx); err != nil && ctx.Err() == nil {
				log.Warn("work beside the agent stopped", "what", r.name, "err", err)
			}
		}()
	}
	return agentRun(ctx)
}

// tunnelProxy returns the proxy this run's tunnel goes through and the
// setting it comes from, for errors that ask the operator to correct it:
// --proxy (flag, validated as install validates its --proxy), else the
// proxy in agent.json, else none (nil: the tunnel reads HTTPS_PROXY and
// names it itself).
func tunnelProxy(flag, dataDir string) (tunnel.ProxyFunc, string, error) {
	if flag != "" {
		s := agent.Settings{Proxy: flag}
		if err := s.Validate(); err != nil {
			return nil, "", err
		}
		return tunnel.ProxyFunc(s.ProxyFunc()), "the --proxy flag", nil
	}
	settings, err := agent.ReadSettings(dataDir)
	if err != nil {
		return nil, "", err
	}
	if settings.Proxy == "" {
		return nil, "", nil
	}
	return tunnel.ProxyFunc(settings.ProxyFunc()), agent.ProxySource(dataDir), nil
}
