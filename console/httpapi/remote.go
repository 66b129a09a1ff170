package httpapi

import (
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"
	"github.com/gorilla/websocket"

	"github.com/edgebox/edgebox/api"
	"github.com/edgebox/edgebox/console/auth"
	"github.com/edgebox/edgebox/console/fleet"
	"github.com/edgebox/edgebox/console/sessions"
	"github.com/edgebox/edgebox/errdefs"
	edgeboxv1 "github.com/edgebox/edgebox/proto/edgebox/v1"
)

// Bounds on a session's request, as the box checks them too.
const (
	maxSessionArgs     = 64
	maxSessionArgBytes = 64 << 10
	maxTermName        = 64
)

// upgrader makes a session's WebSocket. A browser's must come from the
// console's own pages (cross-site WebSocket hijacking); a CLI sends no
// Origin. forwardUpgrader's, for port forwards, moves bulk data.
var (
	upgrader = websocket.Upgrader{
		ReadBufferSize:  4 << 10,
		WriteBufferSize: 32 << 10,
		CheckOrigin:     func(r *http.Request) bool { return checkOrigin(r) == nil },
	}
	forwardUpgrader = websocket.Upgrader{
		ReadBufferSize:  64 << 10,
		WriteBufferSize: 64 << 10,
		CheckOrigin:     func(r *http.Request) bool { return checkOrigin(r) == nil },
	}
)

// openSession opens a remote session on a box (GET with a WebSocket
// upgrade): ?workload=W&tty=1&cols=N&rows=N&term=T&cmd=A&cmd=B…; no cmd is
// an interactive shell.
func (s *server) openSession(c *gin.Context) {
	b, ok := s.findBox(c)
	if !ok {
		return
	}
	req, err := sessionRequest(c)
	if err != nil {
		fail(c, err)
		return
	}
	if !s.Sessions.Presence(b.ID).Online {
		fail(c, errdefs.Unavailable("box %s is offline; a session needs it online", b.Name))
		return
	}
	if !websocket.IsWebSocketUpgrade(c.Request) {
		fail(c, errdefs.Invalid("a session is a WebSocket: use 'edgebox shell', 'edgebox exec' or the web console"))
		return
	}
	who := caller(c)
	req.TenantID, req.Box, req.BoxName, req.User, req.Remote = who.TenantID, b.ID, b.Name, who.Name, who.Remote
	req.BoxLabels, req.Region, req.Site = b.Labels, b.Region, b.Site
	ws, err := upgrader.Upgrade(c.Writer, c.Request, nil)
	if err != nil {
		return // the upgrader answered
	}
	ws.SetReadLimit(api.MaxFramePayload + 1)
	s.RemoteSessions.Serve(c.Request.Context(), req, &wsOperator{ws: ws})
}

// sessionRequest reads a session's request from the query.
func sessionRequest(c *gin.Context) (sessions.Request, error) {
	q := c.Request.URL.Query()
	r := sessions.Request{Workload: q.Get("workload"), Command: q["cmd"], TTY: q.Get("tty") == "1", Term: q.Get("term")}
	if r.Workload != "" && !edgeboxv1.ValidObjectName(r.Workload) {
		return r, errdefs.Invalid("workload name %q is not valid", truncate(r.Workload, 64))
	}
	if len(r.Command) > maxSessionArgs {
		return r, errdefs.Invalid("%d arguments; at most %d", len(r.Command), maxSessionArgs)
	}
	n := 0
	for _, a := range r.Command {
		n += len(a)
		if !utf8.ValidString(a) {
			return r, errdefs.Invalid("an argument is not UTF-8")
		}
	}
	if n > maxSessionArgBytes || (len(r.Command) > 0 && r.Command[0] == "") {
		return r, errdefs.Invalid("the command is empty or longer than %d bytes", maxSessionArgBytes)
	}
	for _, f := range []struct {
		name string
		v    *int
	}{{"cols", &r.Cols}, {"rows", &r.Rows}} {
		v := q.Get(f.name)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > api.MaxTerminalSize {
			return r, errdefs.Invalid("%s %q: use 1 to %d", f.name, truncate(v, 16), api.MaxTerminalSize)
		}
		*f.v = n
	}
	if len(r.Term) > maxTermName {
		return r, errdefs.Invalid("term is longer than %d bytes", maxTermName)
	}
	for _, ch := range []byte(r.Term) {
		if ch <= ' ' || ch > '~' || ch == '=' {
			return r, errdefs.Invalid("term %q is not a terminal's name", truncate(r.Term, 64))
		}
	}
	return r, nil
}

