// Package recording keeps terminal sessions as asciicast v2 files that
// `asciinema play` plays, written in chunks and hash-chained so that a
// change to a recording shows.
//
// A recording is two files side by side:
//
//	<name>.cast   the asciicast v2 stream: a header line, then one event
//	              line per output or resize
//	<name>.chain  one JSON line per chunk of the .cast: where it lies, the
//	              hash of the chunk before it, and its own hash,
//	              sha256(previous hash ‖ chunk bytes)
//
// The first chunk is the header line; the hash before it is derived from
// the recording's name, so a chunk cannot be moved to another recording
// unnoticed. Events are buffered and written as one chunk at each Flush,
// which the session calls at least every second: a console killed
// mid-session loses at most the last second. Each chunk is synced to disk
// before its chain line, so a chain line never names bytes that are not
// on disk.
package recording

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// Header is the asciicast v2 header.
type Header struct {
	Version   int               `json:"version"`
	Width     int               `json:"width"`
	Height    int               `json:"height"`
	Timestamp int64             `json:"timestamp,omitempty"`
	Title     string            `json:"title,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
}

// link is one line of the .chain file.
type link struct {
	Chunk  int    `json:"chunk"`
	Offset int64  `json:"offset"`
	Length int64  `json:"length"`
	Prev   string `json:"prev"`
	SHA256 string `json:"sha256"`
}

// Summary is what a closed recording holds.
type Summary struct {
	Chunks    int    `json:"chunks"`
	Bytes     int64  `json:"bytes"`     // of the .cast file
	Head      string `json:"head"`      // the last chunk's hash
	Truncated bool   `json:"truncated"` // output past MaxBytes was not recorded
}

// Paths returns the .cast and .chain files of the recording name in dir.
func Paths(dir, name string) (cast, chain string) {
	return filepath.Join(dir, name+".cast"), filepath.Join(dir, name+".chain")
}

// seed is the hash before a recording's first chunk.
func seed(name string) [sha256.Size]byte {
	return sha256.Sum256([]byte("edgebox recording v1\n" + name))
}

// Writer records one session. Its methods are safe for concurrent use.
type Writer struct {
	name     string
	maxBytes int64
	start    time.Time

	mu        sync.Mutex
	cast      *os.File
	chain     *os.File
	buf       []byte // events not yet flushed
	partial   []byte // the start of a UTF-8 sequence the next output ends
	off       int64  // bytes of cast on disk
	prev      [sha256.Size]byte
	chunks    int
	truncated bool
	last      time.Time // the last event's time
	err       error     // the first write error; the recording stops there
}

// Create starts the recording name in dir, which it makes if need be.
// name must be a plain file name. maxBytes bounds the .cast file: output
// past it is left out, and the recording says so with one last event.
func Create(dir, name string, h Header, start time.Time, maxBytes int64) (*Writer, error) {
	if name == "" || filepath.Base(name) != name || name[0] == '.' {
		return nil, fmt.Errorf("recording: bad name %q", name)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("recording: %w", err)
	}
	castPath, chainPath := Paths(dir, name)
	cast, err := os.OpenFile(castPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("recording: %w", err)
	}
	chain, err := os.OpenFile(chainPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		cast.Close()
		os.Remove(castPath)
		return nil, fmt.Errorf("recording: %w", err)
	}
	h.Version = 2
	h.Timestamp = start.Unix()
	line, err := json.Marshal(h)
	if err != nil {
		cast.Close()
		chain.Close()
		return nil, fmt.Errorf("recording: %w", err)
	}
	w := &Writer{name: name, maxBytes: maxBytes, start: start, cast: cast, chain: chain, prev: seed(name)}
	w.buf = append(append(w.buf, line...), '\n')
	if err := w.Flush(); err != nil {
		w.Close()
		return nil, err
	}
	// The directory entries are on disk too, so a crash leaves the files.
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return w, nil
}

// Output records what the session printed at time at.
func (w *Writer) Output(at time.Time, p []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	data := append(w.partial, p...)
	// Keep an unfinished UTF-8 sequence for the next output: JSON
	// strings are UTF-8, and a character cut in two would be replaced.
	cut := len(data)
	for i := len(data) - 1; i >= 0 && i >= len(data)-utf8.UTFMax; i-- {
		if utf8.RuneStart(data[i]) {
			if !utf8.FullRune(data[i:]) {
				cut = i
			}
			break
		}
	}
	w.partial = append([]byte(nil), data[cut:]...)
	if cut > 0 {
		w.event(at, "o", string(data[:cut]))
	}
}

// Resize records the terminal's new size.
func (w *Writer) Resize(at time.Time, cols, rows int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.event(at, "r", strconv.Itoa(cols)+"x"+strconv.Itoa(rows))
}

// Mark records a marker, such as who ended the session.
func (w *Writer) Mark(at time.Time, label string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.event(at, "m", label)
}

// event appends one event line. Hold w.mu.
func (w *Writer) event(at time.Time, code, data string) {
	if w.truncated || w.err != nil {
		return
	}
	// Times never go back, whatever the clock does.
	if at.Before(w.last) {
		at = w.last
	}
	w.last = at
	t := max(at.Sub(w.start), 0).Seconds()
	d, _ := json.Marshal(data) // a string always marshals
	line := fmt.Appendf(nil, "[%.6f, %q, %s]\n", t, code, d)
	if w.maxBytes > 0 && w.off+int64(len(w.buf))+int64(len(line)) > w.maxBytes {
		w.truncated = true
		m, _ := json.Marshal(fmt.Sprintf("recording stopped: it reached its limit of %d bytes", w.maxBytes))
		w.buf = fmt.Appendf(w.buf, "[%.6f, \"m\", %s]\n", t, m)
		return
	}
	w.buf = append(w.buf, line...)
}

// Flush writes the events so far as one chunk, synced, and its chain
// line. A recording that failed to write keeps its error.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.flush()
}

func (w *Writer) flush() error {
	if w.err != nil || len(w.buf) == 0 || w.cast == nil {
		return w.err
	}
	chunk := w.buf
	h := sha256.New()
	h.Write(w.prev[:])
	h.Write(chunk)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	l := link{Chunk: w.chunks, Offset: w.off, Length: int64(len(chunk)), Prev: hex.EncodeToString(w.prev[:]), SHA256: hex.EncodeToString(sum[:])}
	line, _ := json.Marshal(l)
	if _, err := w.cast.Write(chunk); err != nil {
		w.err = fmt.Errorf("recording: %w", err)
		return w.err
	}
	if err := w.cast.Sync(); err != nil {
		w.err = fmt.Errorf("recording: %w", err)
		return w.err
	}
	if _, err := w.chain.Write(append(line, '\n')); err != nil {
		w.err = fmt.Errorf("recording: %w", err)
		return w.err
	}
	if err := w.chain.Sync(); err != nil {
		w.err = fmt.Errorf("recording: %w", err)
		return w.err
	}
	w.off += int64(len(chunk))
	w.prev = sum
	w.chunks++
	w.buf = w.buf[:0]
	return nil
}

// Close flushes what is left and closes the files.
func (w *Writer) Close() (Summary, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.partial) > 0 {
		// An unfinished sequence at the end is output too (replaced).
		w.event(w.last, "o", string(w.partial))
		w.partial = nil
	}
	err := w.flush()
	if w.cast != nil {
		if cerr := w.cast.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("recording: %w", cerr)
		}
		if cerr := w.chain.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("recording: %w", cerr)
		}
		w.cast, w.chain = nil, nil
	}
	return Summary{Chunks: w.chunks, Bytes: w.off, Head: hex.EncodeToString(w.prev[:]), Truncated: w.truncated}, err
}

// Report is what Verify found.
type Report struct {
	// Chunks is how many chunks verified, from the first.
	Chunks int `json:"chunks"`
	// OK: every chunk the chain names is intact and in order, and,
	// when a head was given, the last one is it.
	OK bool `json:"ok"`
	// Problem says what is wrong, naming the first bad chunk; empty if OK.
	Problem string `json:"problem,omitempty"`
	// BadChunk is the first chunk that is altered or missing; -1 if none.
	BadChunk int `json:"bad_chunk"`
	// Unchained is how many bytes of the .cast lie after the last
	// chained chunk: written as the console stopped, never verified.
	Unchained int64 `json:"unchained_bytes,omitempty"`
	// Head is the last verified chunk's hash.
	Head string `json:"head"`
}

// maxChainLine bounds one chain line when reading.
const maxChainLine = 512

// Verify checks the recording name in dir. head, when not empty, is the
// last chunk's hash as the console's store holds it (Summary.Head), so a
// recording cut short, or rewritten with a chain to match, shows too.
func Verify(dir, name, head string) (Report, error) {
	castPath, chainPath := Paths(dir, name)
	cast, err := os.Open(castPath)
	if err != nil {
		return Report{}, err
	}
	defer cast.Close()
	chainData, err := os.ReadFile(chainPath)
	if err != nil {
		return Report{}, err
	}
	st, err := cast.Stat()
	if err != nil {
		return Report{}, err
	}
	r := Report{BadChunk: -1}
	prev := seed(name)
	var off int64
	bad := func(k int, format string, args ...any) (Report, error) {
		r.BadChunk, r.Problem = k, fmt.Sprintf("chunk %d: ", k)+fmt.Sprintf(format, args...)
		r.Head = hex.EncodeToString(prev[:])
		return r, nil
	}
	lines := splitLines(chainData)
	for k, raw := range lines {
		var l link
		if len(raw) > maxChainLine || json.Unmarshal(raw, &l) != nil {
			if k == len(lines)-1 && chainData[len(chainData)-1] != '\n' {
				break // the last line, torn by a crash: its chunk was never confirmed
			}
			return bad(k, "its chain line is damaged")
		}
		switch {
		case l.Chunk != k:
			return bad(k, "the chain names chunk %d here: a chunk is missing or out of order", l.Chunk)
		case l.Offset != off || l.Length <= 0 || l.Length > st.Size():
			return bad(k, "the chain puts it at %d+%d, where %d was expected: a chunk before it is missing", l.Offset, l.Length, off)
		case l.Prev != hex.EncodeToString(prev[:]):
			return bad(k, "it does not follow the chunk before it")
		case off+l.Length > st.Size():
			return bad(k, "missing: the recording ends at byte %d", st.Size())
		}
		chunk := make([]byte, l.Length)
		if _, err := cast.ReadAt(chunk, off); err != nil {
			return Report{}, err
		}
		h := sha256.New()
		h.Write(prev[:])
		h.Write(chunk)
		var sum [sha256.Size]byte
		h.Sum(sum[:0])
		if hex.EncodeToString(sum[:]) != l.SHA256 {
			return bad(k, "altered: its bytes (%d to %d) do not match their hash", off, off+l.Length)
		}
		prev, off = sum, off+l.Length
		r.Chunks++
	}
	r.Head = hex.EncodeToString(prev[:])
	r.Unchained = st.Size() - off
	if head != "" && head != r.Head {
		return bad(r.Chunks, "missing: the console recorded a later last chunk than the chain holds")
	}
	if r.Chunks == 0 {
		r.Problem = "no chunk was ever written"
		return r, nil
	}
	r.OK = true
	return r, nil
}

func splitLines(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		i := 0
		for i < len(b) && b[i] != '\n' {
			i++
		}
		out = append(out, b[:i])
		if i == len(b) {
			break
		}
		b = b[i+1:]
	}
	return out
}
