// Package api is the xdpq daemon's local API: HTTP/JSON on a Unix socket
// only root may use. It holds both sides of it.
//
// The server side: the daemon implements [Backend]; [NewHandler] serves it
// (routing, strict request decoding, errors mapped to status codes),
// [Listen] makes the socket (refusing anything at the path that is not a
// stale socket) and [Serve] runs the HTTP server until its context ends.
//
// The client side: [Client], which xdpqctl and the CNI plugin use. A
// refusal comes back as a [*StatusError] that wraps the sentinel the
// daemon's backend wrapped ([ErrNotFound], [ErrConflict], ...), so
// errors.Is works across the socket; an answer that is not this API's
// (a daemon of another version) wraps [ErrVersionSkew].
//
// docs/protocol.md lists the requests, answers and status codes.
package api