// wsOperator is a session's operator over a WebSocket.
type wsOperator struct{ ws *websocket.Conn }

// wsWriteTimeout bounds one frame's write: an operator whose connection
// takes no more for this long has gone.
const wsWriteTimeout = 30 * time.Second

func (o *wsOperator) ReadMessage() ([]byte, error) {
	for {
		t, msg, err := o.ws.ReadMessage()
		if err != nil {
			return nil, err
		}
		if t == websocket.BinaryMessage {
			return msg, nil
		}
		// Text messages carry nothing in a session.
	}
}

func (o *wsOperator) WriteMessage(msg []byte) error {
	o.ws.SetWriteDeadline(time.Now().Add(wsWriteTimeout))
	return o.ws.WriteMessage(websocket.BinaryMessage, msg)
}

func (o *wsOperator) Close() error {
	o.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	return o.ws.Close()
}

func (s *server) listSessions(c *gin.Context) {
	q := sessions.Query{LiveOnly: c.Query("live") == "1", Box: c.Query("box")}
	if l := c.Query("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			fail(c, errdefs.Invalid("limit %q: use 1 to 1000", truncate(l, 16)))
			return
		}
		q.Limit = n
	}
	if q.Box != "" {
		b, ok := s.lookupBox(c, q.Box)
		if !ok {
			return
		}
		q.Box = b.ID
	}
	out, err := s.RemoteSessions.List(c.Request.Context(), caller(c).TenantID, q)
	if err != nil {
		s.fail(c, err)
		return
	}
	if out == nil {
		out = []sessions.Record{}
	}
	c.JSON(http.StatusOK, out)
}

func (s *server) getSession(c *gin.Context) {
	r, err := s.RemoteSessions.Get(c.Request.Context(), caller(c).TenantID, c.Param("sid"))
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, r)
}

// liveSessionFor finds the live session the call names, which the caller
// may act on (verb: end, watch): their own, the one they approved, or any
// for an admin; it answers the call when there is none.
func (s *server) liveSessionFor(c *gin.Context, verb string) (sessions.Record, bool) {
	who := caller(c)
	r, err := s.RemoteSessions.Get(c.Request.Context(), who.TenantID, c.Param("sid"))
	if err != nil {
		s.fail(c, err)
		return r, false
	}
	if !r.Live() {
		fail(c, errdefs.Conflict("session %s ended already (%s); its recording shows what happened", r.ID, r.EndedBy))
		return r, false
	}
	if !s.RemoteSessions.CanEnd(r, who.Name) && !accessOf(c).Role.Can(auth.Administer) {
		fail(c, errdefs.Permission("only an admin, or the user who approved it, may %s another user's session", verb))
		return r, false
	}
	return r, true
}

// endSession ends a live session: its own user's, or any, for an admin.
func (s *server) endSession(c *gin.Context) {
	who := caller(c)
	r, ok := s.liveSessionFor(c, "end")
	if !ok {
		return
	}
	if err := s.RemoteSessions.End(who.TenantID, r.ID, who.Name); err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"ended": r.ID})
}

// sessionRecording serves a session's recording, an asciicast v2 file
// that asciinema plays.
func (s *server) sessionRecording(c *gin.Context) {
	r, err := s.RemoteSessions.Get(c.Request.Context(), caller(c).TenantID, c.Param("sid"))
	if err != nil {
		s.fail(c, err)
		return
	}
	f, err := s.RemoteSessions.OpenRecording(r)
	if err != nil {
		s.fail(c, err)
		return
	}
	defer f.Close()
	c.Header("Content-Disposition", `attachment; filename="`+r.ID+`.cast"`)
	c.Header("Cache-Control", "no-store")
	http.ServeContent(c.Writer, c.Request, r.ID+".cast", r.Started, f)
}

// verifySession checks a session's recording against its chain and the
// last chunk the console recorded.
func (s *server) verifySession(c *gin.Context) {
	r, err := s.RemoteSessions.Get(c.Request.Context(), caller(c).TenantID, c.Param("sid"))
	if err != nil {
		s.fail(c, err)
		return
	}
	rep, err := s.RemoteSessions.VerifyRecording(r)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, rep)
}

