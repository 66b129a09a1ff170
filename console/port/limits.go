package port

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgebox/edgebox/tunnel"
)

// Shedding on the public port: why a connection was refused or closed
// early. Each is a label value of edgebox_port_shed_total and a key of the
// shedding log line.
const (
	// shedAddrConns: refused at accept; its address already has
	// MaxConnsPerAddr connections open and none of them is idle.
	shedAddrConns = "addr_connections"
	// shedIdleAddr: an idle connection (no ClientHello yet) closed to make
	// room for a newer one from the same address.
	shedIdleAddr = "idle_evicted_addr"
	// shedIdle: an idle connection closed to make room for a newer one
	// because MaxIdle connections were idle, or the process ran out of
	// file descriptors.
	shedIdle = "idle_evicted"
	// shedHelloTimeout: no complete ClientHello within HelloTimeout.
	shedHelloTimeout = "hello_timeout"
	// shedAddrHandshakes: ClientHello refused; its address already has
	// MaxHandshakesPerAddr handshakes in progress.
	shedAddrHandshakes = "addr_handshakes"
	// shedHandshakes: ClientHello without the tunnel protocol refused;
	// MaxHandshakes such handshakes are in progress.
	shedHandshakes = "handshakes"
	// shedBoxHandshakes: ClientHello offering the tunnel protocol refused;
	// MaxBoxHandshakes such handshakes are in progress.
	shedBoxHandshakes = "box_handshakes"
	// shedAcceptError: accept failed for want of file descriptors.
	shedAcceptError = "accept_error"
	// shedBoxCPU: a box admitted waited past cpuWait for a handshake
	// slot and was told to come back soon.
	shedBoxCPU = "box_cpu"
)

var shedReasons = []string{shedAddrConns, shedIdleAddr, shedIdle, shedHelloTimeout,
	shedAddrHandshakes, shedHandshakes, shedBoxHandshakes, shedAcceptError, shedBoxCPU}

// connState is where a connection on the public port stands.
type connState uint8

const (
	statePending   connState = iota // accepted, no ClientHello yet: holds no handshake slot
	stateHandshake                  // ClientHello read: holds a handshake slot
	stateHTTP                       // handshake done, served by HTTP
	stateBox                        // a box's tunnel session: no longer counted
	stateGone                       // closed or evicted: counted nowhere
)

// portConn is an accepted TCP connection with its place in the books.
// Closing it gives its place back, once.
type portConn struct {
	net.Conn
	adm   *admission
	addr  netip.Addr // the source address, IPv6 cut to its /64
	start time.Time  // when it was accepted

	// Guarded by adm.mu.
	state     connState
	box       bool  // its handshake slot is from the box pool
	all, mine links // places in the admission's and its address's idle lists
	book      *addrBook

	// Used by the goroutine that serves the connection only: the place
	// the port's Gate holds for a box's session during its handshake (the
	// context that carries it, derived from serving, the port's own), and
	// how to give it back.
	serving  context.Context
	admitted context.Context
	release  func()
	// cpu is the port's handshake slots while this connection holds one:
	// from its ClientHello until its first write (the server's flight).
	cpu atomic.Pointer[chan struct{}]
	// handshakeEnd cancels the TLS handshake when its time is up.
	handshakeEnd *time.Timer
	// toldBusy is set once the box was told to come back (tellBusy): what
	// TLS writes after that (the alert for the handshake it fails) is
	// dropped, not sent: the box stops reading at the answer, and each
	// write is a system call, hundreds a second in a storm.
	toldBusy atomic.Bool
}

// tellBusy answers a box before any TLS: come back after wait. The
// handshake then fails.
func (c *portConn) tellBusy(wait time.Duration) {
	tunnel.WriteEarlyBusy(c.Conn, wait)
	c.toldBusy.Store(true)
}

// setHandshakeEnd moves the end of the connection's TLS handshake to at.
// Call it from the handshake only.
func (c *portConn) setHandshakeEnd(at time.Time) {
	c.handshakeEnd.Reset(time.Until(at))
	c.SetDeadline(at)
}

// Write gives back the handshake's CPU slot, if held, and writes.
func (c *portConn) Write(b []byte) (int, error) {
	c.computed()
	if c.toldBusy.Load() {
		return 0, errEarlyBusy
	}
	return c.Conn.Write(b)
}

// computed gives back the handshake's CPU slot, if held.
func (c *portConn) computed() {
	if c.cpu.Load() == nil {
		return // the common case, every write of a session: a load only
	}
	if ch := c.cpu.Swap(nil); ch != nil {
		<-*ch
	}
}

// Close gives the connection's place back and closes it.
func (c *portConn) Close() error {
	c.adm.release(c)
	return c.Conn.Close()
}

type links struct{ prev, next *portConn }

