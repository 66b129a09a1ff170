package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// SessionOptions say what a remote session runs.
type SessionOptions struct {
	Workload string   // "" is the box itself
	Command  []string // empty is an interactive shell
	TTY      bool
	Cols     int
	Rows     int
	Term     string
}

// Session is an open remote session. Its Send methods are safe for
// concurrent use; Recv is called from one goroutine.
type Session struct {
	ws *websocket.Conn
	mu sync.Mutex // one writer at a time
}

// OpenSession opens a remote session on box.
func (c *Client) OpenSession(ctx context.Context, box string, o SessionOptions) (*Session, error) {
	q := url.Values{}
	if o.Workload != "" {
		q.Set("workload", o.Workload)
	}
	for _, a := range o.Command {
		q.Add("cmd", a)
	}
	if o.TTY {
		q.Set("tty", "1")
		if o.Cols > 0 && o.Rows > 0 {
			q.Set("cols", strconv.Itoa(o.Cols))
			q.Set("rows", strconv.Itoa(o.Rows))
		}
		if o.Term != "" {
			q.Set("term", o.Term)
		}
	}
	return c.openSocket(ctx, "/api/v1/boxes/"+url.PathEscape(box)+"/exec?"+q.Encode(), 4<<10)
}

// openSocket opens a session's WebSocket at path, writing frames of up
// to writeBuf bytes.
func (c *Client) openSocket(ctx context.Context, path string, writeBuf int) (*Session, error) {
	u := "wss" + strings.TrimPrefix(c.base, "https") + path
	h := http.Header{}
	if c.token != "" {
		h.Set("Authorization", "Bearer "+c.token)
	}
	if c.tenant != "" {
		h.Set("X-Edgebox-Tenant", c.tenant)
	}
	d := websocket.Dialer{TLSClientConfig: c.tls.Clone(), Proxy: http.ProxyFromEnvironment, HandshakeTimeout: 20 * time.Second,
		ReadBufferSize: 32 << 10, WriteBufferSize: writeBuf}
	ws, resp, err := d.DialContext(ctx, u, h)
	if err != nil {
		if resp != nil && resp.StatusCode >= 300 {
			defer resp.Body.Close()
			var e Error
			raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			if json.Unmarshal(raw, &e) != nil || e.Error == "" {
				e.Error = fmt.Sprintf("console answered %s", resp.Status)
			}
			return nil, &StatusError{Status: resp.StatusCode, Message: e.Error}
		}
		return nil, fmt.Errorf("cannot reach the console at %s: %w", c.base, err)
	}
	ws.SetReadLimit(MaxFramePayload + 1024)
	return &Session{ws: ws}, nil
}

func (s *Session) send(msg []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ws.WriteMessage(websocket.BinaryMessage, msg)
}

// Write sends input, split into frames.
func (s *Session) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := p[:min(len(p), MaxFramePayload)]
		if err := s.send(EncodeFrame(FrameInput, c)); err != nil {
			return n, err
		}
		n, p = n+len(c), p[len(c):]
	}
	return n, nil
}

// Resize says the terminal's new size.
func (s *Session) Resize(cols, rows int) error {
	return s.send(EncodeJSONFrame(FrameResize, Resize{Cols: cols, Rows: rows}))
}

// Signal sends one of Signals to the process.
func (s *Session) Signal(name string) error { return s.send(EncodeFrame(FrameSignal, []byte(name))) }

// CloseInput ends the process's input.
func (s *Session) CloseInput() error { return s.send(EncodeFrame(FrameEOF, nil)) }

// Recv returns the next frame from the console: output, status or exit.
func (s *Session) Recv() (Frame, error) {
	for {
		t, msg, err := s.ws.ReadMessage()
		if websocket.IsCloseError(err, websocket.CloseAbnormalClosure) {
			// No goodbye: the connection broke, or the console, or the
			// console replica the session ran on, stopped.
			return Frame{}, fmt.Errorf("%w: %w", ErrSessionLost, err)
		}
		if err != nil {
			return Frame{}, err
		}
		if t != websocket.BinaryMessage || len(msg) == 0 {
			continue
		}
		return Frame{Type: msg[0], Payload: msg[1:]}, nil
	}
}

// ErrSessionLost is the end of a session whose connection to the console
// broke without a goodbye: the network, or the console (or the console
// replica it ran on) stopped. The command on the box ends with it.
var ErrSessionLost = errors.New("the connection to the console broke off: the network failed, or the console (or the console replica serving this session) stopped; the session's command on the box ends with it")

