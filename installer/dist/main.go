// Command dist builds an edgebox release into a directory (make dist):
// the agent for linux/amd64, linux/arm64 and windows/amd64 and the console
// for linux/amd64 and linux/arm64, their SHA256SUMS (the files a console
// serves at /dl/ when given this directory with --dist), a .deb and an
// .rpm of the agent and the console, and a .zip of the Windows agent.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/edgebox/edgebox/console/dist"
	"github.com/edgebox/edgebox/installer/packages"
)

func main() {
	out := flag.String("out", "dist", "output directory")
	version := flag.String("version", "dev", "release version")
	ldflags := flag.String("ldflags", "", "go build -ldflags")
	flag.Parse()
	if err := run(*out, *version, *ldflags); err != nil {
		fmt.Fprintln(os.Stderr, "dist:", err)
		os.Exit(1)
	}
}

type target struct{ prog, goos, goarch string }

func (t target) file() string {
	name := t.prog + "-" + t.goos + "-" + t.goarch
	if t.goos == "windows" {
		name += ".exe"
	}
	return name
}

func run(out, version, ldflags string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	targets := []target{
		{"edgebox-agent", "linux", "amd64"}, {"edgebox-agent", "linux", "arm64"}, {"edgebox-agent", "windows", "amd64"},
		{"edgebox-console", "linux", "amd64"}, {"edgebox-console", "linux", "arm64"},
	}
	for _, t := range targets {
		fmt.Printf("dist: building %s\n", t.file())
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w "+ldflags, "-o", filepath.Join(out, t.file()), "./cmd/"+t.prog)
		cmd.Env = append(os.Environ(), "GOOS="+t.goos, "GOARCH="+t.goarch, "CGO_ENABLED=0")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("building %s: %w", t.file(), err)
		}
	}
	for _, t := range targets {
		if t.goos != "linux" {
			continue
		}
		prog := packages.Agent()
		if t.prog == "edgebox-console" {
			prog = packages.Console()
		}
		made, err := packages.Build(packages.Spec{Program: prog, Version: version, Arch: t.goarch, Binary: filepath.Join(out, t.file()), Out: out})
		if err != nil {
			return fmt.Errorf("packaging %s: %w", t.file(), err)
		}
		for _, m := range made {
			fmt.Printf("dist: packaged %s\n", m)
		}
	}
	zip := filepath.Join(out, "edgebox-agent-"+strings.TrimPrefix(version, "v")+"-windows-amd64.zip")
	if err := packages.WindowsZip(filepath.Join(out, "edgebox-agent-windows-amd64.exe"), "scripts/install.ps1", zip); err != nil {
		return err
	}
	fmt.Printf("dist: packaged %s\n", zip)
	return writeSums(out)
}

// writeSums writes SHA256SUMS of every file in out.
func writeSums(out string) error {
	entries, err := os.ReadDir(out)
	if err != nil {
		return err
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() && e.Name() != dist.SumsFile {
			names = append(names, e.Name())
		}
	}
	if _, err := dist.WriteSums(out, names); err != nil {
		return err
	}
	fmt.Printf("dist: wrote %s\n", filepath.Join(out, dist.SumsFile))
	return nil
}
