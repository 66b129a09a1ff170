package forwarding

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestForwardReply(t *testing.T) {
	var b bytes.Buffer
	WriteReply(&b, nil)
	if err := ReadReply(&b); err != nil {
		t.Fatal(err)
	}
	WriteReply(&b, errors.New("dial tcp 10.0.0.9:80: connection refused"))
	if err := ReadReply(&b); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("%v", err)
	}
	WriteReply(&b, errors.New(strings.Repeat("x", 5000)))
	if err := ReadReply(&b); err == nil || len(err.Error()) > MaxReason+100 {
		t.Fatalf("a long reason: %v", err)
	}
	for _, bad := range [][]byte{{}, {2}, {1, 0xff, 0xff}, {1, 0, 5, 'a'}} {
		if err := ReadReply(bytes.NewReader(bad)); err == nil || errors.Is(err, ErrRefused) {
			t.Fatalf("%v read as %v", bad, err)
		}
	}
}

func TestParseTarget(t *testing.T) {
	for in, ok := range map[string]bool{"127.0.0.1:80": true, "printer.lan:631": true, "[fe80::1]:22": true,
		"": false, "host": false, "host:0": false, "host:65536": false, ":80": false, "a b:80": false, "h/x:80": false} {
		if _, _, err := ParseTarget(in); (err == nil) != ok {
			t.Errorf("%q: %v", in, err)
		}
	}
}

// FuzzReadReply: whatever a box answers, the console reads a
// bounded reply or an error, never a panic.
func FuzzReadReply(f *testing.F) {
	f.Add([]byte{0})
	f.Add([]byte{1, 0, 3, 'a', 'b', 'c'})
	f.Add([]byte{1, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		err := ReadReply(bytes.NewReader(b))
		if err != nil && len(err.Error()) > MaxReason+200 {
			t.Fatalf("an error of %d bytes", len(err.Error()))
		}
	})
}
