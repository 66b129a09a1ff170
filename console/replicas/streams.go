package replicas

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgebox/edgebox/console/pki"
	"github.com/edgebox/edgebox/errdefs"
	"github.com/edgebox/edgebox/tunnel"
	"github.com/edgebox/edgebox/tunnel/forwarding"
)

// A replica opens a stream to a box whose tunnel another replica holds
// through that replica's listener, on the same TLS as forwarded calls
// (both sides show replica certificates):
//
//	GET /replica/v1/stream HTTP/1.1
//	Connection: Upgrade
//	Upgrade: edgebox-stream/1
//	Edgebox-Box: <box ID>
//	Edgebox-Stream: <the stream's tunnel.Header, kind and metadata, base64url without padding>
//
// The replica that holds the box opens the stream on its own tunnel, and
// answers 101 Switching Protocols once it is open: from then on the
// connection carries the stream's bytes both ways, and a half-close (TLS
// close_notify) on one side half-closes the box's stream, and the
// other way round. Otherwise it answers an error status with a JSON body
// {"error": "..."}: 400 for a request it cannot read, 403 for a kind or
// metadata it does not carry between replicas (or a caller that is no
// replica), 404 when the box's tunnel is not there, 502 when the box did
// not open the stream, 503 when it carries too many or is stopping. It
// never sends a stream on to a third replica.

// StreamPath is where a replica listener opens streams to its boxes for
// the other replicas.
const StreamPath = "/replica/v1/stream"

const (
	streamProto  = "edgebox-stream/1"
	boxHeader    = "Edgebox-Box"
	streamHeader = "Edgebox-Stream"
)

// Bounds of what a stream request and its answer may hold.
const (
	// MaxBoxID bounds a box ID in a stream request.
	MaxBoxID = 128
	// maxStreamHeader is the longest encoded tunnel header: the one a
	// tunnel reader accepts, in base64.
	maxStreamHeader = (4 + tunnel.MaxKindLen + tunnel.MaxMetaLen + 2) / 3 * 4
	// maxAnswerHead bounds the status line and headers of an answer;
	// maxAnswerBody the error body read from one.
	maxAnswerHead = 16 << 10
	maxAnswerBody = 4 << 10
	// maxReason bounds the reason from another replica put into an error.
	maxReason = 512
)

// Opener opens a stream of kind to a box: the tunnel server, or Streams,
// which reaches boxes held by other replicas too. Open is safe to call
// concurrently; the stream is the caller's to close. A box that no
// replica holds gives an error wrapping tunnel.ErrOffline.
type Opener interface {
	Open(ctx context.Context, boxID string, kind tunnel.Kind, meta map[string]string) (net.Conn, error)
}

var (
	_ Opener = (*Streams)(nil)
	_ Opener = (*tunnel.Server)(nil)
)

// StreamsConfig is what Streams needs.
type StreamsConfig struct {
	// Set says which replica holds each box.
	Set *Set
	// Local opens streams on this replica's own tunnels.
	Local Opener
	// Cert is this replica's certificate, Roots the console CA.
	Cert  *pki.ReplicaCert
	Roots *x509.CertPool
	// Kinds are the stream kinds carried between replicas, each with the
	// metadata keys it may carry; anything else is refused, asking or
	// asked. The default carries UKEYs only (usbip, naming its key).
	Kinds map[tunnel.Kind][]string
	// MaxStreams bounds the streams this replica carries for the others
	// at once: each holds two goroutines and a connection.
	MaxStreams int
	// OpenTimeout bounds reaching another replica and hearing its answer,
	// which comes once the box's stream is open; and this replica's
	// opening of a box's stream for another.
	OpenTimeout time.Duration
	// HalfClosed is how long a stream one side of which has ended (a
	// half-close) is kept for the other side to end too; then both are
	// closed. USB/IP, the one kind carried now, never half-closes for
	// good: a side that ends has gone.
	HalfClosed time.Duration
	Log        *slog.Logger
}

