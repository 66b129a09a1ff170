//go:build linux

package integration

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console/recording"
	"github.com/edgebox/edgebox/internal/test/ctrdtest"
	"github.com/edgebox/edgebox/internal/test/require"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/internal/test/toxic"
)

// TestRemoteSessions runs remote maintenance sessions with the built
// binaries and a real containerd: commands on the box and in a container
// with their output and exit codes, an interactive shell driven through a
// PTY that follows a resize, and a console killed with SIGKILL in the
// middle of a session, whose recording then verifies up to its last
// flushed chunk and names a byte flipped in it.
func TestRemoteSessions(t *testing.T) {
	h := testenv.NewBinaries(t)
	sock := ctrdtest.Start(t)
	box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "shop"}), "remote-box")
	if err != nil {
		t.Fatal(err)
	}
	testenv.StartAgentArgs(t, box, "--containerd", sock, "--runc-root", ctrdtest.RuncRoot(sock))
	cli := func(args ...string) string {
		t.Helper()
		out, err := h.CLI(t, args...)
		if err != nil {
			t.Fatalf("edgebox %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	admin := h.Admin()
	testenv.WaitFor(t, time.Minute, "the box online", func() bool {
		b, err := admin.Box(ctx(t), box.ID())
		return err == nil && b.Online
	})
	img := mutate.Annotations(ctrdtest.BusyboxImg(t), map[string]string{"release": "1"}).(v1.Image)
	testenv.PushImage(t, h, "robots/robot:1", img)
	cli("app", "create", "robot")
	cli("release", "create", "--app", "robot", "--version", "1", "--image", testenv.RegistryHost(h)+"/robots/robot:1")
	cli("deploy", "robot@1", "--region", "east")
	testenv.WaitFor(t, 3*time.Minute, "robot running", func() bool {
		s, err := admin.AppStatus(ctx(t), "robot")
		return err == nil && len(s.Boxes) == 1 && s.Boxes[0].Phase == "Running"
	})

	// A command on the box and one in the container: output, error
	// output and exit code, as from ssh.
	exitCode := func(err error) int {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		return 0
	}
	out, err := h.CLI(t, "exec", box.ID(), "--", "sh", "-c", "echo on-the-box; echo oops >&2; exit 5")
	// (stdout and stderr are two streams: their lines may come in either order)
	if exitCode(err) != 5 || !strings.Contains(out, "on-the-box\n") || !strings.Contains(out, "oops\n") || len(out) != len("on-the-box\noops\n") {
		t.Fatalf("exec on the box: %v: %q", err, out)
	}
	out, err = h.CLI(t, "exec", box.ID(), "--workload", "robot", "--", "sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '; exit 3")
	if exitCode(err) != 3 || !strings.Contains(out, "sh") {
		t.Fatalf("exec in the container: %v: %q", err, out)
	}
	// The container's own file system, not the box's.
	out, err = h.CLI(t, "exec", box.ID(), "--workload", "robot", "--", "ls", "/usr/lib/os-release")
	if err == nil {
		t.Fatalf("the container sees the box's /usr/lib/os-release: %q", out)
	}

	// An interactive shell in the container, through a PTY, as a person
	// at a terminal runs it.
	sh := h.CLICommand(t, "shell", box.ID(), "--workload", "robot")
	var shErr lockedBuffer
	sh.Stderr = &shErr
	tty, err := pty.StartWithSize(sh, &pty.Winsize{Rows: 24, Cols: 80})
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	screen := &lockedBuffer{}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := tty.Read(buf)
			screen.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	waitScreen := func(want string) {
		t.Helper()
		testenv.WaitFor(t, 30*time.Second, "the shell printing "+want, func() bool { return strings.Contains(screen.String(), want) })
	}
	tty.WriteString("stty size\r")
	waitScreen("24 80")
	pty.Setsize(tty, &pty.Winsize{Rows: 40, Cols: 120}) // the CLI hears SIGWINCH
	time.Sleep(200 * time.Millisecond)
	tty.WriteString("stty size\r")
	waitScreen("40 120")
	tty.WriteString("exit 4\r")
	done := make(chan error, 1)
	go func() { done <- sh.Wait() }()
	select {
	case err := <-done:
		if exitCode(err) != 4 {
			time.Sleep(100 * time.Millisecond)
			t.Fatalf("the shell's CLI ended with %v, want exit status 4; screen:\n%q\nstandard error: %s", err, screen.String(), shErr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the shell did not end; screen:\n%s", screen.String())
	}

	// An interrupt sent to a shell in the container reaches its
	// foreground job, as ^C at the terminal would: the shell itself
	// ignores it, and lives on.
	sig, err := admin.OpenSession(ctx(t), box.ID(), api.SessionOptions{Workload: "robot", TTY: true, Cols: 80, Rows: 24, Command: []string{"sh"}})
	if err != nil {
		t.Fatal(err)
	}
	var sigOut lockedBuffer
	go func() {
		for {
			f, err := sig.Recv()
			if err != nil {
				return
			}
			sigOut.Write(f.Payload)
		}
	}()
	sig.Write([]byte("sleep 300\n"))
	time.Sleep(time.Second) // the sleep in the foreground
	if err := sig.Signal("INT"); err != nil {
		t.Fatal(err)
	}
	// The shell lives on, and says how its job ended.
	sig.Write([]byte("echo alive-$((6*7))-$?\n"))
	for deadline := time.Now().Add(15 * time.Second); !strings.Contains(sigOut.String(), "alive-42-130"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after an interrupt, the shell in the container printed:\n%q", sigOut.String())
		}
	}
	sig.Close()

	// The console dies in the middle of a session.
	s, err := admin.OpenSession(ctx(t), box.ID(), api.SessionOptions{TTY: true, Cols: 80, Rows: 24, Command: []string{"sh"}})
	if err != nil {
		t.Fatal(err)
	}
	var seen bytes.Buffer
	var id string
	s.Write([]byte("echo marker-$((6*7))\n"))
	for !strings.Contains(seen.String(), "marker-42") {
		f, err := s.Recv()
		if err != nil {
			t.Fatalf("before the marker: %v (%q)", err, seen.String())
		}
		seen.Write(f.Payload)
		if f.Type == api.FrameStatus && id == "" {
			id = strings.Split(strings.Split(string(f.Payload), `"session":"`)[1], `"`)[0]
		}
	}
	time.Sleep(1500 * time.Millisecond) // at least one flush
	h.RestartConsole(t)                 // SIGKILL, and a new start
	// What was in flight may still arrive; then the connection is gone.
	for i := 0; ; i++ {
		if _, err := s.Recv(); err != nil {
			break
		}
		if i > 100 {
			t.Fatal("the session's connection lived through the console's death")
		}
	}
	var rec api.SessionRecord
	testenv.WaitFor(t, 30*time.Second, "the session's record ended", func() bool {
		ss, err := admin.Sessions(ctx(t), false, "")
		for _, r := range ss {
			if r.ID == id {
				rec = r
			}
		}
		return err == nil && rec.ID == id && !rec.Live()
	})
	if rec.EndedBy != "console stopped" {
		t.Fatalf("record %+v", rec)
	}
	dir := filepath.Join(h.DataDir(), "recordings", "default")
	rep, err := recording.Verify(dir, id, "")
	if err != nil || !rep.OK {
		t.Fatalf("the recording after SIGKILL: %+v %v", rep, err)
	}
	cast, _ := recording.Paths(dir, id)
	raw, _ := os.ReadFile(cast)
	if !bytes.Contains(raw, []byte("marker-42")) {
		t.Fatalf("the recording lost what was flushed before the kill:\n%s", raw)
	}
	if r, err := admin.VerifySession(ctx(t), id); err != nil || !r.OK {
		t.Fatalf("verify through the API: %+v %v", r, err)
	}
	// The auditor's copy plays.
	var dl bytes.Buffer
	if err := admin.SessionRecording(ctx(t), id, &dl); err != nil || !bytes.Equal(dl.Bytes(), raw) {
		t.Fatalf("download: %v (%d bytes, want %d)", err, dl.Len(), len(raw))
	}
	require.Tools(t, "asciinema", "asciinema")
	file := filepath.Join(t.TempDir(), "s.cast")
	os.WriteFile(file, dl.Bytes(), 0o600)
	if out, err := underPTY(exec.Command("asciinema", "play", "-i", "0.01", file)); err != nil || !bytes.Contains(out, []byte("marker-42")) {
		t.Fatalf("asciinema play: %v: %q", err, out)
	}
	// One byte flipped: the verifier names its chunk.
	i := bytes.Index(raw, []byte("marker-42"))
	raw[i] ^= 0x20
	os.WriteFile(cast, raw, 0o600)
	r, err := admin.VerifySession(ctx(t), id)
	if err != nil || r.OK || r.BadChunk < 1 || !strings.Contains(r.Problem, "altered") {
		t.Fatalf("verify after a flip: %+v %v", r, err)
	}
	out = cli("session", "ls")
	if !strings.Contains(out, id) || !strings.Contains(out, "console stopped") {
		t.Fatalf("session ls:\n%s", out)
	}

	// Port forwards: the box's own web page, a LAN host on the site's
	// allow list, and one that is not.
	testenv.WaitFor(t, time.Minute, "the box back online", func() bool {
		b, err := admin.Box(ctx(t), box.ID())
		return err == nil && b.Online
	})
	var leaked lockedBuffer // what the box's page was sent that it must not be
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leaked.Write([]byte(r.Header.Get("Authorization") + r.Header.Get("Cookie") + r.URL.Query().Get("tenant")))
		if r.URL.Path == "/old" {
			http.Redirect(w, r, "/new", http.StatusFound)
			return
		}
		http.SetCookie(w, &http.Cookie{Name: "router", Value: "x"})
		io.WriteString(w, "the box's own page")
	}))
	defer page.Close()
	lan := lanHost(t)
	cli("session", "rules", "set", "--forward-site", "shop="+lan)
	for target, want := range map[string]string{strings.TrimPrefix(page.URL, "http://"): "the box's own page", lan: "a LAN host's page"} {
		fw := h.CLICommand(t, "port-forward", box.ID(), "0:"+target)
		stdout, _ := fw.StdoutPipe()
		var fwErr lockedBuffer
		fw.Stderr = &fwErr
		if err := fw.Start(); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil {
			t.Fatalf("port-forward to %s: %v; %s", target, err, fwErr.String())
		}
		local := strings.Fields(line)[1] // "forwarding 127.0.0.1:N to …"
		hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
		for i := range 3 { // a connection each
			resp, err := hc.Get("http://" + local + "/")
			if err != nil {
				t.Fatalf("GET %d through the forward to %s: %v; %s", i, target, err, fwErr.String())
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(body), want) {
				t.Fatalf("through the forward to %s: %q", target, body)
			}
		}
		fw.Process.Signal(os.Interrupt)
		fw.Wait()
	}
	// The box's own page in the browser, under the console's origin.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(h.CAPEM())
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(page.URL, "http://"))
	web := func(p string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, h.URL()+"/api/v1/boxes/"+box.ID()+"/web/"+port+p, nil)
		req.Header.Set("Authorization", "Bearer "+h.AdminToken())
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := web("/index.html?tenant=default")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "the box's own page" || !strings.HasPrefix(resp.Header.Get("Content-Security-Policy"), "sandbox") ||
		resp.Header.Get("Set-Cookie") != "" || leaked.String() != "" {
		t.Fatalf("the box's page: %d %q, CSP %q, Set-Cookie %q, the page was sent %q", resp.StatusCode, body,
			resp.Header.Get("Content-Security-Policy"), resp.Header.Get("Set-Cookie"), leaked.String())
	}
	if resp := web("/old"); resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/api/v1/boxes/"+box.ID()+"/web/"+port+"/new" {
		t.Fatalf("a redirect on the box's page: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}

	host, _, _ := strings.Cut(lan, ":")
	out, err = h.CLI(t, "port-forward", box.ID(), "0:"+host+":8081")
	if err == nil || !strings.Contains(out, "not on the forward allow list") {
		t.Fatalf("a target off the allow list: %v: %s", err, out)
	}
	testenv.WaitFor(t, 10*time.Second, "the forwards' records", func() bool {
		ss, _ := admin.Sessions(ctx(t), false, "")
		n := 0
		for _, r := range ss {
			if r.Kind == "forward" && !r.Live() && r.Conns == 3 && r.BytesOut > 0 {
				n++
			}
		}
		return n == 2
	})
}

