package tunnel

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

var headerCases = []struct {
	name string
	h    Header
	ok   bool
}{
	{"rpc", Header{Kind: KindRPC}, true},
	{"forward with target", Header{Kind: KindForward, Meta: map[string]string{"target": "10.0.0.5:3389"}}, true},
	{"many keys", Header{Kind: KindVNC, Meta: map[string]string{"a": "1", "b": "", "workload": "robot-7"}}, true},
	{"empty kind", Header{}, false},
	{"upper-case kind", Header{Kind: "RPC"}, false},
	{"long kind", Header{Kind: Kind(strings.Repeat("a", MaxKindLen+1))}, false},
	{"long meta", Header{Kind: KindRPC, Meta: map[string]string{"k": strings.Repeat("v", MaxMetaLen)}}, false},
	{"empty key", Header{Kind: KindRPC, Meta: map[string]string{"": "v"}}, false},
}

func TestHeaderRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range headerCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := tc.h.MarshalBinary()
			if !tc.ok {
				if !errors.Is(err, ErrBadHeader) {
					t.Fatalf("MarshalBinary: got %v, want ErrBadHeader", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("MarshalBinary: %v", err)
			}
			got, err := ReadHeader(bytes.NewReader(b))
			if err != nil {
				t.Fatalf("ReadHeader: %v", err)
			}
			if got.Kind != tc.h.Kind || len(got.Meta) != len(tc.h.Meta) {
				t.Fatalf("got %+v, want %+v", got, tc.h)
			}
			for k, v := range tc.h.Meta {
				if got.Meta[k] != v {
					t.Fatalf("meta %q: got %q, want %q", k, got.Meta[k], v)
				}
			}
		})
	}
}

func TestReadHeaderRejects(t *testing.T) {
	t.Parallel()
	cases := map[string][]byte{
		"empty":               nil,
		"bad version":         {2, 3, 'r', 'p', 'c', 0, 0},
		"zero kind":           {1, 0, 0, 0},
		"truncated kind":      {1, 3, 'r'},
		"bad kind char":       {1, 3, 'r', '/', 'c', 0, 0},
		"meta too long":       {1, 3, 'r', 'p', 'c', 0xff, 0xff},
		"truncated meta":      {1, 3, 'r', 'p', 'c', 0, 5, 1, 'k'},
		"meta value past end": {1, 3, 'r', 'p', 'c', 0, 5, 1, 'k', 0, 9, 'v'},
		"duplicate key":       {1, 3, 'r', 'p', 'c', 0, 10, 1, 'k', 0, 1, 'v', 1, 'k', 0, 1, 'w'},
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if _, err := ReadHeader(bytes.NewReader(b)); !errors.Is(err, ErrBadHeader) {
				t.Fatalf("got %v, want ErrBadHeader", err)
			}
		})
	}
}

func FuzzReadHeader(f *testing.F) {
	for _, tc := range headerCases {
		if b, err := tc.h.MarshalBinary(); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte{1, 3, 'r', 'p', 'c', 0, 10, 1, 'k', 0, 1, 'v', 1, 'k', 0, 1, 'w'})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ReadHeader(bytes.NewReader(b))
		if err != nil {
			return
		}
		// Whatever we accept must encode back to something we accept.
		again, err := h.MarshalBinary()
		if err != nil {
			t.Fatalf("accepted header %+v does not marshal: %v", h, err)
		}
		h2, err := ReadHeader(bytes.NewReader(again))
		if err != nil || h2.Kind != h.Kind || len(h2.Meta) != len(h.Meta) {
			t.Fatalf("round trip changed %+v into %+v (%v)", h, h2, err)
		}
	})
}

func TestBackoffFullJitter(t *testing.T) {
	t.Parallel()
	top := func(n int64) int64 { return n - 1 }
	bottom := func(int64) int64 { return 0 }
	b := Backoff{Min: time1s, Max: 60 * time1s, Rand: top}
	want := []int{1, 2, 4, 8, 16, 32, 60, 60}
	for i, w := range want {
		if got := b.Delay(i); got != durationSeconds(w) {
			t.Errorf("Delay(%d) at the top of the range = %v, want %ds", i, got, w)
		}
	}
	b.Rand = bottom
	if got := b.Delay(5); got != 0 {
		t.Errorf("Delay at the bottom of the range = %v, want 0", got)
	}
	// With the real random source the waits spread over the range.
	b.Rand = nil
	var lo, hi int
	for range 1000 {
		if d := b.Delay(0); d < time1s/2 {
			lo++
		} else if d <= time1s {
			hi++
		} else {
			t.Fatalf("first retry after %v, over the 1s cap", d)
		}
	}
	if lo < 350 || hi < 350 {
		t.Errorf("first retries not spread: %d below 0.5s, %d above", lo, hi)
	}
}

func ExampleReadHeader() {
	b, _ := Header{Kind: KindForward, Meta: map[string]string{"target": "192.168.1.20:3389"}}.MarshalBinary()
	h, err := ReadHeader(bytes.NewReader(b))
	fmt.Println(h.Kind, h.Meta["target"], err, len(b))
	// Output: forward 192.168.1.20:3389 <nil> 37
}

func TestVerdicts(t *testing.T) {
	t.Parallel()
	busy := func(after time.Duration) []byte {
		var b bytes.Buffer
		writeBusy(&b, after)
		return b.Bytes()
	}
	refused := func(msg string) []byte {
		var b bytes.Buffer
		writeVerdict(&b, msg)
		return b.Bytes()
	}
	for _, c := range []struct {
		name  string
		in    []byte
		after time.Duration // for ErrBusy
		want  error
	}{
		{"ok", []byte{verdictOK}, 0, nil},
		{"refused", refused("revoked"), 0, ErrRefused},
		{"busy", busy(1500 * time.Millisecond), 1500 * time.Millisecond, ErrBusy},
		{"busy, too long a wait", busy(time.Hour), MaxRetryAfter, ErrBusy},
		{"busy, largest number", []byte{verdictBusy, 0xff, 0xff, 0xff, 0xff}, MaxRetryAfter, ErrBusy},
		{"busy, truncated", []byte{verdictBusy, 0, 1}, 0, ErrBusy},
		{"unknown", []byte{9}, 0, errors.New("unknown")},
		{"empty", nil, 0, errors.New("reading")},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := readVerdict(bytes.NewReader(c.in))
			switch {
			case c.want == nil:
				if err != nil {
					t.Fatalf("got %v", err)
				}
			case c.want == ErrBusy || c.want == ErrRefused:
				if !errors.Is(err, c.want) {
					t.Fatalf("got %v, want %v", err, c.want)
				}
				var b *BusyError
				if got := errors.As(err, &b); got != (c.after > 0) || got && b.RetryAfter != c.after {
					t.Fatalf("got %v (%+v), want a wait of %v", err, b, c.after)
				}
			default:
				if err == nil || !strings.Contains(err.Error(), c.want.Error()) {
					t.Fatalf("got %v, want an error saying %q", err, c.want)
				}
			}
		})
	}
}

func FuzzReadVerdict(f *testing.F) {
	f.Add([]byte{verdictOK})
	f.Add([]byte{verdictRefused, 3, 'a', 'b', 'c'})
	f.Add([]byte{verdictBusy, 0, 0, 5, 220})
	f.Fuzz(func(t *testing.T, b []byte) {
		err := readVerdict(bytes.NewReader(b))
		var busy *BusyError
		if errors.As(err, &busy) && (busy.RetryAfter < 0 || busy.RetryAfter > MaxRetryAfter) {
			t.Fatalf("a wait of %v passed the bound", busy.RetryAfter)
		}
	})
}
