// Package sitepeer is a box's side of site health (ADR 0019): it hears
// the other boxes of its site on the LAN, over DTLS 1.2 with mutual
// authentication by the box certificates the console issued, and says
// whom it heard for the box's votes.
//
// Every box keeps one DTLS association to each peer as a client and
// sends a one-byte heartbeat on it every period; it answers the peers'
// associations as a server and notes when each last sent one. A peer is
// heard while its heartbeats arrive. Only the peers the console listed
// are answered or dialled, and only from their listed addresses: a
// datagram from anywhere else costs one map lookup, and a handshake
// from a listed address is answered only after DTLS's cookie exchange
// has shown that the address is real, with a bounded number at once.
package sitepeer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/pion/dtls/v2"
	"github.com/pion/dtls/v2/pkg/protocol"
	"github.com/pion/dtls/v2/pkg/protocol/recordlayer"
	"github.com/pion/transport/v2/udp"

	"github.com/edgebox/edgebox/enroll"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Peer is another box of the site.
type Peer struct {
	ID string
	// Addrs are where it takes probes ("192.168.1.20:7946"); it is dialled
	// on each in turn, and its associations are answered from their IPs.
	Addrs []string
}

// Config says who this box is and where it listens.
type Config struct {
	// Self is this box's ID.
	Self string
	// Cert returns the box's certificate now (it is renewed while the
	// agent runs); CA is the console's CA, which issued every peer's.
	Cert func() *tls.Certificate
	CA   *x509.CertPool
	// Listen are the addresses heartbeats come to: the box's LAN
	// addresses with the probe port.
	Listen []string
	// Period is how often a heartbeat goes to each peer; 10 s when 0. A
	// peer is heard while its last heartbeat is within three periods.
	Period time.Duration
	// Handshakes bounds the DTLS handshakes answered at once; 8 when 0.
	Handshakes int
	Log        *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Period <= 0 {
		c.Period = 10 * time.Second
	}
	if c.Handshakes <= 0 {
		c.Handshakes = 8
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// handshakeTimeout bounds one DTLS handshake, either side: on a LAN a
// handshake takes milliseconds, and one that never goes past its
// ClientHello holds one of the few places for no longer than this.
const handshakeTimeout = 2 * time.Second

// Prober hears and is heard by the site's peers. Its zero value is not
// usable; use New.
type Prober struct {
	cfg Config
	// now is the clock; tests move it.
	now func() time.Time

	mu    sync.Mutex
	peers map[string]*peer
	// from are the listed peers' IPs, to the peer IDs that use them.
	from map[netip.Addr][]string
	// kick wakes the dialler: the peers changed, or a peer asked for a
	// new association.
	kick chan struct{}
	// dropped counts datagrams and handshakes turned away, for tests and
	// metrics.
	dropped map[string]int
	// wrap, when set, wraps every association's UDP connection before
	// DTLS runs on it: the bandwidth benchmark counts datagrams with it.
	wrap func(net.Conn) net.Conn
}

// peer is what this box knows of one peer.
type peer struct {
	Peer
	heard    time.Time // its last heartbeat
	hearsUs  bool      // what its last heartbeat said
	conn     net.Conn  // this box's association to it, nil while none
	dialedAt time.Time // when conn was made, or last tried
	dialing  bool
	fails    int // dials in a row that failed
	next     int // the address to dial next
}

// New returns a prober with no peers.
func New(cfg Config) *Prober {
	return &Prober{cfg: cfg.withDefaults(), now: time.Now, peers: map[string]*peer{},
		from: map[netip.Addr][]string{}, kick: make(chan struct{}, 1), dropped: map[string]int{}}
}

// SetPeers replaces the peer list. Associations to peers no longer
// listed end, and theirs are no longer answered.
func (p *Prober) SetPeers(list []Peer) {
	p.mu.Lock()
	keep := map[string]bool{}
	from := map[netip.Addr][]string{}
	for _, l := range list {
		if l.ID == "" || l.ID == p.cfg.Self {
			continue
		}
		keep[l.ID] = true
		if old, ok := p.peers[l.ID]; ok {
			if !slices.Equal(old.Addrs, l.Addrs) {
				old.Addrs, old.next = slices.Clone(l.Addrs), 0
			}
		} else {
			p.peers[l.ID] = &peer{Peer: Peer{ID: l.ID, Addrs: slices.Clone(l.Addrs)}}
		}
		for _, a := range l.Addrs {
			if ap, err := netip.ParseAddrPort(a); err == nil {
				from[ap.Addr().Unmap()] = append(from[ap.Addr().Unmap()], l.ID)
			}
		}
	}
	var gone []net.Conn
	for id, pr := range p.peers {
		if !keep[id] {
			if pr.conn != nil {
				gone = append(gone, pr.conn)
			}
			delete(p.peers, id)
		}
	}
	p.from = from
	p.mu.Unlock()
	for _, c := range gone {
		c.Close()
	}
	p.wake()
}

func (p *Prober) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Seen is what this box hears of its peers now, for its vote.
func (p *Prober) Seen() []*edgeboxv1.PeerSeen {
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*edgeboxv1.PeerSeen, 0, len(p.peers))
	for _, pr := range p.peers {
		s := &edgeboxv1.PeerSeen{BoxId: pr.ID, Alive: p.hearsLocked(pr, now)}
		if !pr.heard.IsZero() {
			s.LastHeardUnixNano = pr.heard.UnixNano()
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *edgeboxv1.PeerSeen) int {
		if a.BoxId < b.BoxId {
			return -1
		}
		return 1
	})
	return out
}

func (p *Prober) hearsLocked(pr *peer, now time.Time) bool {
	return !pr.heard.IsZero() && now.Sub(pr.heard) <= 3*p.cfg.Period
}

// Dropped counts what was turned away, by reason.
func (p *Prober) Dropped() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.dropped))
	for k, v := range p.dropped {
		out[k] = v
	}
	return out
}

