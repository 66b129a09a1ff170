package sitepeer

import "testing"

func TestHeartbeats(t *testing.T) {
	for _, hears := range []bool{false, true} {
		got, err := parseHeartbeat(heartbeat(hears))
		if err != nil || got != hears {
			t.Fatalf("heartbeat(%v) read back as %v, %v", hears, got, err)
		}
	}
	for _, bad := range [][]byte{nil, {0x10, 0}, {0x20}, {0x12}, {0x00}} {
		if _, err := parseHeartbeat(bad); err == nil {
			t.Errorf("%x read as a heartbeat", bad)
		}
	}
}

// FuzzParseHeartbeat: whatever a peer sends inside its association, the
// parse answers without panicking, and takes only what heartbeat makes.
func FuzzParseHeartbeat(f *testing.F) {
	f.Add([]byte{0x11})
	f.Add([]byte{0xff, 0xff})
	f.Fuzz(func(t *testing.T, p []byte) {
		hears, err := parseHeartbeat(p)
		if err == nil && string(heartbeat(hears)) != string(p) {
			t.Fatalf("took %x, which heartbeat does not make", p)
		}
	})
}
