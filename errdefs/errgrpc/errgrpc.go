// Package errgrpc carries edgebox's error vocabulary (errdefs) across gRPC.
// ToGRPC is what every RPC handler, on the console and on the agent,
// returns; ToNative is what every caller does first with a call's error. A
// kind survives the trip both ways, and so does the message written for
// the operator; the cause stays on the side that had it.
//
//	errdefs kind     gRPC code
//	NotFound         NotFound
//	Conflict         FailedPrecondition (AlreadyExists, Aborted come back as Conflict)
//	Invalid          InvalidArgument (OutOfRange comes back as Invalid)
//	Permission       PermissionDenied (Unauthenticated comes back as Permission)
//	Unavailable      Unavailable
//	context errors   DeadlineExceeded, Canceled
package errgrpc

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/edgebox/edgebox/errdefs"
)

// Internal is the message an error outside the vocabulary is sent with:
// its text may say more than the other side should read, so the side that
// had it logs it.
const Internal = "internal error; the log of the side that failed says why"

// ToGRPC returns err as a gRPC status error for an RPC handler to return.
// A kinded error goes with its code and its own text; an error that already
// is a status goes as it is; a context error goes as Canceled or
// DeadlineExceeded; anything else goes as Internal, without its text.
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	if k := errdefs.Kind(err); k != nil {
		return status.Error(codeOf(k), err.Error())
	}
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, Internal)
}

func codeOf(kind error) codes.Code {
	switch kind {
	case errdefs.ErrNotFound:
		return codes.NotFound
	case errdefs.ErrConflict:
		return codes.FailedPrecondition
	case errdefs.ErrInvalid:
		return codes.InvalidArgument
	case errdefs.ErrPermission:
		return codes.PermissionDenied
	case errdefs.ErrUnavailable:
		return codes.Unavailable
	}
	return codes.Unknown
}

// ToNative returns a call's error in the vocabulary: its text is the
// status message the other side chose, errors.Is finds the kind its code
// maps to (context.DeadlineExceeded and context.Canceled for those codes),
// and status.Code still returns the code, so a caller can tell, say,
// Unimplemented from the rest. An error that is not a status is returned
// as it is.
func ToNative(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	r := &remote{st: st}
	switch st.Code() {
	case codes.NotFound:
		return errdefs.Wrap(errdefs.ErrNotFound, r)
	case codes.FailedPrecondition, codes.AlreadyExists, codes.Aborted:
		return errdefs.Wrap(errdefs.ErrConflict, r)
	case codes.InvalidArgument, codes.OutOfRange:
		return errdefs.Wrap(errdefs.ErrInvalid, r)
	case codes.PermissionDenied, codes.Unauthenticated:
		return errdefs.Wrap(errdefs.ErrPermission, r)
	case codes.Unavailable:
		return errdefs.Wrap(errdefs.ErrUnavailable, r)
	case codes.DeadlineExceeded:
		return &remote{st: st, is: context.DeadlineExceeded}
	case codes.Canceled:
		return &remote{st: st, is: context.Canceled}
	}
	return r
}

// remote is a status that came over the wire, as an error whose text is
// the status message. is, when set, is the context error it stands for.
type remote struct {
	st *status.Status
	is error
}

func (r *remote) Error() string              { return r.st.Message() }
func (r *remote) GRPCStatus() *status.Status { return r.st }
func (r *remote) Is(target error) bool       { return r.is != nil && target == r.is }
