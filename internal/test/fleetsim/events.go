package fleetsim

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Kind is what happened to a box, as a child process reports it.
type Kind uint8

const (
	// Dial is one TCP dial towards the console, made or not.
	Dial Kind = iota + 1
	// ConnectFailed is one attempt at a session (dial, TLS, tunnel
	// handshake) that failed.
	ConnectFailed
	// Up is a tunnel session established: the console admitted the box.
	Up
	// Down is the end of that session.
	Down
	// Hello is the console's answer to the box's hello on the current
	// session.
	Hello
	// Stored is a Sync batch put on the box's disk; Rev is its revision.
	Stored
	// Gone marks a box whose process ended without stopping it (killed):
	// the parent records it, no child sends it.
	Gone
)

var kindNames = [...]string{Dial: "dial", ConnectFailed: "fail", Up: "up", Down: "down", Hello: "hello", Stored: "stored", Gone: "gone"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Why says why an attempt at a session failed, as far as the box can tell.
type Why uint8

const (
	WhyOther   Why = iota
	WhyBusy        // the console said when to come back
	WhyRefused     // nothing listened: the console was down
	WhyTimeout     // the dial or the handshake timed out
	WhyReset       // the connection was cut: reset, or closed early
	WhyTLS         // the TLS handshake failed with an alert
	numWhy
)

var whyNames = [numWhy]string{"other", "busy", "refused", "timeout", "reset", "tls"}

func (w Why) String() string {
	if w < numWhy {
		return whyNames[w]
	}
	return "why(" + strconv.Itoa(int(w)) + ")"
}

func whyOf(s string) (Why, bool) {
	for w, name := range whyNames {
		if name == s {
			return Why(w), true
		}
	}
	return 0, false
}

// Event is one thing that happened to box Box (its index in the fleet) at
// At, by the clock of the process that saw it (all run on this machine).
type Event struct {
	At   time.Time
	Kind Kind
	Box  int
	Rev  uint64 // Stored only
	Why  Why    // ConnectFailed only
}

// The lines a child writes on its event pipe, one a line:
//
//	id <box> <box-id>          the enrolled identity of box (after enrolment)
//	enrolled <count>           every box of the child is enrolled
//	<kind> <unix-ns> <box>     an event; Stored adds " <rev>", fail " <why>"
//	stopping                   the parent asked it to stop: what follows is not the console's doing
//	error <text>               the child failed and ends
//
// The parent trusts its children no more than it must: every line is
// checked and bounded.
const maxLine = 1024

// message is one parsed line.
type message struct {
	word  string // "id", "enrolled", "stopping", "error", or "event"
	ev    Event
	box   int
	count int
	text  string
}

var errBadLine = errors.New("fleetsim: bad line from a child")

// parseLine parses one line a child wrote; boxes in [first, first+n) are
// the child's.
func parseLine(line string, first, n int) (message, error) {
	if len(line) > maxLine {
		return message{}, fmt.Errorf("%w: %d bytes", errBadLine, len(line))
	}
	f := strings.Fields(line)
	if len(f) == 0 {
		return message{}, fmt.Errorf("%w: empty", errBadLine)
	}
	box := func(s string) (int, error) {
		i, err := strconv.Atoi(s)
		if err != nil || i < first || i >= first+n {
			return 0, fmt.Errorf("%w: box %q is not one of [%d, %d)", errBadLine, s, first, first+n)
		}
		return i, nil
	}
	switch f[0] {
	case "id":
		if len(f) != 3 || len(f[2]) > 128 {
			return message{}, fmt.Errorf("%w: %q", errBadLine, line)
		}
		i, err := box(f[1])
		return message{word: "id", box: i, text: f[2]}, err
	case "enrolled":
		if len(f) != 2 {
			return message{}, fmt.Errorf("%w: %q", errBadLine, line)
		}
		c, err := strconv.Atoi(f[1])
		if err != nil || c != n {
			return message{}, fmt.Errorf("%w: enrolled %q of %d", errBadLine, f[1], n)
		}
		return message{word: "enrolled", count: c}, nil
	case "stopping":
		return message{word: "stopping"}, nil
	case "error":
		return message{word: "error", text: strings.TrimSpace(strings.TrimPrefix(line, "error"))}, nil
	}
	k := kindOf(f[0])
	if k == 0 || k == Gone {
		return message{}, fmt.Errorf("%w: %q", errBadLine, line)
	}
	want := 3
	if k == Stored || k == ConnectFailed {
		want = 4
	}
	if len(f) != want {
		return message{}, fmt.Errorf("%w: %q", errBadLine, line)
	}
	ns, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || ns <= 0 {
		return message{}, fmt.Errorf("%w: time %q", errBadLine, f[1])
	}
	i, err := box(f[2])
	if err != nil {
		return message{}, err
	}
	ev := Event{At: time.Unix(0, ns), Kind: k, Box: i}
	switch k {
	case Stored:
		if ev.Rev, err = strconv.ParseUint(f[3], 10, 64); err != nil {
			return message{}, fmt.Errorf("%w: revision %q", errBadLine, f[3])
		}
	case ConnectFailed:
		var ok bool
		if ev.Why, ok = whyOf(f[3]); !ok {
			return message{}, fmt.Errorf("%w: failure %q", errBadLine, f[3])
		}
	}
	return message{word: "event", ev: ev}, nil
}

func kindOf(s string) Kind {
	for k, name := range kindNames {
		if name != "" && name == s {
			return Kind(k)
		}
	}
	return 0
}

// formatEvent is the line for ev, without its newline.
func formatEvent(ev Event) string {
	s := ev.Kind.String() + " " + strconv.FormatInt(ev.At.UnixNano(), 10) + " " + strconv.Itoa(ev.Box)
	switch ev.Kind {
	case Stored:
		s += " " + strconv.FormatUint(ev.Rev, 10)
	case ConnectFailed:
		s += " " + ev.Why.String()
	}
	return s
}