// lanHost is an HTTP server in a network namespace of its own, joined to
// this host by a veth pair: a host on the box's LAN. It returns its
// address.
func lanHost(t *testing.T) string {
	t.Helper()
	require.Root(t, "a LAN host in a network namespace")
	require.Tools(t, "iproute2", "ip")
	require.Tools(t, "busybox-static", "busybox")
	var r [2]byte
	rand.Read(r[:])
	tag := hex.EncodeToString(r[:])
	ns, hostIf, nsIf := "ebxlan"+tag, "ebl"+tag, "ebn"+tag
	subnet := fmt.Sprintf("10.199.%d", 1+int(r[0])%250)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	run("ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	run("ip", "link", "add", hostIf, "type", "veth", "peer", "name", nsIf)
	t.Cleanup(func() { exec.Command("ip", "link", "del", hostIf).Run() })
	run("ip", "link", "set", nsIf, "netns", ns)
	run("ip", "addr", "add", subnet+".1/24", "dev", hostIf)
	run("ip", "link", "set", hostIf, "up")
	run("ip", "netns", "exec", ns, "ip", "addr", "add", subnet+".2/24", "dev", nsIf)
	run("ip", "netns", "exec", ns, "ip", "link", "set", nsIf, "up")
	run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
	www := t.TempDir()
	os.WriteFile(filepath.Join(www, "index.html"), []byte("a LAN host's page\n"), 0o644)
	addr := subnet + ".2:8080"
	srv := exec.Command("ip", "netns", "exec", ns, "busybox", "httpd", "-f", "-p", addr, "-h", www)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	testenv.WaitFor(t, 10*time.Second, "the LAN host's web server", func() bool {
		resp, err := http.Get("http://" + addr + "/")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	return addr
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// underPTY runs cmd with a terminal (asciinema wants one) and returns what
// it printed.
func underPTY(cmd *exec.Cmd) ([]byte, error) {
	tty, err := pty.Start(cmd)
	if err != nil {
		return nil, err
	}
	defer tty.Close()
	var out bytes.Buffer
	done := make(chan struct{})
	go func() { defer close(done); out.ReadFrom(tty) }() // ends with EIO when cmd exits
	err = cmd.Wait()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
	return out.Bytes(), err
}

// TestCopyResumesAfterACut: a 50 MB file copied to a box and back
// through a link that cuts every connection after 20 MB: each copy goes
// on where it stopped, and arrives with the same SHA-256.
func TestCopyResumesAfterACut(t *testing.T) {
	h := testenv.NewBinaries(t)
	box, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "shop"}), "copy-box")
	if err != nil {
		t.Fatal(err)
	}
	box.Start(t)
	testenv.WaitFor(t, time.Minute, "the box online", func() bool {
		b, err := h.Admin().Box(ctx(t), box.ID())
		return err == nil && b.Online
	})
	proxy := toxic.New(t, strings.TrimPrefix(h.URL(), "https://"))
	conf := filepath.Join(t.TempDir(), "cli.json")
	cli := func(args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(h.Bin(), "edgebox"), args...)
		cmd.Env = append(os.Environ(), "EDGEBOX_CONFIG="+conf)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	blk, _ := pem.Decode(h.CAPEM())
	caSum := sha256.Sum256(blk.Bytes)
	if out, err := cli("login", "https://"+proxy.Addr(), "--token", h.AdminToken(), "--ca-sha256", hex.EncodeToString(caSum[:])); err != nil {
		t.Fatalf("login through the proxy: %v: %s", err, out)
	}
	data := make([]byte, 50<<20)
	rand.Read(data)
	want := sha256.Sum256(data)
	src := filepath.Join(t.TempDir(), "big.bin")
	os.WriteFile(src, data, 0o600)
	onBox := filepath.Join(t.TempDir(), "big.bin") // the agent runs on this machine

	if err := proxy.Add("cut-up", "limit_data", "upstream", `"bytes": 20971520`); err != nil {
		t.Fatal(err)
	}
	out, err := cli("cp", src, box.ID()+":"+onBox)
	if err != nil || strings.Count(out, "the copy stopped") < 2 || !strings.Contains(out, "copied") {
		t.Fatalf("cp to the box: %v:\n%s", err, out)
	}
	got, _ := os.ReadFile(onBox)
	if sha256.Sum256(got) != want {
		t.Fatalf("the box holds %d bytes with another SHA-256", len(got))
	}
	proxy.Remove("cut-up")

	if err := proxy.Add("cut-down", "limit_data", "downstream", `"bytes": 20971520`); err != nil {
		t.Fatal(err)
	}
	back := filepath.Join(t.TempDir(), "back.bin")
	out, err = cli("cp", box.ID()+":"+onBox, back)
	if err != nil || strings.Count(out, "the copy stopped") < 2 {
		t.Fatalf("cp from the box: %v:\n%s", err, out)
	}
	got, _ = os.ReadFile(back)
	if sha256.Sum256(got) != want {
		t.Fatalf("the copy back holds %d bytes with another SHA-256", len(got))
	}
	if _, err := os.Stat(back + ".edgebox-part"); !os.IsNotExist(err) {
		t.Fatal("the download's part is left")
	}
	// Every part of each copy is audited.
	entries, err := h.Admin().Audit(ctx(t), 100, "box/"+box.ID())
	if err != nil {
		t.Fatal(err)
	}
	var reads, writes int
	for _, e := range entries {
		switch e.Action {
		case "file.read":
			reads++
		case "file.write":
			writes++
		}
	}
	if writes < 3 || reads < 3 {
		t.Fatalf("audited %d writes and %d reads, want each copy's parts", writes, reads)
	}
}
