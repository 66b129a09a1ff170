package errdefs_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"testing"

	"github.com/edgebox/edgebox/errdefs"
)

// TestKindsKeepTheirCause: a kinded error is of its kind, reads as its
// message, and errors.Is and errors.As still reach what it wraps.
func TestKindsKeepTheirCause(t *testing.T) {
	t.Parallel()
	_, cause := os.Open("/nonexistent/edgebox")
	tests := []struct {
		name string
		err  error
		kind error
		msg  string
	}{
		{"wrap", errdefs.Wrap(errdefs.ErrNotFound, cause), errdefs.ErrNotFound, cause.Error()},
		{"format with %w", errdefs.Invalid("spec: %w", cause), errdefs.ErrInvalid, "spec: " + cause.Error()},
		{"wrapped again by fmt", fmt.Errorf("box b1: %w", errdefs.Unavailable("runtime: %w", cause)), errdefs.ErrUnavailable, "box b1: runtime: " + cause.Error()},
		{"conflict", errdefs.Conflict("taken: %w", cause), errdefs.ErrConflict, "taken: " + cause.Error()},
		{"permission", errdefs.Wrap(errdefs.ErrPermission, cause), errdefs.ErrPermission, cause.Error()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if !errors.Is(tt.err, tt.kind) {
				t.Errorf("errors.Is(%v, %v) = false", tt.err, tt.kind)
			}
			if k := errdefs.Kind(tt.err); k != tt.kind {
				t.Errorf("Kind = %v, want %v", k, tt.kind)
			}
			if tt.err.Error() != tt.msg {
				t.Errorf("message %q, want %q", tt.err.Error(), tt.msg)
			}
			if !errors.Is(tt.err, fs.ErrNotExist) {
				t.Errorf("errors.Is(%v, fs.ErrNotExist) = false: the cause is lost", tt.err)
			}
			var pe *fs.PathError
			if !errors.As(tt.err, &pe) || pe.Path != "/nonexistent/edgebox" {
				t.Errorf("errors.As(%v, *fs.PathError) = %v: the cause is lost", tt.err, pe)
			}
		})
	}
}

func TestKind(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"nil", nil, nil},
		{"outside the vocabulary", errors.New("x"), nil},
		{"a kind itself", errdefs.ErrPermission, errdefs.ErrPermission},
		{"a kind wrapped by fmt", fmt.Errorf("x: %w", errdefs.ErrConflict), errdefs.ErrConflict},
		{"the outermost kind wins", errdefs.Wrap(errdefs.ErrConflict, errdefs.NotFound("gone")), errdefs.ErrConflict},
		{"in a join", errors.Join(errors.New("a"), errdefs.Unavailable("b")), errdefs.ErrUnavailable},
		{"%v flattens", errdefs.Invalid("%v", errdefs.NotFound("gone")), errdefs.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := errdefs.Kind(tt.err); got != tt.want {
				t.Errorf("Kind(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
	if errdefs.Wrap(errdefs.ErrInvalid, nil) != nil {
		t.Error("Wrap(kind, nil) is not nil")
	}
}

func TestIsRetryable(t *testing.T) {
	t.Parallel()
	if !errdefs.IsRetryable(errdefs.Unavailable("down")) {
		t.Error("unavailable is not retryable")
	}
	if errdefs.IsRetryable(errdefs.Invalid("bad")) {
		t.Error("invalid is retryable")
	}
}
