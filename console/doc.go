// Package console is the centre of edgebox: it wires the PKI, the fleet
// records, the audit log, the HTTP API and the tunnel server onto one
// public TLS port, and runs them until its context ends.
//
// One port serves everything. The TLS ClientHello decides: ALPN
// "edgebox-tunnel/1" gets a handshake that requires a box certificate
// signed by the console CA (and waits on an accept rate limit, so a
// reconnect storm of boxes cannot starve operators); "h2" and "http/1.1"
// get the API without a client certificate.
package console
