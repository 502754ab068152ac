// Package node runs an xdpq node in one process on a veth "NIC": the
// agent managing it and the broker serving an allocation of its queues.
// The broker tests, xdpqperf's tests and the demo use it; the daemon
// (cmd/deviceplugin) wires the same packages with real configuration.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// Config says what node to run.
type Config struct {
	Queues  int          // of the veth NIC
	Alloc   []uint32     // queues of the allocation
	Owner   broker.Owner // who may use it
	Limits  wire.Limits
	Policy  agent.Policy
	Linger  time.Duration
	Timeout time.Duration // broker step timeout
	Logger  *slog.Logger
	// OnLease, if set, hears of the allocation's leases (broker.Config).
	OnLease func(alloc string, socks []broker.LeaseSocket)
	// BusyPoll, if set, is the allocation's busy polling.
	BusyPoll *wire.BusyPoll
	// MTU, if set, is the veth pair's (9000 for jumbo frames).
	MTU int
	// PeerQueues are xb's queues StartTB's Peer opens; nil: queue 0.
	PeerQueues []uint32
}

// Node is the running node.
type Node struct {
	Pair   *testnet.Pair
	Agent  *agent.Agent
	Broker *broker.Server
	Alloc  broker.Allocation

	cancel  context.CancelFunc
	closers []func() error
	wg      sync.WaitGroup
	pinBase string
	state   string
}