func (p *Prober) drop(why string) {
	p.mu.Lock()
	p.dropped[why]++
	p.mu.Unlock()
}

// Run listens on the configured addresses and heartbeats to the peers
// until ctx ends. It fails at once when no address can be listened on.
func (p *Prober) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	var listeners []net.Listener
	for _, a := range p.cfg.Listen {
		ua, err := net.ResolveUDPAddr("udp", a)
		if err != nil {
			p.cfg.Log.Warn("site peers: not listening", "addr", a, "err", err)
			continue
		}
		lc := udp.ListenConfig{Backlog: 32, AcceptFilter: isHandshake}
		l, err := lc.Listen("udp", ua)
		if err != nil {
			p.cfg.Log.Warn("site peers: not listening", "addr", a, "err", err)
			continue
		}
		listeners = append(listeners, l)
	}
	if len(listeners) == 0 && len(p.cfg.Listen) > 0 {
		return fmt.Errorf("sitepeer: cannot listen on any of %v", p.cfg.Listen)
	}
	sem := make(chan struct{}, p.cfg.Handshakes)
	for _, l := range listeners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.accept(ctx, l, sem, &wg)
		}()
	}
	context.AfterFunc(ctx, func() {
		for _, l := range listeners {
			l.Close()
		}
	})
	p.heartbeats(ctx, &wg)
	// The port is free again once Run returns, for a prober started
	// after it: the listeners close here, not whenever the context's
	// callback runs, and a listener's socket closes with the last of its
	// associations, which the goroutines waited for end.
	for _, l := range listeners {
		l.Close()
	}
	p.mu.Lock()
	for _, pr := range p.peers {
		if pr.conn != nil {
			pr.conn.Close()
			pr.conn = nil
		}
	}
	p.mu.Unlock()
	wg.Wait()
	return nil
}

// isHandshake lets only a DTLS handshake record make a new association:
// anything else from an unknown address is dropped unread.
func isHandshake(packet []byte) bool {
	pkts, err := recordlayer.UnpackDatagram(packet)
	if err != nil || len(pkts) < 1 {
		return false
	}
	h := &recordlayer.Header{}
	return h.Unmarshal(pkts[0]) == nil && h.ContentType == protocol.ContentTypeHandshake
}

// accept answers the associations that reach l.
func (p *Prober) accept(ctx context.Context, l net.Listener, sem chan struct{}, wg *sync.WaitGroup) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		ip := addrIP(c.RemoteAddr())
		p.mu.Lock()
		listed := len(p.from[ip]) > 0
		p.mu.Unlock()
		if !listed {
			p.drop("not a peer's address")
			c.Close()
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			p.drop("too many handshakes")
			c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.serve(ctx, c, ip, sem)
		}()
	}
}

