package integration

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/internal/test/require"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/internal/test/toxic"
)

// needRootAndUnshare is what the install tests need: they install a real
// service, so they run as root in a mount namespace of their own where
// /usr/local/bin, /etc/init.d, /etc/rc?.d and /var/log are empty tmpfs, and
// nothing they install reaches this machine.
func needRootAndUnshare(t *testing.T) {
	t.Helper()
	require.Root(t, "installing a service")
	require.Tools(t, "util-linux", "unshare")
	require.Tools(t, "curl", "curl")
	require.Tools(t, "coreutils", "sha256sum")
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		t.Skip("the console serves agents for amd64 and arm64 only")
	}
}

// distWithAgent puts the built agent in the console's downloads.
func distWithAgent(t testing.TB, dataDir, binDir string) {
	dir := filepath.Join(dataDir, "dist")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(binDir, "edgebox-agent"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "edgebox-agent-linux-"+runtime.GOARCH), raw, 0o755); err != nil {
		t.Fatal(err)
	}
}

// isolated is the start of every script run in the test's namespace.
const isolated = `set -u
mount -t tmpfs none /usr/local/bin && mount -t tmpfs none /etc/init.d && mount -t tmpfs none /var/log || exit 97
mount -t tmpfs none /run || exit 97 # the service's pid file
for i in 0 1 2 3 4 5 6; do mount -t tmpfs none /etc/rc$i.d || exit 97; done
cd "$WORK"
`

// inNamespace starts script in a fresh mount namespace, in dir WORK, and
// returns its standard input and its output (stdout and stderr).
func inNamespace(t *testing.T, script string) (io.WriteCloser, *bufio.Reader) {
	t.Helper()
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", isolated+script)
	work := t.TempDir()
	cmd.Env = append(os.Environ(), "WORK="+work)
	// The service detaches from the script: whatever the test's outcome,
	// stop every agent started on its data.
	t.Cleanup(func() { exec.Command("pkill", "-f", "edgebox-agent run --data "+work).Run() })
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	r, w := io.Pipe()
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); w.Close() }()
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill() })
	return stdin, bufio.NewReader(r)
}

// readUntil reads lines until one starts with mark, and returns them all.
func readUntil(t *testing.T, r *bufio.Reader, mark string, timeout time.Duration) string {
	t.Helper()
	done := make(chan string, 1)
	go func() {
		var b strings.Builder
		for {
			line, err := r.ReadString('\n')
			b.WriteString(line)
			if err != nil || strings.HasPrefix(line, mark) {
				done <- b.String()
				return
			}
		}
	}()
	select {
	case s := <-done:
		if !strings.Contains(s, mark) {
			t.Fatalf("the script ended before %q:\n%s", mark, s)
		}
		return s
	case <-time.After(timeout):
		t.Fatalf("no %q within %v", mark, timeout)
		return ""
	}
}

