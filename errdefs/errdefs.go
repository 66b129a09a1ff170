// Package errdefs is edgebox's small error vocabulary. Errors are wrapped
// with one of these at their source, with a message written for the person
// who will read it; exactly one function on each edge maps them to status
// codes (errgrpc for gRPC, the API's Status for HTTP).
//
// A kinded error keeps its cause: errors.Is and errors.As see through it to
// whatever it wraps, whether given to Wrap or formatted with %w.
package errdefs

import (
	"errors"
	"fmt"
)

// The kinds. Each kinded error satisfies errors.Is with exactly one of them.
var (
	ErrNotFound    = errors.New("not found")
	ErrConflict    = errors.New("conflict")
	ErrInvalid     = errors.New("invalid")
	ErrUnavailable = errors.New("unavailable")
	ErrPermission  = errors.New("permission denied")
)

// Kinds lists the kinds, for callers that map each one to something.
var Kinds = []error{ErrNotFound, ErrConflict, ErrInvalid, ErrUnavailable, ErrPermission}

// kinded carries a category and the error that says what happened: its
// text is the message for the user, and it is what Unwrap returns.
type kinded struct {
	kind error
	err  error
}

func (e *kinded) Error() string        { return e.err.Error() }
func (e *kinded) Is(target error) bool { return target == e.kind }
func (e *kinded) Unwrap() error        { return e.err }

// Wrap returns err as an error of kind (one of the Err* values above),
// with err's text. errors.Is and errors.As still find err and what it
// wraps. Wrap(kind, nil) is nil.
func Wrap(kind, err error) error {
	if err == nil {
		return nil
	}
	return &kinded{kind, err}
}

// NotFound, Conflict, Invalid, Unavailable and Permission build an error of
// that category whose text is exactly the formatted message. Like
// fmt.Errorf, a %w verb keeps its operand as the cause.
func NotFound(format string, a ...any) error { return &kinded{ErrNotFound, fmt.Errorf(format, a...)} }
func Conflict(format string, a ...any) error { return &kinded{ErrConflict, fmt.Errorf(format, a...)} }
func Invalid(format string, a ...any) error  { return &kinded{ErrInvalid, fmt.Errorf(format, a...)} }
func Permission(format string, a ...any) error {
	return &kinded{ErrPermission, fmt.Errorf(format, a...)}
}
func Unavailable(format string, a ...any) error {
	return &kinded{ErrUnavailable, fmt.Errorf(format, a...)}
}

// Kind returns the kind of err: the outermost one in its chain, so that
// Wrap(ErrConflict, notFound) is a conflict; nil for an error outside the
// vocabulary.
func Kind(err error) error {
	if err == nil {
		return nil
	}
	is, _ := err.(interface{ Is(error) bool })
	for _, k := range Kinds {
		if err == k || is != nil && is.Is(k) {
			return k
		}
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return Kind(u.Unwrap())
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if k := Kind(e); k != nil {
				return k
			}
		}
	}
	return nil
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
