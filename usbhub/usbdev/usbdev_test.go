package usbdev

import (
	"testing"
)

func TestParseConfig(t *testing.T) {
	// One interface (smart card) with a bulk pair and an interrupt IN, and
	// an alternate setting whose endpoint is not counted.
	b := []byte{9, 2, 0, 0, 1, 1, 0, 0x80, 50,
		9, 4, 0, 0, 3, 0x0B, 0, 0, 0,
		7, 5, 0x01, 2, 64, 0, 0,
		7, 5, 0x82, 2, 64, 0, 0,
		7, 5, 0x83, 3, 8, 0, 16,
		9, 4, 0, 1, 1, 0x0B, 0, 0, 0,
		7, 5, 0x84, 2, 64, 0, 0,
	}
	b[2] = byte(len(b))
	c, err := ParseConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	if c.Value != 1 || len(c.Interfaces) != 1 || c.Interfaces[0].Class != 0x0B || len(c.Endpoints) != 3 ||
		c.Endpoints[2] != (Endpoint{Address: 0x83, Type: 3, MaxPacketSize: 8, Interval: 16}) {
		t.Fatalf("%+v", c)
	}
	for name, bad := range map[string][]byte{
		"short":            b[:8],
		"total past end":   append([]byte{9, 2, 200, 0}, b[4:]...),
		"zero-length desc": append(append([]byte{}, b[:9]...), 0, 4),
	} {
		if name == "zero-length desc" {
			bad[2] = byte(len(bad))
		}
		if _, err := ParseConfig(bad); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte{9, 2, 16, 0, 1, 1, 0, 0x80, 50, 7, 5, 0x81, 3, 8, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig(b)
		if err == nil && (len(c.Interfaces) > 32 || len(c.Endpoints) > 30) {
			t.Fatalf("%d interfaces, %d endpoints", len(c.Interfaces), len(c.Endpoints))
		}
	})
}
