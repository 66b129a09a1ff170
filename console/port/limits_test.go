package port

import (
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fromConn is an accepted connection as the books see it: only its
// source address matters to them.
type fromConn struct {
	net.Conn
	addr *net.TCPAddr
}

func (c fromConn) RemoteAddr() net.Addr { return c.addr }

// books drives an admission through a scenario by connection names.
type books struct {
	t     *testing.T
	a     *admission
	reg   *prometheus.Registry
	conns map[string]*portConn
}

func (b *books) admit(name, ip string) (refused bool, evicted []string) {
	b.t.Helper()
	c := fromConn{addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}}
	pc, ev := b.a.admit(c, time.Now())
	for _, e := range ev {
		for n, x := range b.conns {
			if x == e {
				evicted = append(evicted, n)
			}
		}
	}
	if pc == nil {
		return true, evicted
	}
	b.conns[name] = pc
	return false, evicted
}

func (b *books) mustAdmit(name, ip string, wantEvicted ...string) {
	b.t.Helper()
	refused, ev := b.admit(name, ip)
	if refused {
		b.t.Fatalf("%s from %s refused", name, ip)
	}
	if len(ev) != len(wantEvicted) || (len(ev) > 0 && ev[0] != wantEvicted[0]) {
		b.t.Fatalf("admitting %s evicted %v, want %v", name, ev, wantEvicted)
	}
}

func (b *books) hello(name string, box bool, wantReason string) {
	b.t.Helper()
	reason, ok := b.a.hello(b.conns[name], box)
	if ok != (wantReason == "") || reason != wantReason {
		b.t.Fatalf("ClientHello of %s (box %v): ok %v reason %q, want reason %q", name, box, ok, reason, wantReason)
	}
}

func (b *books) counts(want admissionCounts) {
	b.t.Helper()
	if got := b.a.counts(); got != want {
		b.t.Fatalf("books %+v, want %+v", got, want)
	}
}

func (b *books) shed(reason string, want float64) {
	b.t.Helper()
	if got := shedMetric(b.t, b.reg, reason); got != want {
		b.t.Fatalf("shed %s = %v, want %v", reason, got, want)
	}
}