// Close closes the session's connection; a session still running ends.
func (s *Session) Close() error {
	s.mu.Lock()
	s.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	s.mu.Unlock()
	return s.ws.Close()
}

// Run copies the session's output to stdout and stderr until it ends,
// calls onStatus for each status, and returns how it ended. A session
// whose connection breaks before its end returns an error.
func (s *Session) Run(stdout, stderr io.Writer, onStatus func(SessionStatus)) (SessionExit, error) {
	for {
		f, err := s.Recv()
		if err != nil {
			return SessionExit{}, fmt.Errorf("the session's connection broke: %w", err)
		}
		switch f.Type {
		case FrameOutput:
			if _, err := stdout.Write(f.Payload); err != nil {
				return SessionExit{}, err
			}
		case FrameStderr:
			if _, err := stderr.Write(f.Payload); err != nil {
				return SessionExit{}, err
			}
		case FrameStatus:
			var st SessionStatus
			if json.Unmarshal(f.Payload, &st) == nil && onStatus != nil {
				onStatus(st)
			}
		case FrameExit:
			var e SessionExit
			if err := json.Unmarshal(f.Payload, &e); err != nil {
				return SessionExit{}, errors.New("the console's end of session is not what this CLI expects")
			}
			return e, nil
		}
	}
}

// Sessions lists the tenant's remote sessions, newest first: only live
// ones when live, only box's when box is set.
func (c *Client) Sessions(ctx context.Context, live bool, box string) ([]SessionRecord, error) {
	q := url.Values{}
	if live {
		q.Set("live", "1")
	}
	if box != "" {
		q.Set("box", box)
	}
	var out []SessionRecord
	err := c.do(ctx, http.MethodGet, "/api/v1/sessions?"+q.Encode(), nil, &out)
	return out, err
}

// EndSession ends a live session.
func (c *Client) EndSession(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, "/api/v1/sessions/"+url.PathEscape(id)+"/end", nil, nil)
}

// SessionRecord is a remote session as the console records it. EndedBy
// says what ended it: "exit", "idle", "time limit", "user:<name>", "box",
// "operator left", "bad input", "refused", "console stopped".
type SessionRecord struct {
	ID       string     `json:"id"`
	TenantID string     `json:"tenant_id"`
	Box      string     `json:"box"`
	BoxName  string     `json:"box_name,omitempty"`
	Workload string     `json:"workload,omitempty"`
	Kind     string     `json:"kind"`
	Command  []string   `json:"command,omitempty"`
	TTY      bool       `json:"tty"`
	User     string     `json:"user"`
	Remote   string     `json:"remote,omitempty"`
	Started  time.Time  `json:"started"`
	Ended    *time.Time `json:"ended,omitempty"`
	EndedBy  string     `json:"ended_by,omitempty"`
	ExitCode *int       `json:"exit_code,omitempty"`
	Signal   string     `json:"signal,omitempty"`
	Error    string     `json:"error,omitempty"`
	BytesIn  int64      `json:"bytes_in"`
	BytesOut int64      `json:"bytes_out"`
	// Recording is what the session's recording held when it ended.
	Recording *RecordingSummary `json:"recording,omitempty"`
	// Target is a forward's "host:port", as seen from the box; Conns is
	// how many connections it carried.
	Target string `json:"target,omitempty"`
	Conns  int64  `json:"conns,omitempty"`
	// ViewOnly: a VM screen that passed no key, pointer or clipboard.
	ViewOnly bool `json:"view_only,omitempty"`
	// FourEyes: the session waited for a second user's approval;
	// ApprovedBy is who gave it.
	FourEyes   bool       `json:"four_eyes,omitempty"`
	ApprovedBy string     `json:"approved_by,omitempty"`
	ApprovedAt *time.Time `json:"approved_at,omitempty"`
}

// Live reports whether the session has not ended.
func (r SessionRecord) Live() bool { return r.Ended == nil }

// RecordingSummary is a session recording's state: its chunks, bytes, and
// the last chunk's hash, which the chain must end on.
type RecordingSummary struct {
	Chunks    int    `json:"chunks"`
	Bytes     int64  `json:"bytes"`
	Head      string `json:"head"`
	Truncated bool   `json:"truncated,omitempty"` // output past the console's limit was not recorded
}

