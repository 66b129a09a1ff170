// Package errdefs is edgebox's small error vocabulary. Errors are wrapped
// with one of these at their source, with a message written for the person
// who will read it; exactly one function on each edge (HTTP, gRPC) maps them
// to status codes.
package errdefs

import (
	"errors"
	"fmt"
)

var (
	ErrNotFound    = errors.New("not found")
	ErrConflict    = errors.New("conflict")
	ErrInvalid     = errors.New("invalid")
	ErrUnavailable = errors.New("unavailable")
	ErrPermission  = errors.New("permission denied")
)

// kinded carries a category and a message meant for the user.
type kinded struct {
	kind error
	msg  string
}

func (e *kinded) Error() string        { return e.msg }
func (e *kinded) Is(target error) bool { return target == e.kind }

// NotFound, Conflict, Invalid, Unavailable and Permission build an error of
// that category whose text is exactly the formatted message.
func NotFound(format string, a ...any) error { return &kinded{ErrNotFound, fmt.Sprintf(format, a...)} }
func Conflict(format string, a ...any) error { return &kinded{ErrConflict, fmt.Sprintf(format, a...)} }
func Invalid(format string, a ...any) error  { return &kinded{ErrInvalid, fmt.Sprintf(format, a...)} }
func Permission(format string, a ...any) error {
	return &kinded{ErrPermission, fmt.Sprintf(format, a...)}
}
func Unavailable(format string, a ...any) error {
	return &kinded{ErrUnavailable, fmt.Sprintf(format, a...)}
}

// Retryable is implemented by errors that may go away on their own.
type Retryable interface{ Retryable() bool }

// IsRetryable reports whether err says it is worth retrying; unavailable
// errors are.
func IsRetryable(err error) bool {
	var r Retryable
	if errors.As(err, &r) {
		return r.Retryable()
	}
	return errors.Is(err, ErrUnavailable)
}