// DefaultStreamsConfig returns the bounds Streams runs with; Set, Local,
// Cert and Roots are the caller's.
func DefaultStreamsConfig() StreamsConfig {
	return StreamsConfig{
		Kinds: map[tunnel.Kind][]string{tunnel.KindUSBIP: {forwarding.MetaKey}},
		// As the UKEY broker's bound on the keys it carries.
		MaxStreams: 1024,
		// As the broker's own bound on reaching a key's box: the box's
		// answer within it too.
		OpenTimeout: 10 * time.Second,
		HalfClosed:  30 * time.Second,
	}
}

// Validate checks c.
func (c StreamsConfig) Validate() error {
	switch {
	case c.Set == nil || c.Local == nil || c.Cert == nil || c.Roots == nil:
		return errors.New("replicas: streams need the replica set, the local tunnel, a replica certificate and the CA")
	case len(c.Kinds) == 0:
		return errors.New("replicas: streams need the kinds they carry")
	case c.MaxStreams < 1:
		return fmt.Errorf("replicas: at most %d streams carried; at least 1", c.MaxStreams)
	case c.OpenTimeout <= 0 || c.HalfClosed <= 0:
		return fmt.Errorf("replicas: open timeout %v, half-closed timeout %v; both must be positive", c.OpenTimeout, c.HalfClosed)
	}
	return nil
}

// Streams opens streams to boxes wherever their tunnels are: on this
// replica's tunnel server, or through the replica listener of the one
// that holds the box. Its handler (Mount) carries the streams other
// replicas open to this one's boxes.
//
// The streams it carries for others are owned by it: Close cuts them and
// waits for their goroutines. A stream it opened through another replica
// owns no goroutine; the caller closes it.
type Streams struct {
	cfg    StreamsConfig
	client *tls.Config
	dialer net.Dialer
	slots  chan struct{} // one per stream carried for another replica

	ctx    context.Context // ends at Close: every stream carried is cut
	cancel context.CancelFunc
	wg     sync.WaitGroup // the streams carried for other replicas

	mu     sync.Mutex // guards closed against wg.Add
	closed bool

	carried atomic.Int64 // streams carried for other replicas now
}

