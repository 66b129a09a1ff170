//go:build windows

package main

import (
	"os"
	"os/signal"
	"time"

	"golang.org/x/term"

	"github.com/edgebox/edgebox/api"
)

// followSize tells the session each new size of the local console; a
// Windows console has no resize signal, so it is looked at twice a second.
func followSize(tty *os.File, s *api.Session) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		lw, lh, _ := term.GetSize(int(tty.Fd()))
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if w, h, err := term.GetSize(int(tty.Fd())); err == nil && (w != lw || h != lh) {
					lw, lh = w, h
					s.Resize(w, h)
				}
			}
		}
	}()
	return func() { close(done) }
}

// forwardInterrupts passes ^C to a session without a terminal.
func forwardInterrupts(s *api.Session) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-ch:
				s.Signal("INT")
			}
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}