// approveSession lets a four-eyes session that waits run.
func (s *server) approveSession(c *gin.Context) {
	id := c.Param("sid")
	if !sessions.ValidID(id) {
		fail(c, errdefs.NotFound("no session %q", truncate(id, 32)))
		return
	}
	if err := s.RemoteSessions.Approve(c.Request.Context(), caller(c), id); err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"approved": id})
}

// watchSession shows a live session's output, read only (GET with a
// WebSocket upgrade): to the user who approved it, or an admin.
func (s *server) watchSession(c *gin.Context) {
	who := caller(c)
	r, ok := s.liveSessionFor(c, "watch")
	if !ok {
		return
	}
	if !websocket.IsWebSocketUpgrade(c.Request) {
		fail(c, errdefs.Invalid("watching a session is a WebSocket: use 'edgebox session watch' or the web console"))
		return
	}
	ws, err := upgrader.Upgrade(c.Writer, c.Request, nil)
	if err != nil {
		return
	}
	ws.SetReadLimit(api.MaxFramePayload + 1)
	s.RemoteSessions.Watch(c.Request.Context(), who.TenantID, r.ID, who.Name, &wsOperator{ws: ws})
}

func (s *server) getSessionRules(c *gin.Context) {
	r, err := s.RemoteSessions.GetRules(c.Request.Context(), caller(c).TenantID)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, r)
}

func (s *server) setSessionRules(c *gin.Context) {
	var r sessions.Rules
	if !bindJSON(c, &r) {
		return
	}
	out, err := s.RemoteSessions.SetRules(c.Request.Context(), caller(c), r)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, out)
}

// openForward opens a port forward from a box to ?target=HOST:PORT (GET
// with a WebSocket upgrade): the box's own ports, or a LAN host on the
// allow list of the box or its site.
func (s *server) openForward(c *gin.Context) {
	b, ok := s.findBox(c)
	if !ok {
		return
	}
	who := caller(c)
	target := c.Query("target")
	rules, err := s.RemoteSessions.GetRules(c.Request.Context(), who.TenantID)
	if err != nil {
		s.fail(c, err)
		return
	}
	if err := s.RemoteSessions.ForwardAllowed(rules, b.ID, b.Name, b.Site, target); err != nil {
		fail(c, err)
		return
	}
	approved, ok := s.approvedRequest(c, b, sessions.Record{TenantID: who.TenantID, Box: b.ID, User: who.Name, Kind: sessions.KindForward, Target: target})
	if !ok {
		return
	}
	ws, ok := s.upgradeBulk(c, b, "a forward", "use 'edgebox port-forward'")
	if !ok {
		return
	}
	s.RemoteSessions.Forward(c.Request.Context(), sessions.ForwardRequest{TenantID: who.TenantID, Box: b.ID, BoxName: b.Name,
		Target: target, User: who.Name, Remote: who.Remote, Approved: approved}, api.MuxWebSocketConn(ws))
}

// openScreen shows a VM workload's screen (GET with a WebSocket upgrade,
// RFB as noVNC speaks it); ?view_only=1 passes no key, pointer or
// clipboard to the VM.
func (s *server) openScreen(c *gin.Context) {
	b, ok := s.findBox(c)
	if !ok {
		return
	}
	name := c.Param("name")
	if !edgeboxv1.ValidObjectName(name) {
		fail(c, errdefs.Invalid("workload name %q is not valid", truncate(name, 64)))
		return
	}
	who := caller(c)
	viewOnly := c.Query("view_only") == "1"
	approved, ok := s.approvedRequest(c, b, sessions.Record{TenantID: who.TenantID, Box: b.ID, User: who.Name, Kind: sessions.KindScreen,
		Workload: name, ViewOnly: viewOnly})
	if !ok {
		return
	}
	ws, ok := s.upgradeBulk(c, b, "a screen", "open it in the web console or with 'edgebox screen'")
	if !ok {
		return
	}
	s.RemoteSessions.Screen(c.Request.Context(), sessions.ScreenRequest{TenantID: who.TenantID, Box: b.ID, BoxName: b.Name,
		Workload: name, User: who.Name, Remote: who.Remote, ViewOnly: viewOnly, Approved: approved}, api.WebSocketConn(ws))
}