// NewStreams returns Streams for cfg; zero bounds take the defaults. It
// starts nothing.
func NewStreams(cfg StreamsConfig) (*Streams, error) {
	def := DefaultStreamsConfig()
	if cfg.Kinds == nil {
		cfg.Kinds = def.Kinds
	}
	if cfg.MaxStreams == 0 {
		cfg.MaxStreams = def.MaxStreams
	}
	if cfg.OpenTimeout == 0 {
		cfg.OpenTimeout = def.OpenTimeout
	}
	if cfg.HalfClosed == 0 {
		cfg.HalfClosed = def.HalfClosed
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Streams{cfg: cfg, client: clientTLS(cfg.Cert, cfg.Roots), slots: make(chan struct{}, cfg.MaxStreams),
		dialer: net.Dialer{Timeout: cfg.OpenTimeout, KeepAlive: 30 * time.Second}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Close cuts every stream carried for other replicas, refuses new ones,
// and waits for them to end. It may be called more than once.
func (s *Streams) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}

// Open opens a stream of kind to box: on this replica's tunnel when the
// box is connected here, else through the replica that holds it, when
// kind may travel between replicas. The errors are errdefs': a box held
// nowhere, or no longer where the claims say, is unavailable and wraps
// tunnel.ErrOffline; a kind or metadata not carried between replicas is
// a permission error or invalid; a replica that does not answer is
// unavailable.
func (s *Streams) Open(ctx context.Context, box string, kind tunnel.Kind, meta map[string]string) (net.Conn, error) {
	// The box's own tunnel is the truth: a box that just moved here is
	// served here before the claims say so.
	c, err := s.cfg.Local.Open(ctx, box, kind, meta)
	if err == nil || !errors.Is(err, tunnel.ErrOffline) {
		return c, err
	}
	to, ok := s.cfg.Set.Holder(box)
	if !ok {
		return nil, err
	}
	if err := s.allowed(kind, meta); err != nil {
		return nil, err
	}
	return s.open(ctx, to, box, kind, meta)
}

// allowed checks that kind may travel between replicas, with meta.
func (s *Streams) allowed(kind tunnel.Kind, meta map[string]string) error {
	keys, ok := s.cfg.Kinds[kind]
	if !ok {
		return errdefs.Permission("%s streams are not carried between console replicas", truncate(string(kind), tunnel.MaxKindLen))
	}
	for k := range meta {
		if !slices.Contains(keys, k) {
			return errdefs.Invalid("a %s stream carried between console replicas may not carry %q", kind, truncate(k, tunnel.MaxMetaKeyLen))
		}
	}
	return nil
}

// open asks replica to to open the stream to box, and returns the
// connection that carries it.
func (s *Streams) open(ctx context.Context, to Replica, box string, kind tunnel.Kind, meta map[string]string) (net.Conn, error) {
	if err := validBox(box); err != nil {
		return nil, err
	}
	enc, err := tunnel.Header{Kind: kind, Meta: meta}.MarshalBinary()
	if err != nil {
		return nil, errdefs.Invalid("a %s stream to box %s: %v", kind, box, err)
	}
	u, err := url.Parse(to.URL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, errdefs.Unavailable("the console replica %s that holds box %s has no address to reach it at (%q)", to.ID, box, to.URL)
	}
	unreachable := func(err error) error {
		return errdefs.Unavailable("the console replica that holds box %s's tunnel (%s) did not answer: %w", box, to.Name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.OpenTimeout)
	defer cancel()
	raw, err := s.dialer.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return nil, unreachable(err)
	}
	cfg := s.client.Clone()
	cfg.ServerName = u.Hostname()
	tc := tls.Client(raw, cfg)
	// Everything up to the answer obeys ctx: its end breaks the wait.
	stop := context.AfterFunc(ctx, func() { raw.SetDeadline(time.Unix(1, 0)) })
	conn, err := s.handshake(tc, u.Host, box, enc, to)
	if !stop() {
		tc.Close()
		return nil, unreachable(context.Cause(ctx))
	}
	if err != nil {
		tc.Close()
		if errdefs.Kind(err) == nil {
			return nil, unreachable(err)
		}
		return nil, err
	}
	return conn, nil
}

// handshake sends the stream request on tc and reads the answer: the
// stream, or the error the other replica gave.
func (s *Streams) handshake(tc *tls.Conn, host, box string, enc []byte, to Replica) (net.Conn, error) {
	if err := tc.Handshake(); err != nil {
		return nil, err
	}
	req := &http.Request{Method: http.MethodGet, URL: &url.URL{Scheme: "https", Host: host, Path: StreamPath},
		Host: host, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{
			"Connection":      {"Upgrade"},
			"Upgrade":         {streamProto},
			boxHeader:         {box},
			streamHeader:      {base64.RawURLEncoding.EncodeToString(enc)},
			ForwardedByHeader: {s.cfg.Set.Self().ID},
		}}
	if err := req.Write(tc); err != nil {
		return nil, err
	}
	lr := &io.LimitedReader{R: tc, N: maxAnswerHead}
	br := bufio.NewReader(lr)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBody))
		return nil, answerError(resp.StatusCode, body, to.Name)
	}
	if !strings.EqualFold(resp.Header.Get("Upgrade"), streamProto) {
		return nil, fmt.Errorf("it switched to %q, not %s", truncate(resp.Header.Get("Upgrade"), 64), streamProto)
	}
	// Bytes the box sent right after the answer may already be read.
	early, _ := br.Peek(br.Buffered())
	tc.SetDeadline(time.Time{})
	return &streamConn{Conn: tc, early: bytes.Clone(early)}, nil
}

// answerError is the error for another replica's answer other than 101:
// its status and, when the body is the JSON error of writeError, its
// message, bounded and made printable.
func answerError(code int, body []byte, replica string) error {
	var e struct {
		Error string `json:"error"`
	}
	msg := ""
	if json.Unmarshal(body, &e) == nil {
		msg = printable(e.Error)
	}
	if msg == "" {
		msg = fmt.Sprintf("an answer of %d %s", code, http.StatusText(code))
	}
	msg = "console replica " + replica + ": " + msg
	switch code {
	case http.StatusNotFound:
		return errdefs.Unavailable("%s: %w", msg, tunnel.ErrOffline)
	case http.StatusBadRequest:
		return errdefs.Invalid("%s", msg)
	case http.StatusForbidden:
		return errdefs.Permission("%s", msg)
	default:
		return errdefs.Unavailable("%s", msg)
	}
}

