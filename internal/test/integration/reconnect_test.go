package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgebox/edgebox/agent"
	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console"
	"github.com/edgebox/edgebox/internal/test/testenv"
	"github.com/edgebox/edgebox/internal/test/toxic"
	"github.com/edgebox/edgebox/tunnel"
)

// TestBoxesBackSoonAfterConsoleRestarts restarts the console three times,
// 10 s apart, with twenty boxes on the shipped backoff (1 s to 60 s). Each
// restart is a clean shutdown (the console says goodbye), a second of
// nothing (a console binary exiting and starting again), and a start. Every
// box must be online again within 10 s of the console being back after the
// last restart. Before the goodbye, and before a healthy session made a box
// forget its failures, each restart added to every box's backoff (sessions
// shorter than 60 s never reset it), and boxes waited up to a minute for a
// console that was up again.
//
// The odds, from the redial rules: a box that redials while the console is
// still down falls back to the 1 s, 2 s, 4 s … backoff. With the console
// back 1 s after its goodbye (the second of nothing; a start takes tens of
// milliseconds), a box takes over 10 s about once in 200,000 times, so this
// test fails about once in 10,000 runs; with the old rule, all twenty boxes
// made it about once in 100 runs (simulated, a million draws each).
//
// It is not parallel, so that other tests of this package do not share
// the two cores with it while it counts seconds.
func TestBoxesBackSoonAfterConsoleRestarts(t *testing.T) {
	const (
		boxes    = 20
		apart    = 10 * time.Second
		downtime = time.Second
		within   = 10 * time.Second
	)
	h := testenv.NewInProcess(t, testenv.Options{})
	tok := h.Token(t, api.TokenRequest{Region: "east", Site: "restarts", Uses: boxes})
	for i := range boxes {
		b, err := h.Enroll(t, tok, fmt.Sprintf("restart-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		testenv.StartAgent(t, b, func(c *agent.Config) {
			c.Backoff = tunnel.Backoff{} // the shipped 1 s to 60 s, and its rejoin window
		})
	}
	online := func() int {
		bs, err := h.Admin().Boxes(ctx(t))
		if err != nil {
			return 0
		}
		n := 0
		for _, b := range bs {
			if b.Online {
				n++
			}
		}
		return n
	}
	testenv.WaitFor(t, 60*time.Second, "every box online", func() bool { return online() == boxes })

	var back time.Time
	for i := range 3 {
		start := time.Now()
		h.StopConsole()
		time.Sleep(downtime)
		h.StartConsole(t)
		back = time.Now()
		t.Logf("restart %d: console down for %v", i+1, back.Sub(start).Round(time.Millisecond))
		if i < 2 {
			n := online()
			time.Sleep(time.Until(start.Add(apart)))
			t.Logf("restart %d: %d of %d boxes online 10 s later (%d right after it)", i+1, online(), boxes, n)
		}
	}
	deadline := back.Add(within)
	for online() < boxes {
		if time.Now().After(deadline) {
			var late []string
			if bs, err := h.Admin().Boxes(ctx(t)); err == nil {
				for _, b := range bs {
					if !b.Online {
						late = append(late, b.ID)
					}
				}
			}
			t.Fatalf("%d of %d boxes online %v after the console came back from its last restart; not back: %v (their redials are in the log)",
				boxes-len(late), boxes, within, late)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("every box online %v after the console came back from its last restart", time.Since(back).Round(time.Millisecond))
}

// TestRunProxyFlagAndWhereAProxyCameFrom runs the built agent at a site
// whose proxy wants a password. A wrong password in agent.json, or in
// --proxy, is named where it was set, in 'edgebox-agent status'; --proxy
// overrides agent.json for the run that has it.
func TestRunProxyFlagAndWhereAProxyCameFrom(t *testing.T) {
	t.Parallel()
	h := testenv.NewBinaries(t)
	px := toxic.NewConnectProxy(t, "edge", "s3cret")
	b, err := h.Enroll(t, h.Token(t, api.TokenRequest{Region: "east", Site: "proxied"}), "proxied")
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.WriteSettings(b.DataDir(), agent.Settings{Proxy: "http://edge:wrong@" + px.Addr}); err != nil {
		t.Fatal(err)
	}
	status := func() string {
		out, _ := exec.Command(filepath.Join(testenv.BuildBinaries(t), "edgebox-agent"), "status", "--data", b.DataDir()).CombinedOutput()
		return string(out)
	}
	tests := []struct {
		name string
		args []string
		says string
	}{
		{"agent.json", nil,
			`refused user "edge" (407 Proxy Authentication Required): proxy authentication failed; correct the user and password in the "proxy" setting in ` +
				filepath.Join(b.DataDir(), "agent.json")},
		{"--proxy", []string{"--proxy", "http://someone:wrong@" + px.Addr},
			`refused user "someone" (407 Proxy Authentication Required): proxy authentication failed; correct the user and password in the --proxy flag`},
	}
	for _, tt := range tests {
		testenv.StartAgentArgs(t, b, tt.args...)
		testenv.WaitFor(t, 30*time.Second, "status to name "+tt.name, func() bool { return strings.Contains(status(), tt.says) })
		if s := status(); strings.Contains(s, "HTTPS_PROXY") || strings.Contains(s, "wrong@") {
			t.Fatalf("%s: status points at HTTPS_PROXY or shows the password:\n%s", tt.name, s)
		}
		b.Stop(t)
	}
	if px.Used.Load() != 0 {
		t.Fatal("the proxy let a box through with the wrong password")
	}

	// --proxy with the right password beats agent.json's wrong one.
	testenv.StartAgentArgs(t, b, "--proxy", "http://edge:s3cret@"+px.Addr)
	testenv.WaitFor(t, 30*time.Second, "the box online through the proxy", func() bool {
		return testenv.BoxState(t, h, b.ID()).Online
	})
	if px.Used.Load() == 0 {
		t.Fatal("the box came online without the proxy")
	}
}

// TestTheConsoleAdvisesHowLongToTakeToReturn: a console that knows its
// pace (one box a second, from the rate file a storm leaves) tells each
// box, in its hello and its vitals receipts, to spread its return over
// the time it needs to greet every box it holds; the box's tunnel takes
// that window when it is longer than its own.
func TestTheConsoleAdvisesHowLongToTakeToReturn(t *testing.T) {
	t.Parallel()
	rate := filepath.Join(t.TempDir(), "rate")
	if err := os.WriteFile(rate, []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := testenv.NewInProcess(t, testenv.Options{Console: func(c *console.Config) {
		c.Admission.RateFile = rate
		c.Admission.RejoinMin = 100 * time.Millisecond
	}})
	tok := h.Token(t, api.TokenRequest{Region: "east", Site: "a", Uses: 2})
	start := func(name string) *agent.Agent {
		box, err := h.Enroll(t, tok, name)
		if err != nil {
			t.Fatal(err)
		}
		testenv.StartAgent(t, box, func(c *agent.Config) {
			c.Backoff = tunnel.Backoff{Min: 50 * time.Millisecond, Max: time.Minute}
			c.Rejoin = 200 * time.Millisecond
		})
		return testenv.AgentOf(box)
	}
	window := func(a *agent.Agent, want time.Duration) {
		t.Helper()
		testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("a rejoin window of %v", want), func() bool {
			return a.Tunnel().RejoinWindow() == want
		})
	}
	// One box at one a second: 1 s.
	a := start("first")
	window(a, time.Second)
	// A second box hears of both; the first, once it reconnects.
	b := start("second")
	window(b, 2*time.Second)
	h.Console().Tunnel().Drop(a.Status().BoxID)
	window(a, 2*time.Second)
}
