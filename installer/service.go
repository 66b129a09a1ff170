package installer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kardianos/service"
)

// Status is what the service manager says of the agent's service.
type Status string

const (
	StatusRunning      Status = "running"
	StatusStopped      Status = "stopped"
	StatusNotInstalled Status = "not installed"
	StatusUnknown      Status = "unknown"
)

// Service is the agent's service in the OS's service manager.
type Service struct {
	s service.Service
}

// program satisfies kardianos/service; the service manager runs the
// installed binary, never this process.
type program struct{}

func (program) Start(service.Service) error { return nil }
func (program) Stop(service.Service) error  { return nil }

// NewService returns the agent's service for l.
func NewService(l Layout) (*Service, error) {
	s, err := service.New(program{}, serviceConfig(l))
	if err != nil {
		return nil, fmt.Errorf("installer: %w", err)
	}
	return &Service{s: s}, nil
}

// serviceConfig is the service definition: the agent in the foreground,
// restarted whenever it ends.
func serviceConfig(l Layout) *service.Config {
	return &service.Config{
		Name:        ServiceName,
		DisplayName: "edgebox agent",
		Description: "Keeps this box's tunnel to its edgebox console and runs what the console asks for.",
		Executable:  l.Bin,
		Arguments:   []string{"run", "--data", l.DataDir},
		Option: service.KeyValue{
			// systemd: our own unit, the one the packages ship and the
			// tests verify.
			"SystemdScript": SystemdUnit(l),
			"LogDirectory":  l.LogDir,
			// Windows recovery actions: restart after 5 s, every time.
			"OnFailure":              "restart",
			"OnFailureDelayDuration": "5s",
			"OnFailureResetPeriod":   86400,
			"StartType":              "automatic",
			"DelayedAutoStart":       false,
		},
	}
}

// Platform names the service manager in use: "linux-systemd",
// "unix-systemv", "windows-service", …
func (s *Service) Platform() string { return s.s.Platform() }

// Status asks the service manager about the service.
func (s *Service) Status() (Status, error) {
	st, err := s.s.Status()
	switch {
	case errors.Is(err, service.ErrNotInstalled):
		return StatusNotInstalled, nil
	case err != nil:
		// SysV's 'service X status' fails without saying why when there
		// is no script.
		if f := s.definitionFile(); f != "" {
			if _, serr := os.Stat(f); errors.Is(serr, os.ErrNotExist) {
				return StatusNotInstalled, nil
			}
		}
		if strings.Contains(err.Error(), "not installed") {
			return StatusNotInstalled, nil
		}
		return StatusUnknown, err
	case st == service.StatusRunning:
		return StatusRunning, nil
	case st == service.StatusStopped:
		return StatusStopped, nil
	}
	return StatusUnknown, nil
}

// definitionFile is where the service manager keeps the service's
// definition, where that is a file.
func (s *Service) definitionFile() string {
	switch s.Platform() {
	case "unix-systemv":
		return "/etc/init.d/" + ServiceName
	case "linux-systemd":
		return "/etc/systemd/system/" + ServiceName + ".service"
	}
	return ""
}

// Install registers the service.
func (s *Service) Install() error { return s.s.Install() }

// Uninstall removes the service. On SysV it also removes the runlevel
// links to the init script, which kardianos/service leaves dangling.
func (s *Service) Uninstall() error {
	if err := s.s.Uninstall(); err != nil {
		return err
	}
	if s.Platform() == "unix-systemv" {
		links, _ := filepath.Glob("/etc/rc[0-6].d/[SK][0-9][0-9]" + ServiceName)
		for _, l := range links {
			if target, err := os.Readlink(l); err == nil && target == s.definitionFile() {
				if err := os.Remove(l); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
func (s *Service) Start() error   { return s.s.Start() }
func (s *Service) Stop() error    { return s.s.Stop() }
func (s *Service) Restart() error { return s.s.Restart() }
