//go:build !windows

// The commands here are POSIX; the Windows code (ConPTY) is cross-built.

package session

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

type service struct {
	edgeboxv1.UnimplementedAgentServiceServer
	s *Server
}

func (v service) Exec(st edgeboxv1.AgentService_ExecServer) error { return v.s.Exec(st) }

// serve runs a Server behind a real gRPC server and returns a client.
func serve(t *testing.T, cfg Config) edgeboxv1.AgentServiceClient {
	t.Helper()
	ln := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	edgeboxv1.RegisterAgentServiceServer(srv, service{s: New(cfg)})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///agent", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return edgeboxv1.NewAgentServiceClient(conn)
}

// result is what a session printed and how it ended.
type result struct {
	stdout, stderr bytes.Buffer
	exit           *edgeboxv1.ExecExit
}

// start opens a session and checks that it started.
func start(t *testing.T, ctx context.Context, c edgeboxv1.AgentServiceClient, st *edgeboxv1.ExecStart) edgeboxv1.AgentService_ExecClient {
	t.Helper()
	s, err := c.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&edgeboxv1.ExecInput{Input: &edgeboxv1.ExecInput_Start{Start: st}}); err != nil {
		t.Fatal(err)
	}
	m, err := s.Recv()
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	if !m.GetStarted() {
		t.Fatalf("first output %v, want started", m)
	}
	return s
}

// collect reads a session to its end.
func collect(t *testing.T, s edgeboxv1.AgentService_ExecClient) *result {
	t.Helper()
	var r result
	for {
		m, err := s.Recv()
		if err != nil {
			t.Fatalf("before the exit: %v (stdout %q)", err, r.stdout.String())
		}
		switch o := m.GetOutput().(type) {
		case *edgeboxv1.ExecOutput_Stdout:
			r.stdout.Write(o.Stdout)
		case *edgeboxv1.ExecOutput_Stderr:
			r.stderr.Write(o.Stderr)
		case *edgeboxv1.ExecOutput_Exit:
			r.exit = o.Exit
			return &r
		}
	}
}

func input(p string) *edgeboxv1.ExecInput {
	return &edgeboxv1.ExecInput{Input: &edgeboxv1.ExecInput_Stdin{Stdin: []byte(p)}}
}