// idleList is a list of idle connections, oldest first, linked through
// the links that at picks out of each connection.
type idleList struct {
	head, tail *portConn
	n          int
	at         func(*portConn) *links
}

func (l *idleList) push(c *portConn) {
	lk := l.at(c)
	lk.prev, lk.next = l.tail, nil
	if l.tail != nil {
		l.at(l.tail).next = c
	} else {
		l.head = c
	}
	l.tail = c
	l.n++
}

func (l *idleList) remove(c *portConn) {
	lk := l.at(c)
	if lk.prev != nil {
		l.at(lk.prev).next = lk.next
	} else {
		l.head = lk.next
	}
	if lk.next != nil {
		l.at(lk.next).prev = lk.prev
	} else {
		l.tail = lk.prev
	}
	lk.prev, lk.next = nil, nil
	l.n--
}

func allLinks(c *portConn) *links  { return &c.all }
func mineLinks(c *portConn) *links { return &c.mine }

// addrBook is what one source address holds.
type addrBook struct {
	conns      int // pending, handshaking and HTTP connections
	handshakes int
	idle       idleList
}

// limits are the admission numbers, from Config.
type limits struct {
	connsPerAddr, handshakesPerAddr int
	maxIdle                         int
	maxHandshakes, maxBoxHandshakes int
}

func (c Config) limits() limits {
	return limits{connsPerAddr: c.MaxConnsPerAddr, handshakesPerAddr: c.MaxHandshakesPerAddr,
		maxIdle: c.MaxIdle, maxHandshakes: c.MaxHandshakes, maxBoxHandshakes: c.MaxBoxHandshakes}
}

// admission keeps the public port's books: who holds which connections
// and handshake slots, by source address. Boxes' tunnel sessions leave the
// books once their certificate is verified; everything before that, and
// every HTTP connection, is anonymous and counted against its address.
//
// An idle connection (accepted, no ClientHello yet) holds no handshake
// slot, only its place in its address's count, and is the first to go
// when a newer connection needs room: a real client sends its ClientHello
// within a round trip, so only connections that never speak are closed.
type admission struct {
	lim  limits
	shed *shedding

	mu            sync.Mutex // guards everything below and each portConn's guarded fields
	addrs         map[netip.Addr]*addrBook
	idle          idleList // every idle connection, oldest first
	handshakes    int      // in progress without the tunnel protocol
	boxHandshakes int      // in progress offering the tunnel protocol
	http          int      // HTTP connections open
}

// newAdmission returns empty books; with reg, their metrics are
// registered there.
func newAdmission(lim limits, reg prometheus.Registerer) *admission {
	a := &admission{lim: lim, addrs: map[netip.Addr]*addrBook{}, idle: idleList{at: allLinks}}
	var m *portMetrics
	if reg != nil {
		m = newPortMetrics(reg, a)
	}
	a.shed = newShedding(m)
	return a
}

// SourceAddr is the address a connection is counted under: its remote IP,
// with an IPv6 address cut to its /64, since one host usually has a whole
// /64 to pick from.
func SourceAddr(c net.Conn) netip.Addr {
	var ap netip.AddrPort
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		ap = ta.AddrPort()
	} else if c.RemoteAddr() != nil {
		ap, _ = netip.ParseAddrPort(c.RemoteAddr().String())
	}
	a := ap.Addr().Unmap()
	if a.Is6() {
		if p, err := a.Prefix(64); err == nil {
			a = p.Addr()
		}
	}
	return a
}

// admit books a newly accepted connection. It returns nil when the
// connection must be refused, and the idle connections that were evicted
// to make room; the caller closes both.
func (a *admission) admit(c net.Conn, now time.Time) (pc *portConn, evicted []*portConn) {
	addr := SourceAddr(c)
	a.mu.Lock()
	defer a.mu.Unlock()
	book := a.addrs[addr]
	if book == nil {
		book = &addrBook{idle: idleList{at: mineLinks}}
		a.addrs[addr] = book
	}
	if book.conns >= a.lim.connsPerAddr {
		old := a.pickIdle(&book.idle)
		if old == nil {
			a.shed.count(shedAddrConns, addr)
			a.forgetIfEmpty(addr, book)
			return nil, nil
		}
		a.drop(old)
		a.shed.count(shedIdleAddr, addr)
		evicted = append(evicted, old)
	}
	if a.idle.n >= a.lim.maxIdle {
		old := a.pickIdle(&a.idle)
		a.drop(old)
		a.shed.count(shedIdle, old.addr)
		evicted = append(evicted, old)
	}
	a.addrs[addr] = book // again, if an eviction just emptied it
	pc = &portConn{Conn: c, adm: a, addr: addr, start: now, state: statePending, book: book}
	book.conns++
	book.idle.push(pc)
	a.idle.push(pc)
	return pc, evicted
}