// Start creates the veth pair, the agent (pins under a fresh directory of
// /sys/fs/bpf) and the broker with one allocation "alloc-1" on xa.
func Start(cfg Config) (n *Node, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Linger == 0 {
		cfg.Linger = 50 * time.Millisecond
	}
	// Not n in the deferred function: `return nil, err` has set it to nil
	// by the time it runs.
	node := &Node{}
	n = node
	defer func() {
		if err != nil {
			err = errors.Join(err, node.Close())
		}
	}()
	if n.Pair, err = testnet.Create(cfg.Queues); err != nil {
		return nil, err
	}
	if cfg.MTU != 0 {
		if err = n.Pair.SetMTU(cfg.MTU); err != nil {
			return nil, err
		}
	}
	if err = xdp.MountBPFFS(xdp.DefaultBPFFS); err != nil {
		return nil, err
	}
	if n.pinBase, err = os.MkdirTemp(xdp.DefaultBPFFS, "xdpq-node-"); err != nil {
		return nil, err
	}
	if n.state, err = os.MkdirTemp("", "xdpq-state-"); err != nil {
		return nil, err
	}
	n.Agent, err = agent.New(agent.Config{NetNS: n.Pair.NSPath(), PinDir: filepath.Join(n.pinBase, "xdpq"),
		StateDir: n.state, Linger: cfg.Linger, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := n.Agent.Run(ctx); err != nil {
			cfg.Logger.Error("agent", "err", err)
		}
	}()
	if err = n.Agent.Manage("xa", cfg.Policy); err != nil {
		return nil, err
	}
	n.Broker = broker.NewServer(broker.Config{StepTimeout: cfg.Timeout, Logger: cfg.Logger, OnLease: cfg.OnLease}, n.Agent)
	// The pod runs as another user: its socket's directory must be open to it.
	dir, err := os.MkdirTemp("", "xdpq-alloc-")
	if err != nil {
		return nil, err
	}
	if err = os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	n.Alloc = broker.Allocation{ID: "alloc-1", Netdev: xsk.Netdev{Name: "xa", Ifindex: n.Pair.A.Index, NetNS: n.Pair.NSPath()},
		Queues: cfg.Alloc, Owner: cfg.Owner, Limits: cfg.Limits, Dir: dir, BusyPoll: cfg.BusyPoll}
	if err = n.Broker.Add(n.Alloc); err != nil {
		return nil, err
	}
	return n, nil
}

// Sockets returns the queues of xa with a socket in the XSKMAP.
func (n *Node) Sockets() []uint32 {
	for _, s := range n.Agent.Status() {
		if s.Netdev == "xa" {
			return s.Sockets
		}
	}
	return nil
}

// WaitSockets waits until xa has count sockets in its XSKMAP.
func (n *Node) WaitSockets(count int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for len(n.Sockets()) != count {
		if time.Now().After(deadline) {
			return fmt.Errorf("xa has sockets on queues %v, want %d sockets", n.Sockets(), count)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// Close stops everything and removes what Start made: the program goes
// with Unmanage, the pins, state and socket directories, the netns.
func (n *Node) Close() error {
	var errs []error
	for _, c := range n.closers {
		errs = append(errs, c())
	}
	if n.Broker != nil {
		n.Broker.Close()
		errs = append(errs, os.RemoveAll(n.Alloc.Dir))
	}
	if n.cancel != nil {
		n.cancel()
		n.wg.Wait()
	}
	if n.Agent != nil {
		if err := n.Agent.Unmanage("xa"); err != nil && n.Pair != nil {
			errs = append(errs, err)
		}
		errs = append(errs, n.Agent.Close())
	}
	if n.pinBase != "" {
		errs = append(errs, os.RemoveAll(n.pinBase))
	}
	if n.state != "" {
		errs = append(errs, os.RemoveAll(n.state))
	}
	if n.Pair != nil {
		errs = append(errs, n.Pair.Close())
	}
	return errors.Join(errs...)
}

// Peer is the far side of the NIC: a socket per queue on xb, sending to
// xa's queue of the same number and receiving what xa's queue transmits;
// multi-buffer sockets, so that frames larger than its 2 KiB UMEM frames
// go and come whole.
type Peer struct {
	Send []*traffic.Sender
	Recv []*traffic.Receiver
}

// Peer opens sockets on xb's queues (xdpq's direct program on xb steers
// frames to them). Close releases them.
func (n *Node) Peer(queues []uint32) (*Peer, error) {
	p, closePeer, err := OpenPeer(n.Pair, queues)
	if err != nil {
		return nil, err
	}
	n.closers = append(n.closers, closePeer)
	return p, nil
}

// OpenPeer opens sockets on queues of pair's xb, with xdpq's direct
// program on xb steering frames to them: the far side of a NIC that a
// daemon of its own (not a Node) serves. closePeer releases them.
func OpenPeer(pair *testnet.Pair, queues []uint32) (_ *Peer, closePeer func() error, err error) {
	prog, err := xdp.Load(xdp.Direct, xdp.LoadOptions{Queues: pair.B.Queues()})
	if err != nil {
		return nil, nil, err
	}
	if _, err := xdp.Attach(pair.NSPath(), pair.B.Index, prog.Prog(), xdp.ModeNative); err != nil {
		_ = prog.Close() // never attached
		return nil, nil, err
	}
	dev := xsk.Netdev{Name: "xb", Ifindex: pair.B.Index, NetNS: pair.NSPath()}
	const per = 1024
	umem, socks, err := xsk.Open(dev, queues, 2*per*len(queues), xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048},
		Rings: xsk.Rings{Fill: per, Completion: per, RX: per, TX: per}, MultiBuffer: true})
	if err != nil {
		return nil, nil, errors.Join(err, xdp.Detach(pair.NSPath(), pair.B.Index, xdp.ModeNative, prog.Prog()), prog.Close())
	}
	closePeer = func() error {
		var errs []error
		for _, s := range socks {
			errs = append(errs, s.Close())
		}
		errs = append(errs, umem.Close(), xdp.Detach(pair.NSPath(), pair.B.Index, xdp.ModeNative, prog.Prog()), prog.Close())
		return errors.Join(errs...)
	}
	p := &Peer{}
	for i, s := range socks {
		rx, tx := make([]uint64, per), make([]uint64, per)
		for j := range per {
			rx[j], tx[j] = umem.FrameAddr(2*i*per+j), umem.FrameAddr((2*i+1)*per+j)
		}
		r, err := traffic.NewReceiver(s, rx)
		if err == nil {
			err = prog.SetSocket(queues[i], s.FD())
		}
		if err != nil {
			return nil, nil, errors.Join(err, closePeer())
		}
		p.Recv = append(p.Recv, r)
		p.Send = append(p.Send, traffic.NewSender(s, tx, 0))
	}
	return p, closePeer, nil
}