func TestExecReturnsOutputAndExitCode(t *testing.T) {
	c := serve(t, Config{})
	s := start(t, t.Context(), c, &edgeboxv1.ExecStart{Command: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	s.CloseSend()
	r := collect(t, s)
	if r.stdout.String() != "out\n" || r.stderr.String() != "err\n" || r.exit.GetCode() != 3 {
		t.Fatalf("stdout %q stderr %q exit %v", r.stdout.String(), r.stderr.String(), r.exit)
	}
}

func TestInputReachesTheCommandAndItsEndIsEOF(t *testing.T) {
	c := serve(t, Config{})
	s := start(t, t.Context(), c, &edgeboxv1.ExecStart{Command: []string{"wc", "-c"}})
	big := strings.Repeat("x", 200<<10) // more than one message's worth, in several
	for i := 0; i < len(big); i += MaxStdin {
		s.Send(input(big[i:min(len(big), i+MaxStdin)]))
	}
	s.Send(&edgeboxv1.ExecInput{Input: &edgeboxv1.ExecInput_CloseStdin{CloseStdin: true}})
	r := collect(t, s)
	if got := strings.TrimSpace(r.stdout.String()); got != "204800" || r.exit.GetCode() != 0 {
		t.Fatalf("wc -c said %q, exit %v", got, r.exit)
	}
}

// readUntil reads output until it holds want.
func readUntil(t *testing.T, s edgeboxv1.AgentService_ExecClient, out *bytes.Buffer, want string) {
	t.Helper()
	for !strings.Contains(out.String(), want) {
		m, err := s.Recv()
		if err != nil {
			t.Fatalf("waiting for %q: %v (output %q)", want, err, out.String())
		}
		out.Write(m.GetStdout())
		if m.GetExit() != nil {
			t.Fatalf("waiting for %q: the session ended (%v), output %q", want, m.GetExit(), out.String())
		}
	}
}

func TestAShellSeesItsTerminalResized(t *testing.T) {
	c := serve(t, Config{})
	s := start(t, t.Context(), c, &edgeboxv1.ExecStart{Tty: true, Cols: 100, Rows: 30, Term: "xterm-256color",
		Command: []string{"sh"}})
	var out bytes.Buffer
	s.Send(input("stty size; echo TERM=$TERM\n"))
	readUntil(t, s, &out, "30 100")
	readUntil(t, s, &out, "TERM=xterm-256color")
	s.Send(&edgeboxv1.ExecInput{Input: &edgeboxv1.ExecInput_Resize{Resize: &edgeboxv1.ExecResize{Cols: 132, Rows: 43}}})
	s.Send(input("stty size\n"))
	readUntil(t, s, &out, "43 132")
	// ^C reaches the foreground command as the terminal's interrupt.
	s.Send(input("sleep 30; echo slept\n"))
	time.Sleep(300 * time.Millisecond)
	s.Send(&edgeboxv1.ExecInput{Input: &edgeboxv1.ExecInput_Signal{Signal: "INT"}})
	s.Send(input("echo after-$?\n"))
	readUntil(t, s, &out, "after-130")
	s.Send(input("exit 7\n"))
	r := collect(t, s)
	if r.exit.GetCode() != 7 || strings.Contains(out.String()+r.stdout.String(), "\nslept") {
		t.Fatalf("exit %v, output %q", r.exit, out.String()+r.stdout.String())
	}
}

func TestASignalEndsACommand(t *testing.T) {
	c := serve(t, Config{})
	s := start(t, t.Context(), c, &edgeboxv1.ExecStart{Command: []string{"sleep", "30"}})
	s.Send(&edgeboxv1.ExecInput{Input: &edgeboxv1.ExecInput_Signal{Signal: "TERM"}})
	r := collect(t, s)
	if r.exit.GetCode() != -1 || r.exit.GetSignal() != "TERM" {
		t.Fatalf("exit %v", r.exit)
	}
}

// TestAConsoleThatGoesEndsTheProcess: the call's end kills what runs.
func TestAConsoleThatGoesEndsTheProcess(t *testing.T) {
	c := serve(t, Config{MaxSessions: 1})
	ctx, cancel := context.WithCancel(t.Context())
	start(t, ctx, c, &edgeboxv1.ExecStart{Command: []string{"sleep", "30"}})
	cancel()
	// Its place is free again once the process has ended.
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := c.Exec(t.Context())
		if err == nil {
			s.Send(&edgeboxv1.ExecInput{Input: &edgeboxv1.ExecInput_Start{Start: &edgeboxv1.ExecStart{Command: []string{"true"}}}})
			if m, err := s.Recv(); err == nil && m.GetStarted() {
				collect(t, s)
				return
			} else if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
				t.Fatalf("after the first session's console went: %v %v", m, err)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestSessionsAreBounded(t *testing.T) {
	c := serve(t, Config{MaxSessions: 2})
	for range 2 {
		start(t, t.Context(), c, &edgeboxv1.ExecStart{Command: []string{"sleep", "30"}})
	}
	s, _ := c.Exec(t.Context())
	s.Send(&edgeboxv1.ExecInput{Input: &edgeboxv1.ExecInput_Start{Start: &edgeboxv1.ExecStart{Command: []string{"true"}}}})
	if _, err := s.Recv(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "already runs 2 sessions") {
		t.Fatalf("a third session: %v", err)
	}
}

func TestBadStartsAreRefused(t *testing.T) {
	c := serve(t, Config{})
	for name, st := range map[string]*edgeboxv1.ExecStart{
		"no start":        nil,
		"bad workload":    {Workload: "../etc"},
		"many arguments":  {Command: make([]string, MaxArgs+1)},
		"huge arguments":  {Command: []string{"echo", strings.Repeat("x", MaxArgBytes+1)}},
		"NUL":             {Command: []string{"echo", "a\x00b"}},
		"empty program":   {Command: []string{""}},
		"absurd terminal": {Tty: true, Cols: 100000, Rows: 24},
		"bad TERM":        {Tty: true, Term: "xterm\nrm -rf"},
	} {
		s, err := c.Exec(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		in := &edgeboxv1.ExecInput{Input: &edgeboxv1.ExecInput_Start{Start: st}}
		if st == nil {
			in = input("ls\n")
		}
		s.Send(in)
		if _, err := s.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
}

func TestNoWorkloadNoProgram(t *testing.T) {
	c := serve(t, Config{})
	for name, tc := range map[string]struct {
		st   *edgeboxv1.ExecStart
		code codes.Code
	}{
		"no such workload": {&edgeboxv1.ExecStart{Workload: "robot"}, codes.NotFound},
		"no such program":  {&edgeboxv1.ExecStart{Command: []string{"no-such-program-here"}}, codes.NotFound},
	} {
		s, _ := c.Exec(t.Context())
		s.Send(&edgeboxv1.ExecInput{Input: &edgeboxv1.ExecInput_Start{Start: tc.st}})
		if _, err := s.Recv(); status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %v", name, err, tc.code)
		}
	}
}

// TestInputNobodyReadsIsHeldBounded: a command that never reads its
// input takes a bounded amount of it; then the sender waits (gRPC's flow
// control), and the box holds no more. Another session runs meanwhile.
func TestInputNobodyReadsIsHeldBounded(t *testing.T) {
	c := serve(t, Config{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	s := start(t, ctx, c, &edgeboxv1.ExecStart{Command: []string{"sleep", "60"}})
	chunk := input(strings.Repeat("x", MaxStdin))
	sent := make(chan int, 1)
	go func() {
		n := 0
		for n < 100<<20 {
			if s.Send(chunk) != nil {
				break
			}
			n += MaxStdin
			select {
			case sent <- n:
			default:
				<-sent
				sent <- n
			}
		}
	}()
	// Let the sender run until it blocks.
	last, still := 0, 0
	for still < 10 {
		time.Sleep(100 * time.Millisecond)
		select {
		case n := <-sent:
			if n == last {
				still++
			} else {
				last, still = n, 0
			}
			sent <- n
		default:
			still++
		}
	}
	if last >= 16<<20 {
		t.Fatalf("%d MiB of unread input taken before the sender had to wait", last>>20)
	}
	t.Logf("the sender waited after %d KiB of input nobody read", last>>10)
	// Meanwhile another session on the same connection runs.
	s2 := start(t, t.Context(), c, &edgeboxv1.ExecStart{Command: []string{"echo", "still here"}})
	if r := collect(t, s2); r.stdout.String() != "still here\n" {
		t.Fatalf("the other session printed %q", r.stdout.String())
	}
	cancel()
	if _, err := s.Recv(); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("after cancelling: %v", err)
	}
}
