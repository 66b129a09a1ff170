// Package scripts holds the installers the console serves: install.sh for
// Linux and install.ps1 for Windows, each filled in with the console's URL
// and pins before it is served.
package scripts

import (
	_ "embed"
	"fmt"
	"regexp"
	"strings"
)

var (
	//go:embed install.sh
	installSh string
	//go:embed install.ps1
	installPs1 string
)

// Pins are what a served installer trusts.
type Pins struct {
	ConsoleURL string
	KeyPin     string // base64 SHA-256 of the serving key's SubjectPublicKeyInfo (curl --pinnedpubkey)
	CASHA256   string // hex SHA-256 of the console CA certificate
	// WindowsAgentSHA256 is the hex SHA-256 of the Windows agent the
	// console serves at /dl/ (WindowsAgent); "" when it serves none.
	WindowsAgentSHA256 string
}

// WindowsAgent is the file install.ps1 downloads from the console's /dl/.
const WindowsAgent = "edgebox-agent-windows-amd64.exe"

// InstallSh returns install.sh for a console.
func InstallSh(p Pins) string {
	return strings.NewReplacer("@@CONSOLE_URL@@", unquoted(p.ConsoleURL), "@@KEY_PIN@@", unquoted(p.KeyPin)).Replace(installSh)
}

// InstallPs1 returns install.ps1 for a console.
func InstallPs1(p Pins) string {
	return strings.NewReplacer("@@CONSOLE_URL@@", unquoted(p.ConsoleURL), "@@CA_SHA256@@", unquoted(p.CASHA256),
		"@@AGENT_SHA256@@", unquoted(p.WindowsAgentSHA256)).Replace(installPs1)
}

// The values go inside single quotes; they never hold one (URLs from the
// console's own configuration, base64 and hex), and these keep it so.
func unquoted(s string) string { return strings.ReplaceAll(s, "'", "") }

// LinuxCommand is the line a field engineer pastes on a Linux box: it
// fetches install.sh over a connection pinned to the console's key, then
// runs it with the token.
func LinuxCommand(p Pins, token string) string {
	return "curl -fsSLk --pinnedpubkey 'sha256//" + unquoted(p.KeyPin) + "' '" + unquoted(p.ConsoleURL) +
		"/install.sh' -o edgebox-install.sh && sudo sh edgebox-install.sh '" + unquoted(token) + "'"
}

// WindowsCommand is the line to paste into an elevated PowerShell: it
// fetches install.ps1 over a connection whose chain must end in the
// console's CA, then runs it with the token.
func WindowsCommand(p Pins, token string) string {
	return "$ca='" + unquoted(p.CASHA256) + "'; [Net.ServicePointManager]::SecurityProtocol=3072; " +
		"[Net.ServicePointManager]::ServerCertificateValidationCallback={param($s,$c,$ch,$e) " +
		"$h=[Security.Cryptography.SHA256]::Create(); foreach($x in $ch.ChainElements){" +
		"if((-join($h.ComputeHash($x.Certificate.RawData)|ForEach-Object{$_.ToString('x2')})) -eq $ca){return $true}}; return $false}; " +
		"$f=\"$env:TEMP\\edgebox-install.ps1\"; (New-Object Net.WebClient).DownloadFile('" + unquoted(p.ConsoleURL) + "/install.ps1',$f); " +
		"powershell -NoProfile -ExecutionPolicy Bypass -File $f -Token '" + unquoted(token) + "'"
}

// psAssign and psDownload find, in install.ps1, its single-quoted
// settings and the one download it makes.
var (
	psAssign   = regexp.MustCompile(`(?m)^\$(\w+) = '([^']*)'$`)
	psDownload = regexp.MustCompile(`\$client\.DownloadFile\("([^"]*)", \$exe\)`)
	psVar      = regexp.MustCompile(`\$(\w+)`)
)

// Ps1Download reads, from the text of an install.ps1, the URL it
// downloads the agent from and the SHA-256 it demands of it, as
// PowerShell would expand them. Tests use it to check what a served
// script would fetch.
func Ps1Download(script string) (url, sha256 string, err error) {
	vars := map[string]string{}
	for _, m := range psAssign.FindAllStringSubmatch(script, -1) {
		vars[m[1]] = m[2]
	}
	d := psDownload.FindAllStringSubmatch(script, -1)
	if len(d) != 1 {
		return "", "", fmt.Errorf("install.ps1 makes %d downloads, want 1", len(d))
	}
	url = psVar.ReplaceAllStringFunc(d[0][1], func(v string) string {
		val, ok := vars[v[1:]]
		if !ok {
			err = fmt.Errorf("install.ps1 downloads %q, and sets no %s", d[0][1], v)
		}
		return val
	})
	return url, vars["AgentSha256"], err
}
