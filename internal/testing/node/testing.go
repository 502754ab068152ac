package node

import (
	"io"
	"log/slog"
	"testing"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/wire"
)

// StartTB starts a node for a test that needs root, with a peer's
// sockets on xb's queue 0; both go when the test ends. Unset, the
// allocation is xa's queue 0 for root, with limits that allow TX, the
// policy steers by hardware (xdpq's direct program), and the log is
// discarded.
func StartTB(tb testing.TB, cfg Config) (*Node, *Peer) {
	tb.Helper()
	testnet.RequireRoot(tb)
	if cfg.Queues == 0 {
		cfg.Queues = 1
	}
	if cfg.Alloc == nil {
		cfg.Alloc = []uint32{0}
	}
	if cfg.Owner == (broker.Owner{}) {
		root := uint32(0)
		cfg.Owner = broker.Owner{UID: &root}
	}
	if cfg.Limits == (wire.Limits{}) {
		cfg.Limits = wire.Limits{MaxUMEM: 64 << 20, MaxRing: 4096, AllowTX: true, MaxQueue: 4}
	}
	if cfg.Policy.Steering == "" {
		cfg.Policy.Steering = agent.SteerHardware
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	n, err := Start(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := n.Close(); err != nil {
			tb.Error(err)
		}
	})
	if cfg.PeerQueues == nil {
		cfg.PeerQueues = []uint32{0}
	}
	p, err := n.Peer(cfg.PeerQueues)
	if err != nil {
		tb.Fatal(err)
	}
	return n, p
}