// SessionRecording writes a session's recording (asciicast v2) to w.
func (c *Client) SessionRecording(ctx context.Context, id string, w io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/api/v1/sessions/"+url.PathEscape(id)+"/recording", nil)
	if err != nil {
		return err
	}
	c.authorize(req)
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the console at %s: %w", c.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var e Error
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(raw, &e) != nil || e.Error == "" {
			e.Error = fmt.Sprintf("console answered %s", resp.Status)
		}
		return &StatusError{Status: resp.StatusCode, Message: e.Error}
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

// RecordingReport is what verifying a recording found.
type RecordingReport struct {
	Chunks    int    `json:"chunks"`
	OK        bool   `json:"ok"`
	Problem   string `json:"problem,omitempty"`
	BadChunk  int    `json:"bad_chunk"`
	Unchained int64  `json:"unchained_bytes,omitempty"`
	Head      string `json:"head"`
}

// VerifySession checks a session's recording on the console.
func (c *Client) VerifySession(ctx context.Context, id string) (RecordingReport, error) {
	var r RecordingReport
	err := c.do(ctx, http.MethodGet, "/api/v1/sessions/"+url.PathEscape(id)+"/recording/verify", nil, &r)
	return r, err
}

// SessionRules are a tenant's rules for remote sessions.
type SessionRules struct {
	// FourEyes: a session on a box that any of these match opens only
	// once a second user, with the maintainer or admin role, approves
	// it; that user may watch it live and end it.
	FourEyes []BoxMatch `json:"four_eyes,omitempty"`
	// ForwardSites and ForwardBoxes allow port forwards from a site's
	// boxes, or from one box (by ID), to hosts on their LAN: each entry is
	// ADDRESS[/BITS]:PORTS or HOSTNAME:PORTS, PORTS being a port, a range
	// LOW-HIGH, or *. A box's own ports (127.0.0.1, ::1, localhost) need
	// no entry.
	ForwardSites map[string][]string `json:"forward_sites,omitempty"`
	ForwardBoxes map[string][]string `json:"forward_boxes,omitempty"`
	UpdatedAt    time.Time           `json:"updated_at,omitzero"`
	UpdatedBy    string              `json:"updated_by,omitempty"`
}

// BoxMatch picks boxes: those with every label it names, in its region
// and site when it names them.
type BoxMatch struct {
	Labels map[string]string `json:"labels,omitempty"`
	Region string            `json:"region,omitempty"`
	Site   string            `json:"site,omitempty"`
}

// GetSessionRules returns the tenant's session rules.
func (c *Client) GetSessionRules(ctx context.Context) (SessionRules, error) {
	var r SessionRules
	err := c.do(ctx, http.MethodGet, "/api/v1/session-rules", nil, &r)
	return r, err
}

// SetSessionRules replaces the tenant's session rules.
func (c *Client) SetSessionRules(ctx context.Context, r SessionRules) (SessionRules, error) {
	var out SessionRules
	err := c.do(ctx, http.MethodPut, "/api/v1/session-rules", r, &out)
	return out, err
}

// ApproveSession approves a four-eyes session that waits.
func (c *Client) ApproveSession(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, "/api/v1/sessions/"+url.PathEscape(id)+"/approve", nil, nil)
}

// WatchSession opens a live session's output, read only.
func (c *Client) WatchSession(ctx context.Context, id string) (*Session, error) {
	return c.openSocket(ctx, "/api/v1/sessions/"+url.PathEscape(id)+"/watch", 4<<10)
}

// OpenForward opens a port forward from box to target ("host:port" as
// the box sees it); the caller runs a multiplexer on the connection, a
// stream per TCP connection.
//
// On a box that needs a second maintainer's approval, request is the ID
// of an approved request (AskSession); without one the console refuses
// with a StatusError whose message starts with "approval needed".
func (c *Client) OpenForward(ctx context.Context, box, target, request string) (net.Conn, error) {
	q := url.Values{"target": {target}}
	if request != "" {
		q.Set("request", request)
	}
	s, err := c.openSocket(ctx, "/api/v1/boxes/"+url.PathEscape(box)+"/forward?"+q.Encode(), 64<<10)
	if err != nil {
		return nil, err
	}
	s.ws.SetReadLimit(1 << 20)
	return MuxWebSocketConn(s.ws), nil
}

// FileInfo is what a box has at a path.
type FileInfo struct {
	Exists    bool   `json:"exists"`
	Size      int64  `json:"size"`
	Mode      uint32 `json:"mode"`
	MtimeUnix int64  `json:"mtime_unix"`
	SHA256    string `json:"sha256,omitempty"`
	// PartSize is how much of an upload to the path is on the box.
	PartSize int64 `json:"part_size"`
	// Complete: an upload's file is whole and in place.
	Complete bool `json:"complete"`
	IsDir    bool `json:"is_dir"`
}

func fileQuery(path, volume string) url.Values {
	q := url.Values{"path": {path}}
	if volume != "" {
		q.Set("volume", volume)
	}
	return q
}

