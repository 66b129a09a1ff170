package enroll

import (
	"errors"
	"strings"
	"testing"

	"github.com/edgebox/edgebox/errdefs"
)

// TestRefusalsAreInvalid: what a bad token or a bad request fails with is
// both the enroll error, for callers that ask which, and of kind Invalid,
// for the edges that map kinds to status codes.
func TestRefusalsAreInvalid(t *testing.T) {
	t.Parallel()
	_, _, _, badReq := DecodeRequest(strings.NewReader(`{"name": 7}`))
	_, badTok := ParseToken("ebx1.nope")
	tests := []struct {
		name     string
		err      error
		identity error
	}{
		{"bad request", badReq, ErrBadRequest},
		{"bad token", badTok, ErrBadToken},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if tt.err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(tt.err, tt.identity) {
				t.Errorf("errors.Is(%v, %v) = false", tt.err, tt.identity)
			}
			if k := errdefs.Kind(tt.err); k != errdefs.ErrInvalid {
				t.Errorf("kind of %v is %v, want %v", tt.err, k, errdefs.ErrInvalid)
			}
			if errors.Is(tt.err, ErrBadToken) && errors.Is(tt.err, ErrBadRequest) {
				t.Errorf("%v is both a bad token and a bad request", tt.err)
			}
		})
	}
}
