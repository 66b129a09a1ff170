package agent

import (
	"context"
	"errors"

	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/errdefs/errgrpc"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Bounds on a logs answer.
const (
	defaultLogLines = 200
	maxLogLines     = 10000
	maxLogBytes     = 1 << 20
)

// Logs returns the end of a workload's output, from whichever driver holds
// it.
func (s *agentService) Logs(ctx context.Context, r *edgeboxv1.LogsRequest) (*edgeboxv1.LogsResponse, error) {
	name := r.GetWorkload()
	if !edgeboxv1.ValidObjectName(name) {
		return nil, errgrpc.ToGRPC(errdefs.Invalid("workload name %q is not valid", name))
	}
	tail := int(r.GetTail())
	if tail == 0 {
		tail = defaultLogLines
	}
	tail = min(tail, maxLogLines)
	for _, d := range s.drivers {
		if _, err := d.Inspect(ctx, name); errors.Is(err, errdefs.ErrNotFound) {
			continue
		} else if err != nil {
			return nil, errgrpc.ToGRPC(errdefs.Unavailable("%s: %w", d.Runtime(), err))
		}
		var w lastBytes
		if err := d.Logs(ctx, name, tail, &w); err != nil {
			return nil, errgrpc.ToGRPC(errdefs.Unavailable("logs of %s: %w", name, err))
		}
		return &edgeboxv1.LogsResponse{Text: w.buf, Truncated: w.cut}, nil
	}
	return nil, errgrpc.ToGRPC(errdefs.NotFound("no workload %q runs on this box", name))
}

// lastBytes keeps the last maxLogBytes written to it.
type lastBytes struct {
	buf []byte
	cut bool
}

func (w *lastBytes) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	if over := len(w.buf) - maxLogBytes; over > 0 {
		w.buf = append(w.buf[:0:0], w.buf[over:]...)
		w.cut = true
	}
	return len(p), nil
}
