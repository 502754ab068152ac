// Package nodestatus publishes what xdpq's daemon knows of its node to the
// Kubernetes API server: the node's XdpqNode (created owned by its Node,
// so that it goes with it) and its status, written with server-side apply
// on the status subresource, and Events (events.k8s.io/v1) on it and on
// the pods involved.
//
// Writes are coalesced, so that thousands of nodes cost the API server
// little: a change of a netdev's state, of a condition or of the config is
// written within about a second (Config.Settle); a change of allocations
// alone (pod churn) at most once per Config.MinInterval (10 s); nothing is
// written when nothing changed. The daemon never waits for the API server:
// it signals Writer.Changed, and the writer's own goroutine takes a
// snapshot of the daemon's status, compares and writes, retrying with
// backoff while the API server is away.
package nodestatus
