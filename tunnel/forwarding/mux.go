package forwarding

import (
	"io"
	"log"
	"net"

	"github.com/hashicorp/yamux"
)

// MaxConns bounds the connections one port forward carries at once.
const MaxConns = 16

// Mux is the multiplexer both ends of a port forward run on its
// WebSocket, a stream per TCP connection. Keepalives are the WebSocket's
// business, and the console's idle limit's.
func Mux() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = false
	c.MaxStreamWindowSize = 4 << 20
	c.AcceptBacklog = MaxConns
	c.LogOutput = nil
	c.Logger = log.New(io.Discard, "", 0)
	return c
}

// Client is the operator's end of a port forward's multiplexer (the
// CLI's), Server the console's.
func Client(conn net.Conn) (*yamux.Session, error) { return yamux.Client(conn, Mux()) }

// Server is the console's end of a port forward's multiplexer.
func Server(conn net.Conn) (*yamux.Session, error) { return yamux.Server(conn, Mux()) }
