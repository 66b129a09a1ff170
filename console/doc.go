// Package console is the console's composition root: Config says how it
// runs, New opens what it keeps and builds every part onto it, and Run
// runs the parts that serve or loop under one errgroup, stops them in a
// stated order and returns the first failure. It holds no logic of its
// own; each part is a package:
//
//   - port: the one public TLS port; admission under floods, then the
//     tunnel or the HTTP API by ALPN;
//   - httpapi: the operators' HTTP API, enrollment and downloads;
//   - boxsync: the boxes' Sync streams, woken by one watch of the desired
//     state;
//   - presence: which boxes are online and when each was last seen;
//   - agentrpc: the ConsoleService boxes call, and calls to their agents;
//   - boxregistry: the registry served to boxes under the pull policy;
//   - appsync: the periodic check of every box against the app pins;
//   - fleet, auth, audit: boxes and enrollment tokens, API tokens, the
//     audit log;
//   - desired, apps, keys: boxes' desired state, the app catalogue, USB
//     keys;
//   - store: the key-value store everything above keeps its state in, and
//     its compaction; db, pki, dist: the database file, the CA, the agent
//     downloads.
//
// One port serves everything. The TLS ClientHello decides: ALPN
// "edgebox-tunnel/1" gets a handshake that requires a box certificate
// signed by the console CA (and waits on an accept rate limit, so a
// reconnect storm of boxes cannot starve operators); "h2" and "http/1.1"
// get the API without a client certificate.
package console
