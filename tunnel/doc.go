// Package tunnel carries every byte between an edgebox box and its console.
//
// The box dials out (Client) over TLS 1.3 with mutual certificates and the
// ALPN protocol "edgebox-tunnel/1"; the console (Server) accepts. On top of
// the TLS connection runs one yamux session. Each yamux stream starts with
// a small bounded Header naming its Kind and optional metadata; the
// accepting side answers with a one-byte verdict and hands the stream to the
// net.Listener registered for that kind. Both sides therefore look like the
// standard library:
//
//	l := client.Listen(tunnel.KindRPC)       // on the box
//	grpcServer.Serve(l)
//
//	c, err := server.Open(ctx, boxID, tunnel.KindRPC, nil) // on the console
//
// Liveness: both sides ping, and judge the link by what it delivers. A
// ping answered after Config.PingTimeout is late, counted and logged, and
// ends nothing: a console slowed by a storm of reconnecting boxes must not
// send them all back to dial again. A session is dead when nothing at all
// (stream data, window update, ping, late answer) has arrived for
// Config.DeadAfter while a ping is unanswered, so a half-open link is
// noticed within DeadAfter of its last byte (25 s by default).
// The box side redials forever with TLS session resumption, through an
// HTTP CONNECT proxy when its settings or the environment name one. Failed
// dials back off exponentially with full jitter (1 s to 60 s); after the
// console said goodbye (Server.Close tells every box) or a healthy session
// broke, the box comes back within a few seconds, jittered (see redial).
//
// Streams are *Conn: a net.Conn with the stream's Header, its peer and
// session, a half-close (CloseWrite), Abort, and ReleaseReadBuffer for
// streams that sit idle. yamux stays inside this package; no other package
// imports it (deps_test.go checks), so the multiplexer can change here alone.
//
// This package imports neither the agent nor the console.
package tunnel
