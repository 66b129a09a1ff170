package scripts

import (
	"regexp"
	"strings"
	"testing"
)

var testPins = Pins{ConsoleURL: "https://console.example.com:8443", KeyPin: "a2V5",
	CASHA256:           "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
	WindowsAgentSHA256: "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"}

// TestInstallPs1IsAHandOver reads the served install.ps1 (PowerShell does
// not run here): it downloads the one agent the console serves for
// Windows, over TLS checked against the pinned CA, checks it against the
// SHA-256 filled in before running anything, and hands over to
// 'edgebox-agent.exe install TOKEN' with the options; the service and the
// enrollment are left to Go.
func TestInstallPs1IsAHandOver(t *testing.T) {
	t.Parallel()
	ps := InstallPs1(testPins)
	if regexp.MustCompile(`@@[A-Z0-9_]+@@`).MatchString(ps) {
		t.Fatalf("a pin is left unfilled:\n%s", ps)
	}
	url, sum, err := Ps1Download(ps)
	if err != nil {
		t.Fatal(err)
	}
	if url != testPins.ConsoleURL+"/dl/"+WindowsAgent || sum != testPins.WindowsAgentSHA256 {
		t.Fatalf("it downloads %s and wants SHA-256 %s", url, sum)
	}
	// Each step is there, in this order.
	steps := []struct{ what, text string }{
		{"the CA pin", "$pinned = $CaSha256.ToLowerInvariant()"},
		{"a chain check against the pin", "ServerCertificateValidationCallback"},
		{"the download", "$client.DownloadFile("},
		{"hashing the download", "$got = (Get-FileHash -Algorithm SHA256 $exe).Hash.ToLowerInvariant()"},
		{"comparing with the filled-in sum", "if ($got -ne $AgentSha256.ToLowerInvariant()) {"},
		{"refusing a mismatch", "nothing was installed"},
		{"running the agent's installer", "& $exe @agentArgs"},
	}
	at := 0
	for _, s := range steps {
		i := strings.Index(ps[at:], s.text)
		if i < 0 {
			t.Fatalf("%s (%q) is missing, or not after the step before", s.what, s.text)
		}
		at += i + len(s.text)
	}
	// The hand-over: install, the token, each option as the agent's flag.
	for _, want := range []string{`$agentArgs = @("install", $Token)`, `@("--name", $Name)`, `@("--labels", $Labels)`, `@("--proxy", $Proxy)`, "exit $code"} {
		if !strings.Contains(ps, want) {
			t.Errorf("the hand-over lacks %q", want)
		}
	}
	// What Go does is not done here.
	for _, gone := range []string{"New-Service", "sc.exe", "Start-Service", "/api/v1/enroll", "SHA256SUMS", "IsInRole"} {
		if strings.Contains(ps, gone) {
			t.Errorf("install.ps1 does %q itself; edgebox-agent install does that", gone)
		}
	}
	if code := codeLines(ps); code > 70 {
		t.Errorf("install.ps1 has %d lines of code; keep it a hand-over", code)
	}
}

func codeLines(ps string) int {
	n := 0
	for _, l := range strings.Split(ps, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			n++
		}
	}
	return n
}

// TestInstallPs1Pins: whatever the console fills in stays inside its
// quotes; a console without a Windows agent gets a script that says so.
func TestInstallPs1Pins(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		pins Pins
		want string
	}{
		{"quote in the URL", Pins{ConsoleURL: "https://x'; Remove-Item C:\\ #", CASHA256: "ab", WindowsAgentSHA256: "cd"},
			"$ConsoleUrl = 'https://x; Remove-Item C:\\ #'"},
		{"no Windows agent", Pins{ConsoleURL: "https://x", CASHA256: "ab"}, "$AgentSha256 = ''"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ps := InstallPs1(c.pins)
			if !strings.Contains(ps, c.want) {
				t.Fatalf("install.ps1 lacks %q", c.want)
			}
			for _, m := range regexp.MustCompile(`(?m)^\$\w+ = (.*)$`).FindAllStringSubmatch(ps, -1) {
				if v := m[1]; strings.HasPrefix(v, "'") && strings.Count(v, "'") != 2 {
					t.Fatalf("a value breaks out of its quotes: %s", m[0])
				}
			}
		})
	}
	if !strings.Contains(InstallPs1(Pins{ConsoleURL: "https://x", CASHA256: "ab"}), "serves no Windows agent") {
		t.Fatal("no message for a console without a Windows agent")
	}
}

// TestPs1DownloadRefusesWhatItCannotRead: the reader of the script's
// download fails loudly rather than guess.
func TestPs1DownloadRefusesWhatItCannotRead(t *testing.T) {
	t.Parallel()
	for name, ps := range map[string]string{
		"no download":    "$ConsoleUrl = 'https://x'\n",
		"two downloads":  "$client.DownloadFile(\"a\", $exe)\n$client.DownloadFile(\"b\", $exe)\n",
		"unset variable": "$client.DownloadFile(\"$Nowhere/dl/x\", $exe)\n",
	} {
		if _, _, err := Ps1Download(ps); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
