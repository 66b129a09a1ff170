// Package agentrpc is the console's side of the agent⇄console gRPC
// contract: the ConsoleService boxes call over their tunnel (hello,
// certificate renewal), and the calls the console makes to a box's
// AgentService (logs, wipe, ping).
package agentrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"time"

	"google.golang.org/grpc"
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

// Config is what the ConsoleService needs.
type Config struct {
	Fleet *fleet.Fleet
	PKI   *pki.Authority
	Apps  *apps.Apps
	// Agents writes a box's AgentRelease object from the agent pins; nil
	// writes none.
	Agents interface {
		SyncBox(ctx context.Context, b fleet.Box) error
	}
	// Sites takes the boxes' votes on their site peers, and lists each
	// box's peers when its facts change; nil takes none.
	Sites interface {
		Vote(ctx context.Context, box string, r *edgeboxv1.VoteReport) (*edgeboxv1.VoteReceipt, error)
		SyncSite(ctx context.Context, b fleet.Box) error
	}
	// Vitals keeps what boxes report of themselves; nil keeps nothing.
	Vitals interface {
		Put(box string, v *edgeboxv1.Vitals, at time.Time) error
	}
	// Rejoin returns the window boxes are told to spread their return
	// over should their sessions break (admission.Controller.Rejoin), in
	// each hello and vitals receipt; nil tells none.
	Rejoin func() time.Duration
	// BoxCertTTL is the lifetime of the certificates Renew signs.
	BoxCertTTL time.Duration
	// Version and CapabilityVersion are the console's, told to each box
	// in its hello.
	Version           string
	CapabilityVersion uint32
	// BeforeHello, for fault-injection tests, runs before a hello is
	// answered; its error fails the hello. Nil in production.
	BeforeHello func(ctx context.Context, box string) error
}

// Server serves the ConsoleService to boxes over the tunnel's "rpc"
// streams.
type Server struct {
	grpc *grpc.Server
	l    net.Listener
}

// NewServer returns the ConsoleService of cfg on l, the tunnel's "rpc"
// streams. It starts nothing.
func NewServer(cfg Config, l net.Listener, log *slog.Logger) *Server {
	// gRPC's 32 KiB read buffer per connection would be most of an idle
	// box's cost; tunnel streams are buffered already. The write buffer is
	// shared and released after each flush.
	g := grpc.NewServer(grpc.MaxRecvMsgSize(1<<20), grpc.ReadBufferSize(0), grpc.SharedWriteBuffer(true))
	edgeboxv1.RegisterConsoleServiceServer(g, &consoleService{cfg: cfg, log: log.With("component", "agentrpc")})
	return &Server{grpc: g, l: l}
}

// Run serves until ctx ends, then stops at once (closing the listener and
// every call) and returns nil; it returns the error of a listener that
// fails before.
func (s *Server) Run(ctx context.Context) error {
	served := make(chan error, 1)
	go func() { served <- s.grpc.Serve(s.l) }()
	select {
	case err := <-served:
		s.grpc.Stop()
		if err == nil {
			err = errors.New("stopped serving")
		}
		return fmt.Errorf("agent RPC: %w", err)
	case <-ctx.Done():
		s.grpc.Stop()
		<-served
		return nil
	}
}

