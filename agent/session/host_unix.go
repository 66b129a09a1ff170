//go:build !windows

package session

import (
	"os"
	"os/user"
)

// hostShell is the box's login shell: bash where there is one.
func hostShell() []string {
	if _, err := os.Stat("/bin/bash"); err == nil {
		return []string{"/bin/bash", "-l"}
	}
	return []string{"/bin/sh", "-l"}
}

// hostEnv is a login's environment for the agent's user, and its home.
func hostEnv() ([]string, string) {
	home, name := "/", "root"
	if u, err := user.Current(); err == nil {
		home, name = u.HomeDir, u.Username
	}
	if fi, err := os.Stat(home); err != nil || !fi.IsDir() {
		home = "/"
	}
	return []string{"HOME=" + home, "USER=" + name, "LOGNAME=" + name, "LANG=C.UTF-8",
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, home
}