// StatFile says what box has at path (within volume "APP/VOLUME" when
// set), with its SHA-256 when withSum.
func (c *Client) StatFile(ctx context.Context, box, path, volume string, withSum bool) (FileInfo, error) {
	q := fileQuery(path, volume)
	if withSum {
		q.Set("sha256", "1")
	}
	var fi FileInfo
	err := c.doWith(ctx, c.longHTTP(), http.MethodGet, "/api/v1/boxes/"+url.PathEscape(box)+"/files/stat?"+q.Encode(), nil, &fi)
	return fi, err
}

// longHTTP is the client without its overall time limit, for copies.
func (c *Client) longHTTP() *http.Client {
	hc := *c.http
	hc.Timeout = 0
	return &hc
}

// UploadFile sends body, the bytes of a file of size bytes with SHA-256
// sum from offset on, to path on box. The answer says how far the box's
// part is, and whether the file is whole and in place.
func (c *Client) UploadFile(ctx context.Context, box, path, volume string, offset, size int64, sum string, mode uint32, body io.Reader) (FileInfo, error) {
	q := fileQuery(path, volume)
	q.Set("offset", strconv.FormatInt(offset, 10))
	q.Set("size", strconv.FormatInt(size, 10))
	q.Set("sha256", sum)
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(mode), 8))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.base+"/api/v1/boxes/"+url.PathEscape(box)+"/files?"+q.Encode(), body)
	if err != nil {
		return FileInfo{}, err
	}
	req.ContentLength = size - offset
	req.Header.Set("Content-Type", "application/octet-stream")
	c.authorize(req)
	var fi FileInfo
	return fi, c.send(c.longHTTP(), req, &fi)
}

// DownloadFile reads path on box from offset; it returns the body and
// how many bytes it holds.
func (c *Client) DownloadFile(ctx context.Context, box, path, volume string, offset int64) (io.ReadCloser, int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/api/v1/boxes/"+url.PathEscape(box)+"/files?"+fileQuery(path, volume).Encode(), nil)
	if err != nil {
		return nil, 0, err
	}
	if offset > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
	}
	c.authorize(req)
	resp, err := c.longHTTP().Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("cannot reach the console at %s: %w", c.base, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		var e Error
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(raw, &e) != nil || e.Error == "" {
			e.Error = fmt.Sprintf("console answered %s", resp.Status)
		}
		return nil, 0, &StatusError{Status: resp.StatusCode, Message: e.Error}
	}
	if offset > 0 && resp.StatusCode != http.StatusPartialContent {
		resp.Body.Close()
		return nil, 0, errors.New("the console did not resume the download where asked")
	}
	return resp.Body, resp.ContentLength, nil
}

// OpenScreen opens a VM workload's screen: RFB (VNC) bytes both ways,
// as a VNC viewer speaks them; viewOnly passes no key, pointer or
// clipboard to the VM.
func (c *Client) OpenScreen(ctx context.Context, box, workload string, viewOnly bool, request string) (net.Conn, error) {
	q := url.Values{}
	if viewOnly {
		q.Set("view_only", "1")
	}
	if request != "" {
		q.Set("request", request)
	}
	s, err := c.openSocket(ctx, "/api/v1/boxes/"+url.PathEscape(box)+"/workloads/"+url.PathEscape(workload)+"/screen?"+q.Encode(), 64<<10)
	if err != nil {
		return nil, err
	}
	s.ws.SetReadLimit(16 << 20)
	return WebSocketConn(s.ws), nil
}

// NeedsApproval reports whether err is a console's refusal of a screen or
// forward that needs a second maintainer's approval first.
func NeedsApproval(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Status == http.StatusForbidden && strings.HasPrefix(se.Message, "approval needed")
}

// AskSession asks for the approval a screen (kind "screen", workload)
// or a forward ("forward", target) needs on a four-eyes box.
func (c *Client) AskSession(ctx context.Context, box, kind, workload, target string, viewOnly bool) (SessionRecord, error) {
	var out SessionRecord
	err := c.do(ctx, http.MethodPost, "/api/v1/boxes/"+url.PathEscape(box)+"/session-requests",
		map[string]any{"kind": kind, "workload": workload, "target": target, "view_only": viewOnly}, &out)
	return out, err
}

// Session returns one session's record.
func (c *Client) Session(ctx context.Context, id string) (SessionRecord, error) {
	var out SessionRecord
	err := c.do(ctx, http.MethodGet, "/api/v1/sessions/"+url.PathEscape(id), nil, &out)
	return out, err
}
