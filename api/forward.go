package api

import (
	"io"
	"log"
	"net"

	"github.com/hashicorp/yamux"
)

// MaxForwardConns bounds the connections one port forward carries at
// once.
const MaxForwardConns = 64

// ForwardMux is the multiplexer both ends of a port forward run on its
// WebSocket, a stream per TCP connection. Keepalives are the WebSocket's
// business, and the console's idle limit's.
func ForwardMux() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = false
	c.MaxStreamWindowSize = 4 << 20
	c.AcceptBacklog = MaxForwardConns
	c.LogOutput = nil
	c.Logger = log.New(io.Discard, "", 0)
	return c
}

// ForwardClient is the operator's end of a forward opened with
// OpenForward.
func ForwardClient(conn net.Conn) (*yamux.Session, error) { return yamux.Client(conn, ForwardMux()) }