// printable is s bounded to maxReason bytes, in valid UTF-8, without
// control characters.
func printable(s string) string {
	s = truncate(strings.ToValidUTF8(s, "?"), maxReason)
	return strings.TrimSpace(strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s))
}

// truncate bounds s to n bytes, cut at a character's end.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// validBox checks a box ID as a stream request carries it.
func validBox(box string) error {
	if box == "" || len(box) > MaxBoxID {
		return errdefs.Invalid("a box ID must be 1 to %d characters", MaxBoxID)
	}
	for _, c := range []byte(box) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':' || c == '~') {
			return errdefs.Invalid("box ID %q: only letters, digits and -_.:~", truncate(box, 64))
		}
	}
	return nil
}

// parseStreamRequest reads a stream request's box and encoded tunnel
// header; it checks their form, not whether the kind is carried.
func parseStreamRequest(box, enc string) (tunnel.Header, error) {
	if err := validBox(box); err != nil {
		return tunnel.Header{}, err
	}
	if enc == "" || len(enc) > maxStreamHeader {
		return tunnel.Header{}, errdefs.Invalid("the stream's kind and metadata must be 1 to %d characters of base64", maxStreamHeader)
	}
	b, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return tunnel.Header{}, errdefs.Invalid("the stream's kind and metadata are not base64url: %v", err)
	}
	r := bytes.NewReader(b)
	h, err := tunnel.ReadHeader(r)
	if err != nil {
		return tunnel.Header{}, errdefs.Invalid("the stream's kind and metadata: %v", err)
	}
	if r.Len() != 0 {
		return tunnel.Header{}, errdefs.Invalid("%d bytes after the stream's kind and metadata", r.Len())
	}
	return h, nil
}

// Mount returns h with the stream endpoint in front of it: requests for
// StreamPath open streams, all others go to h. Behind ServeReplicas, on
// a listener with ListenerTLS, as the replica listener's handler.
func (s *Streams) Mount(h http.Handler) http.Handler {
	if s == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == StreamPath {
			s.serve(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// callerReplica is the replica a request's verified certificate names.
func callerReplica(r *http.Request) (string, bool) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return "", false
	}
	id, err := pki.ReplicaID(r.TLS.VerifiedChains[0][0])
	return id, err == nil
}

// serve opens the stream another replica asks for on this replica's
// tunnel, answers, and carries it until it ends.
func (s *Streams) serve(w http.ResponseWriter, r *http.Request) {
	caller, ok := callerReplica(r)
	if !ok {
		writeError(w, http.StatusForbidden, "only console replicas open streams here")
		return
	}
	if r.Method != http.MethodGet || !headerHas(r.Header, "Connection", "upgrade") || !strings.EqualFold(r.Header.Get("Upgrade"), streamProto) {
		writeError(w, http.StatusBadRequest, "a stream is opened with a GET upgrading to "+streamProto)
		return
	}
	box := r.Header.Get(boxHeader)
	h, err := parseStreamRequest(box, r.Header.Get(streamHeader))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.allowed(h.Kind, h.Meta); err != nil {
		code := http.StatusBadRequest
		if errors.Is(err, errdefs.ErrPermission) {
			code = http.StatusForbidden
		}
		writeError(w, code, err.Error())
		return
	}
	log := s.cfg.Log.With("box_id", box, "kind", h.Kind, "replica", caller)

	select {
	case s.slots <- struct{}{}:
	default:
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("this console replica carries %d streams for the others already; try again later", s.cfg.MaxStreams))
		return
	}
	defer func() { <-s.slots }()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		writeError(w, http.StatusServiceUnavailable, "this console replica is stopping")
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()

	octx, cancel := context.WithTimeout(r.Context(), s.cfg.OpenTimeout)
	stop := context.AfterFunc(s.ctx, cancel)
	st, err := s.cfg.Local.Open(octx, box, h.Kind, h.Meta)
	stop()
	cancel()
	if err != nil {
		if errors.Is(err, tunnel.ErrOffline) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("box %s is not connected to this console replica", box))
			return
		}
		log.Info("a stream another console replica asked for was not opened", "err", err)
		writeError(w, http.StatusBadGateway, fmt.Sprintf("opening a %s stream to box %s: %v", h.Kind, box, err))
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		st.Close()
		log.Warn("a stream's connection could not be taken over", "err", err)
		writeError(w, http.StatusInternalServerError, "this console replica cannot carry streams on this connection")
		return
	}
	early, _ := brw.Reader.Peek(brw.Reader.Buffered())
	peer := &streamConn{Conn: conn, early: bytes.Clone(early)}
	conn.SetDeadline(time.Now().Add(s.cfg.OpenTimeout))
	brw.Writer.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + streamProto + "\r\n\r\n")
	if err := brw.Writer.Flush(); err != nil {
		st.Close()
		conn.Close()
		log.Info("a stream's answer did not reach the console replica that asked", "err", err)
		return
	}
	conn.SetDeadline(time.Time{})
	s.carried.Add(1)
	defer s.carried.Add(-1)
	began := time.Now()
	log.Debug("carrying a stream for another console replica")
	up, down := s.pipe(peer, st)
	log.Debug("stopped carrying a stream for another console replica", "to_box", up, "from_box", down,
		"after", time.Since(began).Round(time.Millisecond))
}

