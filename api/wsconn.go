package api

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// WebSocketConn makes a WebSocket a stream of bytes (a VM screen's RFB
// runs over it): each Write is one binary message, and Read returns the
// messages' bytes in order. Text messages are skipped.
func WebSocketConn(ws *websocket.Conn) net.Conn { return &wsConn{ws: ws} }

// MuxWebSocketConn is WebSocketConn for a yamux multiplexer (a port
// forward): a frame's header, which yamux writes on its own, is held and
// sent in one message with the frame's body.
func MuxWebSocketConn(ws *websocket.Conn) net.Conn { return &wsConn{ws: ws, mux: true} }

type wsConn struct {
	ws   *websocket.Conn
	mux  bool
	rmu  sync.Mutex
	r    io.Reader // the message being read
	wmu  sync.Mutex
	held []byte // a frame header, sent with the next write
}

// muxHeader is the size of a yamux frame header; muxData its data type
// and a data frame's length field.
const (
	muxHeader = 12
	muxData   = 0
)

func (c *wsConn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for {
		if c.r == nil {
			t, r, err := c.ws.NextReader()
			if err != nil {
				return 0, err
			}
			if t != websocket.BinaryMessage {
				continue
			}
			c.r = r
		}
		n, err := c.r.Read(p)
		if err == io.EOF {
			c.r = nil
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, err
	}
}

func (c *wsConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	// A data frame's header announces a body: hold it for that body's
	// write, so the frame goes as one message.
	if c.mux && c.held == nil && len(p) == muxHeader && p[1] == muxData && binary.BigEndian.Uint32(p[8:]) > 0 {
		c.held = append(make([]byte, 0, muxHeader), p...)
		return len(p), nil
	}
	msg := p
	if c.held != nil {
		w, err := c.ws.NextWriter(websocket.BinaryMessage)
		if err != nil {
			return 0, err
		}
		w.Write(c.held)
		c.held = nil
		if _, err := w.Write(p); err != nil {
			return 0, err
		}
		return len(p), w.Close()
	}
	if err := c.ws.WriteMessage(websocket.BinaryMessage, msg); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *wsConn) Close() error                       { return c.ws.Close() }
func (c *wsConn) LocalAddr() net.Addr                { return c.ws.LocalAddr() }
func (c *wsConn) RemoteAddr() net.Addr               { return c.ws.RemoteAddr() }
func (c *wsConn) SetReadDeadline(t time.Time) error  { return c.ws.SetReadDeadline(t) }
func (c *wsConn) SetWriteDeadline(t time.Time) error { return c.ws.SetWriteDeadline(t) }
func (c *wsConn) SetDeadline(t time.Time) error {
	if err := c.ws.SetReadDeadline(t); err != nil {
		return err
	}
	return c.ws.SetWriteDeadline(t)
}
