package main

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMain runs the command itself when the test binary is started again
// by a test with EDGEBOX_CONSOLE_ARGS set.
func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv("EDGEBOX_CONSOLE_ARGS"); ok {
		os.Args = append([]string{"edgebox-console"}, strings.Fields(args)...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestFailurePrintedWithNonZeroExit: when the console's Run fails, here
// because its port is taken, the command prints the error and exits 1.
func TestFailurePrintedWithNonZeroExit(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "EDGEBOX_CONSOLE_ARGS=--data "+t.TempDir()+" --listen "+taken.Addr().String())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("the command ended with %v, want exit status 1; stderr:\n%s", err, stderr.String())
	}
	if want := "edgebox-console: console: listen on " + taken.Addr().String(); !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr does not say %q:\n%s", want, stderr.String())
	}
}