// pickIdle picks the connection to evict from l: among its oldest few,
// the one from the address with the most idle connections, so a flood
// from a few addresses pays for itself before a box's fresh connection
// elsewhere does. A connection whose ClientHello waits unread (the
// console is slow, not the client) is not idle: it goes to the back of
// both its lists, and the next pick is looked at. Only the pick is
// looked at (a system call each, under a.mu, for every connection a
// flood brings), and past a few that had spoken the oldest goes anyway,
// so clients that send one byte and stop cannot make eviction scan
// forever. a.mu is held.
func (a *admission) pickIdle(l *idleList) *portConn {
	for range 3 {
		var pick *portConn
		c := l.head
		for tries := 0; c != nil && tries < 8; tries++ {
			if pick == nil || c.book.idle.n > pick.book.idle.n {
				pick = c
			}
			c = l.at(c).next
		}
		if pick == nil || !hasSpoken(pick.Conn) {
			return pick
		}
		a.idle.remove(pick)
		a.idle.push(pick)
		pick.book.idle.remove(pick)
		pick.book.idle.push(pick)
	}
	return l.head
}

// evictIdle takes up to n of the oldest idle connections off the books,
// for the caller to close.
func (a *admission) evictIdle(n int) []*portConn {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []*portConn
	for ; n > 0 && a.idle.head != nil; n-- {
		old := a.idle.head
		a.drop(old)
		a.shed.count(shedIdle, old.addr)
		out = append(out, old)
	}
	return out
}

// hello moves a connection whose ClientHello arrived into a handshake
// slot: from the box pool when it offers the tunnel protocol. It returns
// the reason when there is no slot for it, or when it was evicted.
func (a *admission) hello(pc *portConn, box bool) (reason string, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if pc.state != statePending {
		return "", false // evicted while its ClientHello came in; counted then
	}
	switch {
	case pc.book.handshakes >= a.lim.handshakesPerAddr:
		reason = shedAddrHandshakes
	case box && a.boxHandshakes >= a.lim.maxBoxHandshakes:
		reason = shedBoxHandshakes
	case !box && a.handshakes >= a.lim.maxHandshakes:
		reason = shedHandshakes
	}
	if reason != "" {
		a.shed.count(reason, pc.addr)
		return reason, false
	}
	a.idle.remove(pc)
	pc.book.idle.remove(pc)
	pc.state, pc.box = stateHandshake, box
	pc.book.handshakes++
	if box {
		a.boxHandshakes++
	} else {
		a.handshakes++
	}
	return "", true
}

// handshakeDone gives back a finished handshake's slot. A box's session
// leaves the books (session true); an HTTP connection stays on them until
// it closes.
func (a *admission) handshakeDone(pc *portConn, session bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if pc.state != stateHandshake {
		return
	}
	a.endHandshake(pc)
	if session {
		pc.state = stateBox
		pc.book.conns--
		a.forgetIfEmpty(pc.addr, pc.book)
		pc.book = nil
		return
	}
	pc.state = stateHTTP
	a.http++
}

// timedOutIdle reports whether pc was still waiting for its ClientHello,
// and counts it as shed by the hello timeout if so.
func (a *admission) timedOutIdle(pc *portConn) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if pc.state != statePending {
		return false
	}
	a.shed.count(shedHelloTimeout, pc.addr)
	return true
}

// release takes a closing connection off the books; closing twice, or
// after an eviction, does nothing more.
func (a *admission) release(pc *portConn) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if pc.state == stateBox {
		pc.state = stateGone
		return
	}
	a.drop(pc)
}

// drop takes pc off the books wherever it stands. a.mu is held.
func (a *admission) drop(pc *portConn) {
	switch pc.state {
	case statePending:
		a.idle.remove(pc)
		pc.book.idle.remove(pc)
	case stateHandshake:
		a.endHandshake(pc)
	case stateHTTP:
		a.http--
	default:
		return
	}
	pc.state = stateGone
	pc.book.conns--
	a.forgetIfEmpty(pc.addr, pc.book)
	pc.book = nil
}

func (a *admission) endHandshake(pc *portConn) {
	pc.book.handshakes--
	if pc.box {
		a.boxHandshakes--
	} else {
		a.handshakes--
	}
}

func (a *admission) forgetIfEmpty(addr netip.Addr, book *addrBook) {
	if book.conns == 0 && book.handshakes == 0 {
		delete(a.addrs, addr)
	}
}

// counts is a consistent view of the books, for metrics and tests.
type admissionCounts struct {
	idle, handshakes, boxHandshakes, http, addrs int
}

func (a *admission) counts() admissionCounts {
	a.mu.Lock()
	defer a.mu.Unlock()
	return admissionCounts{idle: a.idle.n, handshakes: a.handshakes, boxHandshakes: a.boxHandshakes,
		http: a.http, addrs: len(a.addrs)}
}

