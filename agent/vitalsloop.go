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

// vitalsEvery is how often the box tells the console its vitals. A report
// opens the agent's gRPC connection, which closes after RPCIdle without
// calls: each costs the console a tunnel stream and an HTTP/2 handshake.
// Every minute, that was most of what an idle fleet cost the console's CPU
// (2.4 ms a report; docs/benchmarks.md); vitals are for people, and five
// minutes old is fresh enough for them.
const vitalsEvery = 5 * time.Minute

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
			receipt, err := c.ReportVitals(cctx, r.Read())
			cancel()
			switch {
			case err == nil:
				a.tc.AdviseRejoin(msDuration(receipt.GetRejoinWindowMs()))
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