// upgradeBulk checks that box b is online, the call a WebSocket and the
// console not full, then upgrades it for bulk bytes (a forward, a screen),
// answering the call when it cannot.
func (s *server) upgradeBulk(c *gin.Context, b fleet.Box, what, how string) (*websocket.Conn, bool) {
	switch {
	case !s.Sessions.Presence(b.ID).Online:
		fail(c, errdefs.Unavailable("box %s is offline; %s needs it online", b.Name, what))
		return nil, false
	case !websocket.IsWebSocketUpgrade(c.Request):
		fail(c, errdefs.Invalid("%s is a WebSocket: %s", what, how))
		return nil, false
	case s.RemoteSessions.Full():
		fail(c, errdefs.Unavailable("the console runs as many sessions as it may; try again later"))
		return nil, false
	}
	ws, err := forwardUpgrader.Upgrade(c.Writer, c.Request, nil)
	if err != nil {
		return nil, false // the upgrader answered
	}
	ws.SetReadLimit(1 << 20)
	return ws, true
}

// refuseFourEyes answers the call, saying why, when box b needs a second
// maintainer's approval for what the call would do (a copy, a web page),
// which has no way to wait for it; it reports whether it answered.
func (s *server) refuseFourEyes(c *gin.Context, b fleet.Box, instead string) bool {
	needs, err := s.fourEyes(c, b)
	switch {
	case err != nil:
		s.fail(c, err)
		return true
	case needs:
		fail(c, errdefs.Permission("box %s needs a second maintainer's approval for sessions; %s", b.Name, instead))
		return true
	}
	return false
}

// fourEyes reports whether the caller's tenant keeps box b to four eyes.
func (s *server) fourEyes(c *gin.Context, b fleet.Box) (bool, error) {
	return s.RemoteSessions.NeedsApproval(c.Request.Context(), sessions.Request{TenantID: caller(c).TenantID,
		BoxLabels: b.Labels, Region: b.Region, Site: b.Site})
}

// approvedRequest finds, for a screen or forward on a four-eyes box, the
// approved request it opens with (?request=ID), and answers the call when
// there is none. On other boxes it asks nothing.
func (s *server) approvedRequest(c *gin.Context, b fleet.Box, want sessions.Record) (*sessions.Record, bool) {
	needs, err := s.fourEyes(c, b)
	if err != nil {
		s.fail(c, err)
		return nil, false
	}
	if !needs {
		return nil, true
	}
	id := c.Query("request")
	if id == "" {
		fail(c, errdefs.Permission("%s: box %s needs a second maintainer's approval; ask with POST /api/v1/boxes/%s/session-requests, then open with ?request=ID once approved", NeedsApprovalCode, b.Name, b.ID))
		return nil, false
	}
	r, err := s.RemoteSessions.Take(id, want)
	if err != nil {
		fail(c, err)
		return nil, false
	}
	return &r, true
}

// NeedsApprovalCode starts the message of a screen or forward refused for
// want of a four-eyes approval, so a client knows to ask.
const NeedsApprovalCode = "approval needed"

// askSession asks for the approval a screen or forward needs on a
// four-eyes box: {"kind":"screen","workload":W,"view_only":B} or
// {"kind":"forward","target":"HOST:PORT"}.
func (s *server) askSession(c *gin.Context) {
	b, ok := s.findBox(c)
	if !ok {
		return
	}
	var req struct {
		Kind     string `json:"kind"`
		Workload string `json:"workload"`
		Target   string `json:"target"`
		ViewOnly bool   `json:"view_only"`
	}
	if !bindJSON(c, &req) {
		return
	}
	who := caller(c)
	switch req.Kind {
	case sessions.KindScreen:
		if !edgeboxv1.ValidObjectName(req.Workload) {
			fail(c, errdefs.Invalid("workload name %q is not valid", truncate(req.Workload, 64)))
			return
		}
		req.Target = ""
	case sessions.KindForward:
		rules, err := s.RemoteSessions.GetRules(c.Request.Context(), who.TenantID)
		if err != nil {
			s.fail(c, err)
			return
		}
		if err := s.RemoteSessions.ForwardAllowed(rules, b.ID, b.Name, b.Site, req.Target); err != nil {
			fail(c, err)
			return
		}
		req.Workload, req.ViewOnly = "", false
	default:
		fail(c, errdefs.Invalid("kind %q: screen or forward (a shell asks in its own session)", truncate(req.Kind, 32)))
		return
	}
	rec, err := s.RemoteSessions.Ask(c.Request.Context(), sessions.Asking{TenantID: who.TenantID, Box: b.ID, BoxName: b.Name,
		User: who.Name, Remote: who.Remote, Kind: req.Kind, Workload: req.Workload, Target: req.Target, ViewOnly: req.ViewOnly})
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusCreated, rec)
}
