// Package packages builds edgebox's packages in pure Go: a .deb and an
// .rpm of the agent and of the console for Linux (nfpm), and a .zip of the
// Windows agent with install.ps1. No distribution tools are needed.
package packages

import (
	"archive/zip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	"github.com/goreleaser/nfpm/v2/files"
	_ "github.com/goreleaser/nfpm/v2/rpm" // registers the rpm packager

	"github.com/edgebox/edgebox/installer"
)

// Program is one of the two packaged programs.
type Program struct {
	Name        string // edgebox-agent, edgebox-console
	Description string
	DataDir     string
	Unit        string // systemd unit text
}

// Agent is the edgebox agent as packaged: the binary in /usr/bin, its unit
// and data directory.
func Agent() Program {
	l := installer.Layout{Bin: "/usr/bin/edgebox-agent", DataDir: "/var/lib/edgebox-agent"}
	return Program{Name: "edgebox-agent", DataDir: l.DataDir, Unit: installer.SystemdUnit(l),
		Description: "edgebox agent: a box's outbound tunnel to its console\n" +
			" The agent enrolls the box with an edgebox console, keeps an outbound\n" +
			" mTLS tunnel to it up, and runs what the console asks for.\n" +
			" Enroll and start it with: edgebox-agent install TOKEN"}
}

// Console is the edgebox console as packaged.
func Console() Program {
	unit := `[Unit]
Description=edgebox console: boxes, tunnel, API
Documentation=https://github.com/edgebox/edgebox
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
ExecStart=/usr/bin/edgebox-console --data /var/lib/edgebox-console
Restart=always
RestartSec=5
UMask=0077
LimitNOFILE=1048576

[Install]
WantedBy=multi-user.target
`
	return Program{Name: "edgebox-console", DataDir: "/var/lib/edgebox-console", Unit: unit,
		Description: "edgebox console: runs and repairs fleets of edge boxes\n" +
			" The console holds the boxes' certificates and desired state, serves\n" +
			" the tunnel the boxes dial and the operators' API on one port."}
}

// Spec says what to package.
type Spec struct {
	Program Program
	Version string // e.g. 1.4.0; a git describe string is made a valid one
	Arch    string // GOARCH: amd64, arm64
	Binary  string // path of the built program
	Out     string // directory for the package
}

// debianVersion makes a version both dpkg and rpm accept.
func debianVersion(v string) string {
	v = strings.TrimPrefix(v, "v")
	if v == "" || v[0] < '0' || v[0] > '9' {
		v = "0.0.0~" + v
	}
	return strings.NewReplacer("-", "~", "/", "~", "_", "~").Replace(v)
}

const copyright = `Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: edgebox
Source: https://github.com/edgebox/edgebox

Files: *
Copyright: the edgebox authors
License: Apache-2.0
 On Debian systems, the full text of the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
`

// Build writes the .deb and the .rpm of s and returns their paths.
func Build(s Spec) ([]string, error) {
	tmp, err := os.MkdirTemp("", "edgebox-pkg-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	unit := filepath.Join(tmp, s.Program.Name+".service")
	copyrightFile := filepath.Join(tmp, "copyright")
	changelog := filepath.Join(tmp, "changelog.Debian.gz")
	overrides := filepath.Join(tmp, "overrides")
	if err := os.WriteFile(unit, []byte(s.Program.Unit), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(copyrightFile, []byte(copyright), 0o644); err != nil {
		return nil, err
	}
	mtime := buildTime()
	if err := writeChangelog(changelog, s, mtime); err != nil {
		return nil, err
	}
	// Go programs are static on purpose: one file that runs on any
	// distribution.
	if err := os.WriteFile(overrides, []byte(s.Program.Name+": statically-linked-binary [usr/bin/"+s.Program.Name+"]\n"), 0o644); err != nil {
		return nil, err
	}
	info := &nfpm.Info{
		Name: s.Program.Name, Arch: s.Arch, Platform: "linux", Version: debianVersion(s.Version),
		VersionSchema: "none", Release: "1", Section: "admin", Priority: "optional",
		Maintainer: "edgebox <edgebox@example.com>", Description: s.Program.Description,
		Vendor: "edgebox", Homepage: "https://github.com/edgebox/edgebox", License: "Apache-2.0", MTime: mtime,
		Overridables: nfpm.Overridables{
			Contents: files.Contents{
				{Source: s.Binary, Destination: "/usr/bin/" + s.Program.Name, FileInfo: &files.ContentFileInfo{Mode: 0o755, MTime: mtime}},
				{Source: unit, Destination: "/lib/systemd/system/" + s.Program.Name + ".service", FileInfo: &files.ContentFileInfo{Mode: 0o644, MTime: mtime}},
				{Source: copyrightFile, Destination: "/usr/share/doc/" + s.Program.Name + "/copyright", Packager: "deb", FileInfo: &files.ContentFileInfo{Mode: 0o644, MTime: mtime}},
				{Source: changelog, Destination: "/usr/share/doc/" + s.Program.Name + "/changelog.Debian.gz", Packager: "deb", FileInfo: &files.ContentFileInfo{Mode: 0o644, MTime: mtime}},
				{Source: overrides, Destination: "/usr/share/lintian/overrides/" + s.Program.Name, Packager: "deb", FileInfo: &files.ContentFileInfo{Mode: 0o644, MTime: mtime}},
				{Destination: s.Program.DataDir, Type: files.TypeDir, FileInfo: &files.ContentFileInfo{Mode: 0o700, MTime: mtime}},
			},
			Deb: nfpm.Deb{Fields: map[string]string{}},
		},
	}
	var out []string
	for _, format := range []string{"deb", "rpm"} {
		p, err := nfpm.Get(format)
		if err != nil {
			return nil, err
		}
		fi := nfpm.WithDefaults(info)
		if err := nfpm.PrepareForPackager(fi, format); err != nil {
			return nil, fmt.Errorf("%s: %w", format, err)
		}
		name := filepath.Join(s.Out, p.ConventionalFileName(fi))
		f, err := os.Create(name)
		if err != nil {
			return nil, err
		}
		if err := p.Package(fi, f); err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: %w", format, err)
		}
		if err := f.Close(); err != nil {
			return nil, err
		}
		out = append(out, name)
	}
	return out, nil
}

// buildTime is SOURCE_DATE_EPOCH when set (reproducible builds), else now.
func buildTime() time.Time {
	if v := os.Getenv("SOURCE_DATE_EPOCH"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return time.Unix(n, 0).UTC()
		}
	}
	return time.Now().UTC().Truncate(time.Second)
}

// WindowsZip writes the Windows agent's zip: edgebox-agent.exe and
// install.ps1, which installs the binary beside it.
func WindowsZip(exe, installPs1, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	zw := zip.NewWriter(f)
	for _, e := range []struct{ name, src string }{{"edgebox-agent.exe", exe}, {"install.ps1", installPs1}} {
		w, err := zw.Create(e.name)
		if err != nil {
			f.Close()
			return err
		}
		src, err := os.Open(e.src)
		if err != nil {
			f.Close()
			return err
		}
		_, err = io.Copy(w, src)
		src.Close()
		if err != nil {
			f.Close()
			return err
		}
	}
	if err := zw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