func addrIP(a net.Addr) netip.Addr {
	if ua, ok := a.(*net.UDPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ua.IP); ok {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}

// serve runs the server side of one peer's association: the handshake,
// then its heartbeats until it stops sending them.
func (p *Prober) serve(ctx context.Context, c net.Conn, ip netip.Addr, sem chan struct{}) {
	var who string
	if p.wrap != nil {
		c = p.wrap(c)
	}
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	dc, err := dtls.ServerWithContext(hctx, c, p.dtlsConfig(func(id string) error {
		p.mu.Lock()
		defer p.mu.Unlock()
		if _, ok := p.peers[id]; !ok {
			return fmt.Errorf("box %s is not a peer of this site", id)
		}
		if !slices.Contains(p.from[ip], id) {
			return fmt.Errorf("box %s does not probe from %s", id, ip)
		}
		who = id
		return nil
	}))
	cancel()
	<-sem
	if err != nil {
		p.drop("handshake failed")
		p.cfg.Log.Debug("site peers: refused an association", "from", c.RemoteAddr(), "err", err)
		c.Close()
		return
	}
	defer dc.Close()
	stop := context.AfterFunc(ctx, func() { dc.Close() })
	defer stop()
	// A new association from a peer means it started afresh, and lost
	// the one this box had to it: dial it again now.
	p.mu.Lock()
	if pr, ok := p.peers[who]; ok && pr.conn != nil && p.now().Sub(pr.dialedAt) > p.cfg.Period {
		pr.conn.Close()
		pr.conn = nil
	}
	p.mu.Unlock()
	p.wake()
	buf := make([]byte, 64)
	for {
		dc.SetReadDeadline(time.Now().Add(4 * p.cfg.Period))
		n, err := dc.Read(buf)
		if err != nil {
			return
		}
		hearsUs, err := parseHeartbeat(buf[:n])
		if err != nil {
			p.drop("bad heartbeat")
			continue
		}
		p.mu.Lock()
		pr, ok := p.peers[who]
		if !ok { // no longer listed
			p.mu.Unlock()
			return
		}
		pr.heard, pr.hearsUs = p.now(), hearsUs
		p.mu.Unlock()
	}
}

// heartbeats sends each peer its heartbeat every period on this box's
// association to it, dialling one where there is none or the peer says
// it does not hear this box.
func (p *Prober) heartbeats(ctx context.Context, wg *sync.WaitGroup) {
	t := time.NewTicker(p.cfg.Period)
	defer t.Stop()
	for {
		p.beat(ctx, wg)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.kick:
		}
	}
}

// beat sends what is due now and starts the dials that are.
func (p *Prober) beat(ctx context.Context, wg *sync.WaitGroup) {
	now := p.now()
	type send struct {
		c   net.Conn
		msg []byte
	}
	var sends []send
	p.mu.Lock()
	for _, pr := range p.peers {
		stale := pr.conn != nil && !pr.hearsUs && now.Sub(pr.dialedAt) > 3*p.cfg.Period
		if stale {
			pr.conn.Close()
			pr.conn = nil
		}
		if pr.conn == nil && !pr.dialing && len(pr.Addrs) > 0 && now.Sub(pr.dialedAt) >= p.backoff(pr.fails) {
			pr.dialing, pr.dialedAt = true, now
			addr := pr.Addrs[pr.next%len(pr.Addrs)]
			pr.next++
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.dial(ctx, pr.ID, addr)
			}()
		}
		if pr.conn != nil {
			sends = append(sends, send{pr.conn, heartbeat(p.hearsLocked(pr, now))})
		}
	}
	p.mu.Unlock()
	for _, s := range sends {
		s.c.SetWriteDeadline(time.Now().Add(p.cfg.Period))
		s.c.Write(s.msg)
	}
}

// backoff is how long after a failed dial the next may start: one period
// after the first failure, doubling to a minute.
func (p *Prober) backoff(fails int) time.Duration {
	if fails == 0 {
		return 0
	}
	d := p.cfg.Period << min(fails-1, 6)
	return min(d, max(time.Minute, p.cfg.Period))
}

