package recording

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/edgebox/edgebox/internal/test/require"
)

var t0 = time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)

// record writes a recording of chunks, one Flush each, and returns the
// summary and what was output.
func record(t testing.TB, dir, name string, chunks ...string) (Summary, string) {
	t.Helper()
	w, err := Create(dir, name, Header{Width: 80, Height: 24, Title: "box-1"}, t0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	for i, c := range chunks {
		w.Output(t0.Add(time.Duration(i)*time.Second), []byte(c))
		all.WriteString(c)
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	sum, err := w.Close()
	if err != nil {
		t.Fatal(err)
	}
	return sum, all.String()
}

func TestARecordingIsAsciicastV2AndVerifies(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir, "s1", Header{Width: 80, Height: 24, Env: map[string]string{"TERM": "xterm-256color"}}, t0, 0)
	if err != nil {
		t.Fatal(err)
	}
	// 世 is three bytes; the output cuts it in two.
	w.Output(t0.Add(100*time.Millisecond), []byte("$ echo hello \xe4\xb8"))
	w.Output(t0.Add(200*time.Millisecond), []byte("\x96\r\nhello\r\n"))
	w.Resize(t0.Add(300*time.Millisecond), 120, 40)
	w.Output(t0.Add(time.Second), []byte("\x1b[1mbold\x1b[0m\xff")) // ends with a byte that is no UTF-8
	sum, err := w.Close()
	if err != nil {
		t.Fatal(err)
	}
	cast, _ := Paths(dir, "s1")
	f, err := os.Open(cast)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan()
	var h Header
	if err := json.Unmarshal(sc.Bytes(), &h); err != nil || h.Version != 2 || h.Width != 80 || h.Timestamp != t0.Unix() {
		t.Fatalf("header %s: %+v %v", sc.Text(), h, err)
	}
	var out strings.Builder
	var codes []string
	last := -1.0
	for sc.Scan() {
		var ev []any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || len(ev) != 3 {
			t.Fatalf("event %s: %v", sc.Text(), err)
		}
		at := ev[0].(float64)
		if at < last {
			t.Fatalf("time went back: %s", sc.Text())
		}
		last = at
		codes = append(codes, ev[1].(string))
		if ev[1] == "o" {
			out.WriteString(ev[2].(string))
		}
	}
	if got, want := out.String(), "$ echo hello 世\r\nhello\r\n\x1b[1mbold\x1b[0m\ufffd"; got != want {
		t.Fatalf("output %q, want %q", got, want)
	}
	if strings.Join(codes, ",") != "o,o,r,o" {
		t.Fatalf("events %v", codes)
	}
	r, err := Verify(dir, "s1", sum.Head)
	if err != nil || !r.OK || r.Chunks != sum.Chunks || r.Unchained != 0 {
		t.Fatalf("verify: %+v %v (summary %+v)", r, err, sum)
	}
}

// TestAsciinemaPlaysIt: the recording is what the asciinema tool takes.
func TestAsciinemaPlaysIt(t *testing.T) {
	require.Tools(t, "asciinema", "asciinema")
	bin := "asciinema"
	dir := t.TempDir()
	_, want := record(t, dir, "play", "$ uname\r\n", "Linux\r\n", "$ exit\r\n")
	cast, _ := Paths(dir, "play")
	// asciinema wants a terminal.
	out, err := underPTY(exec.Command(bin, "cat", cast))
	if err != nil {
		t.Fatalf("asciinema cat: %v: %s", err, out)
	}
	if !bytes.Contains(out, []byte(want)) {
		t.Fatalf("asciinema cat printed %q, want %q", out, want)
	}
	if out, err := underPTY(exec.Command(bin, "play", "-i", "0.01", cast)); err != nil || !bytes.Contains(out, []byte("Linux")) {
		t.Fatalf("asciinema play: %v: %q", err, out)
	}
}

// underPTY runs cmd with a terminal and returns what it printed.
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

func TestAFlippedByteNamesItsChunk(t *testing.T) {
	dir := t.TempDir()
	sum, _ := record(t, dir, "flip", "one\r\n", "two\r\n", "three\r\n", "four\r\n")
	cast, _ := Paths(dir, "flip")
	b, _ := os.ReadFile(cast)
	i := bytes.Index(b, []byte("three"))
	b[i] ^= 0x20 // "Three"
	os.WriteFile(cast, b, 0o600)
	r, err := Verify(dir, "flip", sum.Head)
	if err != nil {
		t.Fatal(err)
	}
	// Chunk 0 is the header; "three" is the third output, chunk 3.
	if r.OK || r.BadChunk != 3 || r.Chunks != 3 || !strings.Contains(r.Problem, "chunk 3: altered") {
		t.Fatalf("verify after a flip: %+v", r)
	}
}

func TestAMissingChunkIsNamed(t *testing.T) {
	dir := t.TempDir()
	sum, _ := record(t, dir, "gap", "one\r\n", "two\r\n", "three\r\n")
	cast, chain := Paths(dir, "gap")

	// A chunk cut out of the middle of the .cast.
	links, _ := os.ReadFile(chain)
	var l link
	json.Unmarshal(bytes.Split(links, []byte("\n"))[2], &l)
	b, _ := os.ReadFile(cast)
	os.WriteFile(cast, append(b[:l.Offset:l.Offset], b[l.Offset+l.Length:]...), 0o600)
	if r, _ := Verify(dir, "gap", sum.Head); r.OK || r.BadChunk != 2 {
		t.Fatalf("a chunk cut out: %+v", r)
	}
	os.WriteFile(cast, b, 0o600)

	// A chain line dropped.
	lines := bytes.SplitAfter(links, []byte("\n"))
	os.WriteFile(chain, bytes.Join(append(lines[:2:2], lines[3:]...), nil), 0o600)
	if r, _ := Verify(dir, "gap", sum.Head); r.OK || r.BadChunk != 2 {
		t.Fatalf("a chain line dropped: %+v", r)
	}

	// The last chunk dropped from both files: the chain is consistent,
	// but the store's head says there was more.
	os.WriteFile(chain, bytes.Join(lines[:3], nil), 0o600)
	os.WriteFile(cast, b[:l.Offset+l.Length], 0o600)
	if r, _ := Verify(dir, "gap", ""); !r.OK || r.Chunks != 3 {
		t.Fatalf("cut at a chunk's end, no head to compare: %+v", r)
	}
	if r, _ := Verify(dir, "gap", sum.Head); r.OK || r.BadChunk != 3 || !strings.Contains(r.Problem, "missing") {
		t.Fatalf("cut at a chunk's end, against the head: %+v", r)
	}
}

// TestAKilledRecordingVerifiesToItsLastFlush: what a console killed in the
// middle of a flush leaves (a chunk written but not chained, a chain line
// torn) verifies up to the last chunk whose chain line is whole.
func TestAKilledRecordingVerifiesToItsLastFlush(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir, "killed", Header{Width: 80, Height: 24}, t0, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Output(t0, []byte("flushed\r\n"))
	w.Flush()
	// Not closed: the process dies here. Then the crash's leftovers.
	cast, chain := Paths(dir, "killed")
	f, _ := os.OpenFile(cast, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString("[5.0, \"o\", \"never chained\"]\n")
	f.Close()
	f, _ = os.OpenFile(chain, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"chunk":2,"offset":`)
	f.Close()
	r, err := Verify(dir, "killed", "")
	if err != nil || !r.OK || r.Chunks != 2 || r.Unchained == 0 {
		t.Fatalf("verify: %+v %v", r, err)
	}
}

func TestTheLimitStopsTheRecordingAndSaysSo(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir, "big", Header{Width: 80, Height: 24}, t0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		w.Output(t0.Add(time.Duration(i)*time.Millisecond), bytes.Repeat([]byte("x"), 100))
		w.Flush()
	}
	sum, err := w.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !sum.Truncated || sum.Bytes > 4096+200 {
		t.Fatalf("summary %+v", sum)
	}
	cast, _ := Paths(dir, "big")
	b, _ := os.ReadFile(cast)
	if !bytes.Contains(b, []byte("recording stopped")) {
		t.Fatalf("no marker in %q", b[len(b)-200:])
	}
	if r, _ := Verify(dir, "big", sum.Head); !r.OK {
		t.Fatalf("verify: %+v", r)
	}
}

func TestBadNamesAreRefused(t *testing.T) {
	for _, n := range []string{"", "../x", "a/b", ".hidden"} {
		if _, err := Create(t.TempDir(), n, Header{}, t0, 0); err == nil {
			t.Fatalf("name %q taken", n)
		}
	}
}

// FuzzVerifyRecording: whatever the files on disk hold (a recording
// tampered with, or torn), Verify reports, never panics, and never calls
// a recording intact that differs from what was written.
func FuzzVerifyRecording(f *testing.F) {
	dir := f.TempDir()
	record(f, dir, "seed", "one\r\n", "two\r\n")
	castPath, chainPath := Paths(dir, "seed")
	cast, _ := os.ReadFile(castPath)
	chain, _ := os.ReadFile(chainPath)
	f.Add(cast, chain)
	f.Add(cast[:len(cast)/2], chain)
	f.Add(cast, chain[:len(chain)-5])
	f.Add([]byte{}, []byte("\n\n"))
	f.Fuzz(func(t *testing.T, c, ch []byte) {
		d := t.TempDir()
		cp, chp := Paths(d, "seed")
		os.WriteFile(cp, c, 0o600)
		os.WriteFile(chp, ch, 0o600)
		r, err := Verify(d, "seed", "")
		if err != nil {
			t.Fatal(err)
		}
		// An intact verdict on the seed's own chain means its bytes are
		// the seed's, as far as the chain reaches.
		if r.OK && bytes.Equal(ch, chain) && !bytes.HasPrefix(c, cast) {
			t.Fatalf("altered bytes verified: %q", c)
		}
	})
}
