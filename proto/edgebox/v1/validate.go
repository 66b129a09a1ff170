package edgeboxv1

import (
	"fmt"
	"regexp"
)

// Object names: what both sides accept as the name of a desired object.
var objectNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$`)

// ValidObjectName reports whether name may name a desired object: 1-63
// lower-case letters, digits, '.', '_' or '-', starting and ending with a
// letter or digit.
func ValidObjectName(name string) bool { return objectNameRE.MatchString(name) }

// ValidKind reports whether kind may name a kind of desired object: 1-63
// ASCII letters and digits.
func ValidKind(kind string) bool {
	if kind == "" || len(kind) > 63 {
		return false
	}
	for _, r := range kind {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// CheckKey returns an error unless kind and name are valid.
func CheckKey(kind, name string) error {
	if !ValidKind(kind) {
		return fmt.Errorf("bad object kind %q", clipped(kind))
	}
	if !ValidObjectName(name) {
		return fmt.Errorf("bad object name %q", clipped(name))
	}
	return nil
}

func clipped(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