// headerHas reports whether a comma-separated header of h lists token.
func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for f := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), token) {
				return true
			}
		}
	}
	return false
}

// pipe carries a to b and b to a until both directions end, and returns
// the bytes each way. A direction that ends cleanly half-closes its
// destination; the other then has HalfClosed to end too. A direction
// that breaks, the half-closed time running out, or Close ends both at
// once. Both are closed when it returns.
func (s *Streams) pipe(a, b net.Conn) (aToB, bToA int64) {
	var once sync.Once
	cut := func() { once.Do(func() { abort(a); abort(b) }) }
	stop := context.AfterFunc(s.ctx, cut)
	defer stop()
	var linger sync.Once
	var timer *time.Timer
	var timerMu sync.Mutex
	ended := func() {
		linger.Do(func() {
			timerMu.Lock()
			timer = time.AfterFunc(s.cfg.HalfClosed, cut)
			timerMu.Unlock()
		})
	}
	half := func(dst, src net.Conn) int64 {
		n, err := io.Copy(dst, src)
		if err != nil {
			cut()
			return n
		}
		closeWrite(dst)
		ended()
		return n
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		bToA = half(a, b)
	}()
	aToB = half(b, a)
	wg.Wait()
	timerMu.Lock()
	if timer != nil {
		timer.Stop()
	}
	timerMu.Unlock()
	a.Close()
	b.Close()
	return aToB, bToA
}

// abort ends c at once both ways: a tunnel stream's Close leaves its
// reads waiting for the far side, its Abort does not.
func abort(c net.Conn) {
	if a, ok := c.(interface{ Abort() error }); ok {
		a.Abort()
		return
	}
	c.Close()
}

// closeWrite ends c's sending side, or c when it cannot half-close.
func closeWrite(c net.Conn) {
	if hc, ok := c.(interface{ CloseWrite() error }); ok {
		hc.CloseWrite()
		return
	}
	c.Close()
}

// streamConn is a connection taken over for a stream: what was read past
// the answer (or the request) comes first.
type streamConn struct {
	net.Conn
	early []byte // read by the one reader
}

func (c *streamConn) Read(p []byte) (int, error) {
	if len(c.early) > 0 {
		n := copy(p, c.early)
		c.early = c.early[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// CloseWrite ends the sending side (a TLS close_notify): the far side
// reads the end of the stream, and reads go on here.
func (c *streamConn) CloseWrite() error {
	if hc, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return hc.CloseWrite()
	}
	return c.Conn.Close()
}