// portMetrics are the public port's Prometheus collectors.
type portMetrics struct {
	shed *prometheus.CounterVec
	// tls counts completed handshakes by pool and whether they resumed a
	// session: after a restart, boxes should resume.
	tls *prometheus.CounterVec
}

// handshake counts one completed handshake; m may be nil.
func (m *portMetrics) handshake(box, resumed bool) {
	if m == nil {
		return
	}
	pool, r := "other", "no"
	if box {
		pool = "box"
	}
	if resumed {
		r = "yes"
	}
	m.tls.WithLabelValues(pool, r).Inc()
}

// newPortMetrics registers the port's collectors with reg; the gauges read
// adm when scraped.
func newPortMetrics(reg prometheus.Registerer, adm *admission) *portMetrics {
	m := &portMetrics{shed: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "edgebox", Subsystem: "port", Name: "shed_total",
		Help: "Connections the public port refused or closed early to stay available, by reason.",
	}, []string{"reason"}),
		tls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "edgebox", Subsystem: "port", Name: "tls_handshakes_total",
			Help: "TLS handshakes completed on the public port, by pool (box, other) and whether they resumed a session (yes, no).",
		}, []string{"pool", "resumed"})}
	for _, r := range shedReasons {
		m.shed.WithLabelValues(r) // every reason shows, at zero
	}
	gauge := func(name, help string, labels prometheus.Labels, v func(admissionCounts) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "edgebox", Subsystem: "port", Name: name, Help: help, ConstLabels: labels,
		}, func() float64 { return float64(v(adm.counts())) })
	}
	const connHelp = "Anonymous connections open on the public port, by state (box sessions are not counted here)."
	const hsHelp = "TLS handshakes in progress on the public port, by pool."
	reg.MustRegister(m.shed, m.tls,
		gauge("connections", connHelp, prometheus.Labels{"state": "idle"}, func(c admissionCounts) int { return c.idle }),
		gauge("connections", connHelp, prometheus.Labels{"state": "http"}, func(c admissionCounts) int { return c.http }),
		gauge("handshakes", hsHelp, prometheus.Labels{"pool": "box"}, func(c admissionCounts) int { return c.boxHandshakes }),
		gauge("handshakes", hsHelp, prometheus.Labels{"pool": "other"}, func(c admissionCounts) int { return c.handshakes }),
		gauge("source_addresses", "Source addresses with anonymous connections open on the public port.", nil,
			func(c admissionCounts) int { return c.addrs }),
	)
	return m
}

// shedding counts what the port sheds, in metrics at once and in a log
// line at most once per interval, so an attack is visible without
// flooding the log.
type shedding struct {
	metrics *portMetrics // nil records no metrics

	mu     sync.Mutex // guards the counts since the last log line
	counts map[string]int
	byAddr map[netip.Addr]int // bounded by maxShedAddrs
}

// maxShedAddrs bounds the addresses remembered between two log lines.
const maxShedAddrs = 1024

func newShedding(m *portMetrics) *shedding {
	return &shedding{metrics: m, counts: map[string]int{}, byAddr: map[netip.Addr]int{}}
}

func (s *shedding) count(reason string, addr netip.Addr) {
	if s.metrics != nil {
		s.metrics.shed.WithLabelValues(reason).Inc()
	}
	s.mu.Lock()
	s.counts[reason]++
	if _, ok := s.byAddr[addr]; addr.IsValid() && (ok || len(s.byAddr) < maxShedAddrs) {
		s.byAddr[addr]++
	}
	s.mu.Unlock()
}

// log writes one Warn line with what was shed since the last call, if
// anything was, with its rate over interval and the addresses that were
// shed most.
func (s *shedding) log(log *slog.Logger, interval time.Duration) {
	s.mu.Lock()
	counts, byAddr := s.counts, s.byAddr
	if len(counts) == 0 {
		s.mu.Unlock()
		return
	}
	s.counts, s.byAddr = map[string]int{}, map[netip.Addr]int{}
	s.mu.Unlock()

	total := 0
	attrs := []any{"interval", interval.String()}
	for _, r := range shedReasons {
		if n := counts[r]; n > 0 {
			total += n
			attrs = append(attrs, r, n)
		}
	}
	type addrCount struct {
		addr netip.Addr
		n    int
	}
	var top []addrCount
	for a, n := range byAddr {
		top = append(top, addrCount{a, n})
	}
	sort.Slice(top, func(i, j int) bool { return top[i].n > top[j].n })
	var tops []string
	for _, t := range top[:min(len(top), 3)] {
		tops = append(tops, t.addr.String()+"="+strconv.Itoa(t.n))
	}
	attrs = append(attrs, "total", total, "per_second", float64(total)/interval.Seconds(),
		"source_addresses", len(byAddr), "top", tops)
	log.Warn("public port shedding connections", attrs...)
}
