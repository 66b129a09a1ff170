//go:build !windows

package main

import (
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"

	"github.com/edgebox/edgebox/api"
)

// followSize tells the session each new size of the local terminal.
func followSize(tty *os.File, s *api.Session) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-ch:
				if w, h, err := term.GetSize(int(tty.Fd())); err == nil {
					s.Resize(w, h)
				}
			}
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}

// forwardInterrupts passes ^C and termination to a session without a
// terminal, as ssh does.
func forwardInterrupts(s *api.Session) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case sig := <-ch:
				switch sig {
				case os.Interrupt:
					s.Signal("INT")
				case syscall.SIGTERM:
					s.Signal("TERM")
				case syscall.SIGHUP:
					s.Signal("HUP")
				case syscall.SIGQUIT:
					s.Signal("QUIT")
				}
			}
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}
