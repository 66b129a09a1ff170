package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/agent/update"
)

// launched reports whether 'run' is to launch the agent rather than be
// it: the box took an update (a version other than this installed binary
// runs or is on trial), and this process is not an agent its launcher
// started. A damaged update state launches too: the launcher says so and
// runs the installed agent.
func launched(dataDir string) (bool, error) {
	if os.Getenv(update.EnvChild) == "1" {
		return false, nil
	}
	st, err := update.Load(agent.UpdateDir(dataDir))
	if err != nil {
		return true, nil
	}
	return st.Launched(), nil
}

// runLauncher launches the agent version the box runs, with the same
// arguments as this run, until ctx ends.
func runLauncher(ctx context.Context, dataDir string, log *slog.Logger) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	l := &update.Launcher{Dir: agent.UpdateDir(dataDir), Installed: self, Args: os.Args[1:],
		Stdout: os.Stdout, Stderr: os.Stderr, Log: log.With("component", "launcher")}
	return l.Run(ctx)
}

// restartIntoNewVersion ends a run that staged a new agent version. An
// agent its launcher started exits for the launcher to start the new one;
// the installed binary running alone (its first update) starts again in
// its own place, now as the launcher, where the OS lets it (reexec), and
// otherwise exits for the service manager to start it again.
func restartIntoNewVersion() {
	if os.Getenv(update.EnvChild) != "1" {
		reexec()
	}
	os.Exit(update.ExitRestart)
}