func TestInstallScriptEndToEnd(t *testing.T) {
	needRootAndUnshare(t)
	t.Parallel()
	h := testenv.NewBinariesWith(t, distWithAgent)
	tok, err := h.Admin().CreateToken(ctx(t), api.TokenRequest{Region: "east", Site: "shop-7", Labels: map[string]string{"bank": "icbc"}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok.InstallLinux, "curl -fsSLk --pinnedpubkey 'sha256//") || !strings.Contains(tok.InstallWindows, "install.ps1") {
		t.Fatalf("token install lines: %q / %q", tok.InstallLinux, tok.InstallWindows)
	}
	// What the field engineer pastes (as root, so without sudo), twice:
	// installing again is safe.
	paste := strings.Replace(tok.InstallLinux, "sudo sh", "sh", 1) + ` --data "$WORK/agent" --name till-3 --labels room=back`
	stdin, out := inNamespace(t, paste+` || { tail -n 30 /var/log/edgebox-agent.err; exit 1; }
`+paste+` || exit 1
/usr/local/bin/edgebox-agent service status --data "$WORK/agent"
echo INSTALLED
read line
cp /usr/local/bin/edgebox-agent "$WORK/agent-bin"
"$WORK/agent-bin" uninstall --purge --data "$WORK/agent" || exit 1
"$WORK/agent-bin" uninstall --purge --data "$WORK/agent" || exit 1
rm -f "$WORK/agent-bin" "$WORK/edgebox-install.sh"
echo "LEFT:$(ls -A /usr/local/bin /etc/init.d /etc/rc0.d /etc/rc2.d /etc/rc6.d /var/log "$WORK" | grep -v -e ':$' -e '^$' | tr '\n' ' ')"
echo DONE
`)
	log := readUntil(t, out, "INSTALLED", 3*time.Minute)
	for _, want := range []string{"checksum verified", "[6/6] waiting for the box to come online", "online: till-3", "already enrolled as till-3", "edgebox-agent (unix-systemv): running"} {
		if !strings.Contains(log, want) {
			t.Fatalf("install output lacks %q:\n%s", want, log)
		}
	}
	boxes, err := h.Admin().Boxes(ctx(t))
	if err != nil || len(boxes) != 1 {
		t.Fatalf("boxes: %v %v", boxes, err)
	}
	b := boxes[0]
	if !b.Online || b.Name != "till-3" || b.Labels["bank"] != "icbc" || b.Labels["room"] != "back" {
		t.Fatalf("installed box: %+v", b)
	}
	fmt.Fprintln(stdin)
	log = readUntil(t, out, "DONE", time.Minute)
	if !strings.Contains(log, "removed /usr/local/bin/edgebox-agent") || !strings.Contains(log, "service is not installed") {
		t.Fatalf("uninstall, twice:\n%s", log)
	}
	if !strings.Contains(log, "LEFT:\n") {
		t.Fatalf("uninstall --purge left something behind:\n%s", log)
	}
	testenv.WaitFor(t, 20*time.Second, "box offline", func() bool {
		b, err := h.Admin().Box(ctx(t), "till-3")
		return err == nil && !b.Online
	})
}

// runRefused runs script in a namespace and returns its output, which must
// end in a failure, with nothing installed.
func runRefused(t *testing.T, script string) string {
	t.Helper()
	_, out := inNamespace(t, `(`+script+`) && echo "EXIT:0" || echo "EXIT:$?"
echo "LEFT:$(ls -A /usr/local/bin /etc/init.d /etc/rc2.d | grep -v -e ':$' -e '^$' | tr '\n' ' ')"
`)
	log := readUntil(t, out, "LEFT:", 2*time.Minute)
	if strings.Contains(log, "EXIT:0") {
		t.Fatalf("the install went through:\n%s", log)
	}
	if !strings.Contains(log, "LEFT:\n") {
		t.Fatalf("a refused install left files:\n%s", log)
	}
	return log
}

func TestInstallRefusesATamperedAgent(t *testing.T) {
	needRootAndUnshare(t)
	t.Parallel()
	var agentPath string
	h := testenv.NewBinariesWith(t, func(t testing.TB, dataDir, binDir string) {
		distWithAgent(t, dataDir, binDir)
		agentPath = filepath.Join(dataDir, "dist", "edgebox-agent-linux-"+runtime.GOARCH)
	})
	// The console fixed the checksums when it started; the binary changes
	// afterwards.
	f, err := os.OpenFile(agentPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte{0})
	f.Close()
	tok, err := h.Admin().CreateToken(ctx(t), api.TokenRequest{Region: "east", Site: "shop-7"})
	if err != nil {
		t.Fatal(err)
	}
	log := runRefused(t, strings.Replace(tok.InstallLinux, "sudo sh", "sh", 1)+` --data "$WORK/agent"`)
	if !strings.Contains(log, "SHA-256") || !strings.Contains(log, "nothing was installed") {
		t.Fatalf("no clear message:\n%s", log)
	}
}

func TestInstallRefusesAConsoleWithAnotherKey(t *testing.T) {
	needRootAndUnshare(t)
	t.Parallel()
	a := testenv.NewBinariesWith(t, distWithAgent)
	b := testenv.NewBinariesWith(t, distWithAgent)
	tok, err := a.Admin().CreateToken(ctx(t), api.TokenRequest{Region: "east", Site: "shop-7"})
	if err != nil {
		t.Fatal(err)
	}
	// The pasted line, sent to another console (a DNS or proxy mix-up, or
	// an impostor): curl refuses its key before anything is fetched.
	paste := strings.Replace(strings.Replace(tok.InstallLinux, a.URL(), b.URL(), 1), "sudo sh", "sh", 1)
	log := runRefused(t, paste)
	if !strings.Contains(log, "public key does not match") {
		t.Fatalf("curl did not refuse the other console's key:\n%s", log)
	}
	// The right script, pointed at the other console for its downloads.
	log = runRefused(t, strings.Replace(tok.InstallLinux, "sudo sh", "EDGEBOX_CONSOLE_URL="+b.URL()+" sh", 1))
	if !strings.Contains(log, "not the console this token was made for") {
		t.Fatalf("no clear message:\n%s", log)
	}
}

// TestInstallThroughAProxy installs a box at a proxy-only site: the
// downloads, the enrollment and the tunnel all go through the proxy given
// with --proxy, and the service keeps using it after a restart.
func TestInstallThroughAProxy(t *testing.T) {
	needRootAndUnshare(t)
	t.Parallel()
	h := testenv.NewBinariesWith(t, distWithAgent)
	px := toxic.NewConnectProxy(t, "edge", "s3cret")
	tok, err := h.Admin().CreateToken(ctx(t), api.TokenRequest{Region: "east", Site: "proxied"})
	if err != nil {
		t.Fatal(err)
	}
	// curl fetching install.sh takes the proxy from the environment, as a
	// field engineer's shell at such a site would have it.
	paste := "export https_proxy=http://edge:s3cret@" + px.Addr + "; " + strings.Replace(tok.InstallLinux, "sudo sh", "sh", 1) +
		` --data "$WORK/agent" --proxy http://edge:s3cret@` + px.Addr
	stdin, out := inNamespace(t, paste+` || { tail -n 30 /var/log/edgebox-agent.err; exit 1; }
echo INSTALLED
read line
/usr/local/bin/edgebox-agent service restart --data "$WORK/agent"
echo RESTARTED
read line
/usr/local/bin/edgebox-agent uninstall --purge --data "$WORK/agent"
echo DONE
`)
	log := readUntil(t, out, "INSTALLED", 3*time.Minute)
	if !strings.Contains(log, "online:") || !strings.Contains(log, "proxy: http://…@"+px.Addr) {
		t.Fatalf("install through the proxy:\n%s", log)
	}
	// install.sh, SHA256SUMS, the agent, the enrollment, the tunnel.
	if n := px.Used.Load(); n < 5 {
		t.Fatalf("the proxy carried %d connections, want every one (at least 5)", n)
	}
	before := px.Used.Load()
	fmt.Fprintln(stdin)
	readUntil(t, out, "RESTARTED", time.Minute)
	testenv.WaitFor(t, 30*time.Second, "the restarted service's tunnel through the proxy", func() bool {
		b, err := h.Admin().Boxes(ctx(t))
		return px.Used.Load() > before && err == nil && len(b) == 1 && b[0].Online
	})
	fmt.Fprintln(stdin)
	readUntil(t, out, "DONE", time.Minute)
}
