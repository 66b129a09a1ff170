package tunnel

import (
	"net"
	"sync"
	"time"
)

// Listener hands out the streams of one kind, from every session of a
// Client or Server. It is a net.Listener, so any ordinary server (gRPC,
// http.Server, a TCP relay) serves over the tunnel unchanged.
type Listener struct {
	kind   Kind
	addr   Addr
	slots  chan struct{} // one token per stream reserved or queued
	ch     chan *Conn    // queued streams; never more than cap(slots)
	once   sync.Once
	closed chan struct{}
	remove func()
}

var _ net.Listener = (*Listener)(nil)

func newListener(kind Kind, self string, backlog int, remove func()) *Listener {
	return &Listener{
		kind: kind, addr: Addr{Peer: self, Kind: kind},
		slots:  make(chan struct{}, backlog),
		ch:     make(chan *Conn, backlog),
		closed: make(chan struct{}),
		remove: remove,
	}
}

// reserve takes a backlog slot, waiting up to wait for one to free, or
// reports that the listener stayed full, was closed, or stop was closed.
func (l *Listener) reserve(wait time.Duration, stop <-chan struct{}) bool {
	select {
	case <-l.closed:
		return false
	default:
	}
	select {
	case l.slots <- struct{}{}:
		return true
	default:
	}
	if wait <= 0 {
		return false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case l.slots <- struct{}{}:
		return true
	case <-t.C:
	case <-l.closed:
	case <-stop:
	}
	return false
}

func (l *Listener) unreserve() { <-l.slots }

// deliver queues a stream for which reserve succeeded.
func (l *Listener) deliver(c *Conn) {
	select {
	case l.ch <- c:
	case <-l.closed:
		c.Close()
		l.unreserve()
	}
}

// Accept waits for the next stream of this kind.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		l.unreserve()
		return c, nil
	case <-l.closed:
		return nil, ErrClosed
	}
}

// Close stops the listener; streams still queued are closed.
func (l *Listener) Close() error {
	l.once.Do(func() {
		close(l.closed)
		l.remove()
		for {
			select {
			case c := <-l.ch:
				c.Close()
				l.unreserve()
			default:
				return
			}
		}
	})
	return nil
}

// Addr returns the local end: this side's identity and the kind.
func (l *Listener) Addr() net.Addr { return l.addr }

// listeners is a set of Listeners by kind, shared by all sessions of one
// side.
type listeners struct {
	self    string
	backlog int
	mu      sync.Mutex // guards m
	m       map[Kind]*Listener
}

func (ls *listeners) listener(k Kind) *Listener {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.m[k]
}

// listen registers a listener for kind; it panics on an invalid kind or a
// second listener for the same kind, both programming errors.
func (ls *listeners) listen(k Kind) *Listener {
	if !validKind(k) {
		panic("tunnel: invalid kind " + string(k))
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.m == nil {
		ls.m = make(map[Kind]*Listener)
	}
	if _, dup := ls.m[k]; dup {
		panic("tunnel: second listener for kind " + string(k))
	}
	var l *Listener
	l = newListener(k, ls.self, ls.backlog, func() {
		ls.mu.Lock()
		if ls.m[k] == l {
			delete(ls.m, k)
		}
		ls.mu.Unlock()
	})
	ls.m[k] = l
	return l
}

func (ls *listeners) closeAll() {
	ls.mu.Lock()
	all := make([]*Listener, 0, len(ls.m))
	for _, l := range ls.m {
		all = append(all, l)
	}
	ls.mu.Unlock()
	for _, l := range all {
		l.Close()
	}
}