func TestAdmission(t *testing.T) {
	t.Parallel()
	wide := limits{connsPerAddr: 100, handshakesPerAddr: 100, maxIdle: 100, maxHandshakes: 100, maxBoxHandshakes: 100}
	with := func(f func(*limits)) limits { l := wide; f(&l); return l }
	cases := []struct {
		name string
		lim  limits
		run  func(b *books)
	}{{
		name: "an address at its cap loses its own oldest idle connection",
		lim:  with(func(l *limits) { l.connsPerAddr = 2 }),
		run: func(b *books) {
			b.mustAdmit("a1", "10.0.0.1")
			b.mustAdmit("b1", "10.0.0.2")
			b.mustAdmit("a2", "10.0.0.1")
			b.mustAdmit("a3", "10.0.0.1", "a1")
			b.counts(admissionCounts{idle: 3, addrs: 2})
			b.shed(shedIdleAddr, 1)
		},
	}, {
		name: "an address at its cap with nothing idle is refused",
		lim:  with(func(l *limits) { l.connsPerAddr = 2 }),
		run: func(b *books) {
			b.mustAdmit("a1", "10.0.0.1")
			b.mustAdmit("a2", "10.0.0.1")
			b.hello("a1", false, "")
			b.a.handshakeDone(b.conns["a1"], false) // an HTTP connection now
			b.hello("a2", true, "")
			if refused, _ := b.admit("a3", "10.0.0.1"); !refused {
				b.t.Fatal("a third connection from a full address was admitted")
			}
			b.mustAdmit("b1", "10.0.0.2")
			b.counts(admissionCounts{idle: 1, boxHandshakes: 1, http: 1, addrs: 2})
			b.shed(shedAddrConns, 1)
		},
	}, {
		name: "past MaxIdle the oldest idle connection anywhere goes",
		lim:  with(func(l *limits) { l.maxIdle = 2 }),
		run: func(b *books) {
			b.mustAdmit("a1", "10.0.0.1")
			b.mustAdmit("b1", "10.0.0.2")
			b.mustAdmit("c1", "10.0.0.3", "a1")
			b.counts(admissionCounts{idle: 2, addrs: 2})
			b.shed(shedIdle, 1)
		},
	}, {
		name: "past MaxIdle the busiest address among the oldest loses one",
		lim:  with(func(l *limits) { l.maxIdle = 3 }),
		run: func(b *books) {
			b.mustAdmit("box", "10.0.0.9")
			b.mustAdmit("a1", "10.0.0.1")
			b.mustAdmit("a2", "10.0.0.1")
			b.mustAdmit("a3", "10.0.0.1", "a1")
			b.counts(admissionCounts{idle: 3, addrs: 2})
		},
	}, {
		name: "boxes and everyone else have separate handshake pools",
		lim:  with(func(l *limits) { l.maxHandshakes, l.maxBoxHandshakes = 1, 1 }),
		run: func(b *books) {
			for _, n := range []string{"op1", "op2", "box1", "box2"} {
				b.mustAdmit(n, "10.0.0.1")
			}
			b.hello("op1", false, "")
			b.hello("op2", false, shedHandshakes)
			b.hello("box1", true, "")
			b.hello("box2", true, shedBoxHandshakes)
			b.a.handshakeDone(b.conns["op1"], false)
			b.hello("op2", false, "") // the slot came back
			b.counts(admissionCounts{idle: 1, handshakes: 1, boxHandshakes: 1, http: 1, addrs: 1})
		},
	}, {
		name: "an address has a cap on its handshakes",
		lim:  with(func(l *limits) { l.handshakesPerAddr = 1 }),
		run: func(b *books) {
			b.mustAdmit("a1", "10.0.0.1")
			b.mustAdmit("a2", "10.0.0.1")
			b.mustAdmit("b1", "10.0.0.2")
			b.hello("a1", true, "")
			b.hello("a2", true, shedAddrHandshakes)
			b.hello("b1", true, "")
		},
	}, {
		name: "a box's session leaves the books",
		lim:  with(func(l *limits) { l.connsPerAddr = 2 }),
		run: func(b *books) {
			b.mustAdmit("box", "10.0.0.1")
			b.hello("box", true, "")
			b.a.handshakeDone(b.conns["box"], true)
			b.counts(admissionCounts{})
			b.mustAdmit("a1", "10.0.0.1")
			b.mustAdmit("a2", "10.0.0.1") // the session does not count against the address
			b.a.release(b.conns["box"])
			b.counts(admissionCounts{idle: 2, addrs: 1})
		},
	}, {
		name: "closing twice, or after an eviction, changes nothing more",
		lim:  with(func(l *limits) { l.connsPerAddr = 1 }),
		run: func(b *books) {
			b.mustAdmit("a1", "10.0.0.1")
			b.mustAdmit("a2", "10.0.0.1", "a1")
			b.a.release(b.conns["a1"])
			b.a.release(b.conns["a1"])
			b.a.release(b.conns["a2"])
			b.a.release(b.conns["a2"])
			b.counts(admissionCounts{})
			b.mustAdmit("a3", "10.0.0.1")
			b.counts(admissionCounts{idle: 1, addrs: 1})
		},
	}, {
		name: "an evicted connection gets no handshake slot",
		lim:  with(func(l *limits) { l.connsPerAddr = 1 }),
		run: func(b *books) {
			b.mustAdmit("a1", "10.0.0.1")
			b.mustAdmit("a2", "10.0.0.1", "a1")
			if _, ok := b.a.hello(b.conns["a1"], false); ok {
				b.t.Fatal("an evicted connection got a handshake slot")
			}
			b.counts(admissionCounts{idle: 1, addrs: 1})
		},
	}, {
		name: "one IPv6 /64 is one address; IPv4 in IPv6 is IPv4",
		lim:  with(func(l *limits) { l.connsPerAddr = 1 }),
		run: func(b *books) {
			b.mustAdmit("x1", "2001:db8:0:7::1")
			b.mustAdmit("x2", "2001:db8:0:7:ffff::2", "x1")
			b.mustAdmit("y1", "2001:db8:0:8::1")
			b.mustAdmit("v4", "::ffff:10.0.0.1")
			b.mustAdmit("v4b", "10.0.0.1", "v4")
			b.counts(admissionCounts{idle: 3, addrs: 3})
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			b := &books{t: t, a: newAdmission(tc.lim, reg), reg: reg, conns: map[string]*portConn{}}
			tc.run(b)
			// Everything closed, the books are empty again.
			for _, pc := range b.conns {
				b.a.release(pc)
			}
			b.counts(admissionCounts{})
			if b.a.idle.head != nil || b.a.idle.tail != nil {
				t.Fatal("the idle list kept a connection")
			}
		})
	}
}

func TestSourceAddr(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ remote, want string }{
		{"10.1.2.3:5", "10.1.2.3"},
		{"[::ffff:10.1.2.3]:5", "10.1.2.3"},
		{"[2001:db8:1:2:3:4:5:6]:5", "2001:db8:1:2::"},
	} {
		ap := netip.MustParseAddrPort(tc.remote)
		c := fromConn{addr: net.TCPAddrFromAddrPort(ap)}
		if got := SourceAddr(c).String(); got != tc.want {
			t.Errorf("SourceAddr(%s) = %s, want %s", tc.remote, got, tc.want)
		}
	}
}

// shedMetric reads edgebox_port_shed_total{reason} from reg.
func shedMetric(t testing.TB, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "edgebox_port_shed_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no edgebox_port_shed_total{reason=%q}", reason)
	return 0
}

func TestAdmissionSparesConnectionsThatSpoke(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("only Linux peeks at unread bytes; elsewhere every unread connection is idle")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a := newAdmission(limits{connsPerAddr: 3, handshakesPerAddr: 10, maxIdle: 10, maxHandshakes: 10, maxBoxHandshakes: 10},
		prometheus.NewRegistry())
	// Three connections nobody reads, as on a console too busy to; the
	// oldest has sent its ClientHello.
	var pcs []*portConn
	for i := range 4 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if i == 0 {
			c.Write([]byte{0x16, 0x03, 0x01})
			// Wait until the bytes are in the console's socket.
			for deadline := time.Now().Add(5 * time.Second); !hasSpoken(s) && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
		}
		pc, evicted := a.admit(s, time.Now())
		pcs = append(pcs, pc)
		switch {
		case i < 3 && len(evicted) != 0:
			t.Fatalf("connection %d evicted %d others below the cap", i, len(evicted))
		case i == 3 && (len(evicted) != 1 || evicted[0] != pcs[1]):
			t.Fatal("the fourth connection did not evict the oldest one that never spoke")
		}
	}
	if _, ok := a.hello(pcs[0], true); !ok {
		t.Fatal("the connection that spoke lost its place")
	}
}
