package console

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/edgebox/edgebox/console/apps"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/pki"
	"github.com/edgebox/edgebox/enroll"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/errdefs/errgrpc"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
	"github.com/edgebox/edgebox/tunnel"
)

// consoleService answers agents. The box of every call is the one its
// tunnel certificate names, never a field of the message.
type consoleService struct {
	edgeboxv1.UnimplementedConsoleServiceServer
	fleet    *fleet.Fleet
	pki      *pki.Authority
	ttl      time.Duration
	log      *slog.Logger
	presence *presence
	apps     *apps.Apps
}

func boxOf(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", status.Error(codes.Unauthenticated, "no tunnel peer")
	}
	a, ok := p.Addr.(tunnel.Addr)
	if !ok || a.Peer == "" {
		return "", status.Error(codes.Unauthenticated, "not called over the tunnel")
	}
	return a.Peer, nil
}

// fail is what a handler returns for err: its gRPC status (errgrpc), the
// one mapping both sides use. An error outside the vocabulary goes without
// its text, so it is logged here.
func (s *consoleService) fail(method, box string, err error) error {
	if errdefs.Kind(err) == nil {
		s.log.Error("agent's call failed", "method", method, "box_id", box, "err", err)
	}
	return errgrpc.ToGRPC(err)
}

const maxFact = 256

func clip(s string) string {
	if len(s) > maxFact {
		return s[:maxFact]
	}
	return s
}

func (s *consoleService) Hello(ctx context.Context, req *edgeboxv1.HelloRequest) (*edgeboxv1.HelloResponse, error) {
	id, err := boxOf(ctx)
	if err != nil {
		return nil, err
	}
	info := req.GetInfo()
	b, err := s.fleet.ReportFacts(id, fleet.Facts{
		Hostname: clip(info.GetHostname()), OS: clip(info.GetOs()), Arch: clip(info.GetArch()),
		OSVersion: clip(info.GetOsVersion()), AgentVersion: clip(info.GetAgentVersion()),
		Capability: req.GetCapabilityVersion(), CPUs: info.GetCpus(), MemoryBytes: info.GetMemoryBytes(),
	}, time.Now())
	if err != nil {
		return nil, s.fail("Hello", id, err)
	}
	s.log.Info("box said hello", "box_id", id, "name", b.Name, "agent_version", b.AgentVersion, "capability", b.Capability)
	// A new box, or one back from a long absence, gets the apps pinned
	// where it stands before its Sync stream asks.
	if _, err := s.apps.SyncBox(ctx, b); err != nil {
		s.log.Warn("box's apps not brought up to date; the periodic sync retries", "box_id", id, "err", err)
	}
	return &edgeboxv1.HelloResponse{BoxId: id, Name: b.Name, Approved: b.State == fleet.StateApproved,
		ConsoleCapabilityVersion: CapabilityVersion, ConsoleVersion: Version}, nil
}

func (s *consoleService) Renew(ctx context.Context, req *edgeboxv1.RenewRequest) (*edgeboxv1.RenewResponse, error) {
	id, err := boxOf(ctx)
	if err != nil {
		return nil, err
	}
	csr, err := enroll.ParseCSRDER(req.GetCsr())
	if err != nil {
		return nil, s.fail("Renew", id, err)
	}
	certPEM, notAfter, err := s.pki.SignBox(csr, id, s.ttl)
	if err != nil {
		return nil, s.fail("Renew", id, err)
	}
	if err := s.fleet.Renewed(id, notAfter); err != nil {
		return nil, s.fail("Renew", id, err)
	}
	s.log.Info("box certificate renewed", "box_id", id, "not_after", notAfter)
	return &edgeboxv1.RenewResponse{CertificatePem: certPEM}, nil
}