// dial makes this box's association to peer id at addr.
func (p *Prober) dial(ctx context.Context, id, addr string) {
	conn, err := p.dialOnce(ctx, id, addr)
	p.mu.Lock()
	defer p.mu.Unlock()
	pr, ok := p.peers[id]
	if ok {
		pr.dialing = false
	}
	if err != nil {
		if ok {
			pr.fails++
		}
		if ctx.Err() == nil {
			p.cfg.Log.Debug("site peers: cannot reach a peer", "peer", id, "addr", addr, "err", err)
		}
		return
	}
	if !ok || ctx.Err() != nil {
		conn.Close()
		return
	}
	if pr.conn != nil {
		pr.conn.Close()
	}
	pr.conn, pr.fails, pr.dialedAt = conn, 0, p.now()
	conn.SetWriteDeadline(time.Now().Add(p.cfg.Period))
	conn.Write(heartbeat(p.hearsLocked(pr, p.now())))
}

func (p *Prober) dialOnce(ctx context.Context, id, addr string) (net.Conn, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	raw, err := net.DialUDP("udp", p.localAddr(), ua)
	if err != nil {
		return nil, err
	}
	var conn net.Conn = raw
	if p.wrap != nil {
		conn = p.wrap(raw)
	}
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	dc, err := dtls.ClientWithContext(hctx, conn, p.dtlsConfig(func(got string) error {
		if got != id {
			return fmt.Errorf("%s answered as box %s, not %s", addr, got, id)
		}
		return nil
	}))
	if err != nil {
		raw.Close()
		return nil, err
	}
	return dc, nil
}

// localAddr is where this box's associations come from: the IP it
// listens on, which its peers know it by.
func (p *Prober) localAddr() *net.UDPAddr {
	for _, a := range p.cfg.Listen {
		if ap, err := netip.ParseAddrPort(a); err == nil && !ap.Addr().IsUnspecified() {
			return &net.UDPAddr{IP: ap.Addr().AsSlice()}
		}
	}
	return nil
}

// dtlsConfig is both sides' DTLS: 1.2 with ECDHE-ECDSA and AES-GCM,
// extended master secret, cookies on; the far side's certificate must
// chain to the console's CA as a box's, and name a box accept allows.
func (p *Prober) dtlsConfig(accept func(boxID string) error) *dtls.Config {
	cert := p.cfg.Cert()
	var certs []tls.Certificate
	if cert != nil {
		certs = []tls.Certificate{*cert}
	}
	return &dtls.Config{
		Certificates:         certs,
		CipherSuites:         []dtls.CipherSuiteID{dtls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256},
		ExtendedMasterSecret: dtls.RequireExtendedMasterSecret,
		ClientAuth:           dtls.RequireAnyClientCert,
		// Both sides check the chain themselves below: a box
		// certificate is for client authentication only, which the
		// library's server-side check of a client allows but its
		// client-side check of a server does not.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			id, err := p.verifyBox(raw)
			if err != nil {
				return err
			}
			return accept(id)
		},
		MTU: 1200,
	}
}

// verifyBox checks a peer's chain against the console's CA and returns
// the box it names.
func (p *Prober) verifyBox(raw [][]byte) (string, error) {
	if len(raw) == 0 {
		return "", errors.New("no certificate")
	}
	leaf, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return "", err
	}
	inter := x509.NewCertPool()
	for _, r := range raw[1:] {
		c, err := x509.ParseCertificate(r)
		if err != nil {
			return "", err
		}
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: p.cfg.CA, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return "", err
	}
	return enroll.BoxID(leaf)
}

// DefaultPort is the UDP port boxes hear their site peers on.
const DefaultPort = 7946

// LANAddrs are this machine's addresses on its site's LAN, with port:
// the private IPv4 addresses of its interfaces that are up, leaving out
// loopback and the bridges, taps and veths of workloads (edgebox's own,
// Docker's, libvirt's, CNI's).
func LANAddrs(port int) ([]string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 || workloadInterface(i.Name) {
			continue
		}
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			if ip4 := ipn.IP.To4(); ip4 != nil && ip4.IsPrivate() {
				out = append(out, net.JoinHostPort(ip4.String(), fmt.Sprint(port)))
			}
		}
	}
	return out, nil
}

func workloadInterface(name string) bool {
	for _, p := range []string{"edgebox", "veth", "tap", "docker", "br-", "virbr", "cni", "flannel", "tun"} {
		if len(name) >= len(p) && name[:len(p)] == p {
			return true
		}
	}
	return false
}
