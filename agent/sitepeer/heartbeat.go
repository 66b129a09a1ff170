package sitepeer

import "fmt"

// A heartbeat is the one byte a box sends each peer every period, inside
// its DTLS association: a version in the high nibble, and a flag saying
// whether the sender hears the receiver (has had a heartbeat from it
// within three periods). The association authenticates the sender and
// keeps heartbeats from being replayed; the flag tells the receiver that
// its own association to the sender still works, or must be dialled
// again (the sender restarted and lost it).
const (
	heartbeatV1  = 0x10
	flagHearsYou = 0x01
	versionMask  = 0xF0
)

// heartbeat encodes one.
func heartbeat(hearsYou bool) []byte {
	b := byte(heartbeatV1)
	if hearsYou {
		b |= flagHearsYou
	}
	return []byte{b}
}

// parseHeartbeat reads one, refusing other versions, unknown flags and
// anything longer.
func parseHeartbeat(p []byte) (hearsYou bool, err error) {
	if len(p) != 1 {
		return false, fmt.Errorf("sitepeer: a heartbeat of %d bytes, want 1", len(p))
	}
	if p[0]&versionMask != heartbeatV1 {
		return false, fmt.Errorf("sitepeer: heartbeat version %#x, want %#x", p[0]&versionMask, heartbeatV1)
	}
	if p[0]&^(versionMask|flagHearsYou) != 0 {
		return false, fmt.Errorf("sitepeer: unknown heartbeat flags %#x", p[0]&^versionMask)
	}
	return p[0]&flagHearsYou != 0, nil
}