// consoleService answers agents. The box of every call is the one its
// tunnel certificate names, never a field of the message.
type consoleService struct {
	edgeboxv1.UnimplementedConsoleServiceServer
	cfg Config
	log *slog.Logger
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
	if s.cfg.BeforeHello != nil {
		if err := s.cfg.BeforeHello(ctx, id); err != nil {
			return nil, s.fail("Hello", id, err)
		}
	}
	info := req.GetInfo()
	b, err := s.cfg.Fleet.ReportFacts(ctx, id, fleet.Facts{
		Hostname: clip(info.GetHostname()), OS: clip(info.GetOs()), Arch: clip(info.GetArch()),
		OSVersion: clip(info.GetOsVersion()), AgentVersion: clip(info.GetAgentVersion()),
		Capability: req.GetCapabilityVersion(), CPUs: info.GetCpus(), MemoryBytes: info.GetMemoryBytes(),
		PeerAddrs: peerAddrs(info.GetLanAddrs()),
	}, time.Now())
	if err != nil {
		return nil, s.fail("Hello", id, err)
	}
	s.log.Info("box said hello", "box_id", id, "name", b.Name, "agent_version", b.AgentVersion, "capability", b.Capability)
	// A new box, or one back from a long absence, gets the apps pinned
	// where it stands before its Sync stream asks.
	if _, err := s.cfg.Apps.SyncBox(ctx, b); err != nil {
		s.log.Warn("box's apps not brought up to date; the periodic sync retries", "box_id", id, "err", err)
	}
	if s.cfg.Agents != nil {
		if err := s.cfg.Agents.SyncBox(ctx, b); err != nil {
			s.log.Warn("box's agent version not brought up to date", "box_id", id, "err", err)
		}
	}
	if s.cfg.Sites != nil {
		if err := s.cfg.Sites.SyncSite(ctx, b); err != nil {
			s.log.Warn("box's site peers not brought up to date", "box_id", id, "err", err)
		}
	}
	return &edgeboxv1.HelloResponse{BoxId: id, Name: b.Name, Approved: b.State == fleet.StateApproved,
		ConsoleCapabilityVersion: s.cfg.CapabilityVersion, ConsoleVersion: s.cfg.Version, RejoinWindowMs: s.rejoinMs()}, nil
}

// maxPeerAddrs bounds the probe addresses a box may give.
const maxPeerAddrs = 8

// peerAddrs keeps the first maxPeerAddrs of a box's probe addresses that
// are an IP and a port.
func peerAddrs(in []string) []string {
	var out []string
	for _, a := range in {
		ap, err := netip.ParseAddrPort(a)
		if err != nil || ap.Port() == 0 || !ap.Addr().IsValid() || ap.Addr().IsUnspecified() {
			continue
		}
		out = append(out, ap.String())
		if len(out) == maxPeerAddrs {
			break
		}
	}
	return out
}

// Vote takes a box's votes on its site's peers.
func (s *consoleService) Vote(ctx context.Context, req *edgeboxv1.VoteReport) (*edgeboxv1.VoteReceipt, error) {
	id, err := boxOf(ctx)
	if err != nil {
		return nil, err
	}
	if s.cfg.Sites == nil {
		return nil, s.fail("Vote", id, errdefs.Unavailable("this console takes no site votes"))
	}
	r, err := s.cfg.Sites.Vote(ctx, id, req)
	if err != nil {
		return nil, s.fail("Vote", id, err)
	}
	return r, nil
}

// ReportVitals keeps a box's latest figures.
func (s *consoleService) ReportVitals(ctx context.Context, v *edgeboxv1.Vitals) (*edgeboxv1.VitalsReceipt, error) {
	id, err := boxOf(ctx)
	if err != nil {
		return nil, err
	}
	if s.cfg.Vitals == nil {
		return nil, s.fail("ReportVitals", id, errdefs.Unavailable("this console keeps no vitals"))
	}
	if err := s.cfg.Vitals.Put(id, v, time.Now()); err != nil {
		return nil, s.fail("ReportVitals", id, err)
	}
	return &edgeboxv1.VitalsReceipt{RejoinWindowMs: s.rejoinMs()}, nil
}

// rejoinMs is the rejoin window to tell a box, in milliseconds.
func (s *consoleService) rejoinMs() uint32 {
	if s.cfg.Rejoin == nil {
		return 0
	}
	return uint32(min(max(s.cfg.Rejoin().Milliseconds(), 0), math.MaxUint32))
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
	certPEM, notAfter, err := s.cfg.PKI.SignBox(csr, id, s.cfg.BoxCertTTL)
	if err != nil {
		return nil, s.fail("Renew", id, err)
	}
	if err := s.cfg.Fleet.Renewed(ctx, id, notAfter); err != nil {
		return nil, s.fail("Renew", id, err)
	}
	s.log.Info("box certificate renewed", "box_id", id, "not_after", notAfter)
	return &edgeboxv1.RenewResponse{CertificatePem: certPEM}, nil
}
