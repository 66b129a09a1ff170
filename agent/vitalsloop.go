package agent

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/edgebox/edgebox/agent/vitals"
	"github.com/edgebox/edgebox/errdefs/errgrpc"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// vitalsEvery is how often the box tells the console its vitals.
const vitalsEvery = time.Minute

// reportVitals tells the console the box's vitals each vitalsEvery, and
// at once whenever the tunnel comes back, until ctx ends. A console too
// old to take them is asked again only on a new session.
func (a *Agent) reportVitals(ctx context.Context, c edgeboxv1.ConsoleServiceClient) {
	r := vitals.NewReader(a.cfg.DataDir)
	r.Read() // the first CPU share needs an interval
	t := time.NewTicker(vitalsEvery)
	defer t.Stop()
	unwanted := false
	for {
		up := a.nextSession() // before the report: a session after it wakes the wait
		if !unwanted && a.isConnected() {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := c.ReportVitals(cctx, r.Read())
			cancel()
			switch {
			case err == nil:
			case status.Code(err) == codes.Unimplemented:
				unwanted = true
			default:
				a.log.Debug("vitals not reported", "err", errgrpc.ToNative(err))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-up:
			unwanted = false
		}
	}
}
