package broker_test

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/node"
	"github.com/xdpq/xdpq/internal/testnet"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/broker"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(podEnv); role != "" {
		os.Exit(podMain(role))
	}
	os.Exit(testnet.MainWithLeakCheck(m))
}

// env is a node: a veth NIC (xa) managed by an agent, a broker serving
// one allocation of its queues 0 and 1.
type env struct {
	*node.Node
	p     *testnet.Pair
	a     *agent.Agent
	srv   *broker.Server
	alloc broker.Allocation
}

func newEnv(t *testing.T, owner broker.Owner, lim broker.Limits) *env {
	t.Helper()
	testnet.RequireRoot(t)
	n, err := node.Start(node.Config{Queues: 4, Alloc: []uint32{0, 1}, Owner: owner, Limits: lim,
		Policy: agent.Policy{Steering: agent.SteerHardware}, Timeout: 500 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Error(err)
		}
	})
	return &env{Node: n, p: n.Pair, a: n.Agent, srv: n.Broker, alloc: n.Alloc}
}

func (e *env) sockets() []uint32 { return e.Sockets() }

// waitSockets waits until the agent has exactly n sockets for xa.
func (e *env) waitSockets(t *testing.T, n int) {
	t.Helper()
	if err := e.WaitSockets(n, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

func (e *env) peer(t *testing.T) *node.Peer {
	t.Helper()
	p, err := e.Peer([]uint32{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// frames builds n numbered UDP frames of stream id from src to dst.
func frames(src, dst testnet.Link, id uint32, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		f, err := frame.Spec{SrcMAC: src.MAC, DstMAC: dst.MAC, Src: src.Addr, Dst: dst.Addr, Protocol: 17,
			SrcPort: 9, DstPort: uint16(7000 + id), Payload: frame.Payload(id, uint64(i), 100)}.Build()
		if err != nil {
			panic(err)
		}
		out[i] = f
	}
	return out
}

func uid(u uint32) *uint32 { return &u }

// rootOwned lets the test process (root) use the allocation, for the
// in-process clients.
var rootOwned = broker.Owner{UID: uid(0)}

// dial connects to the allocation's socket as a raw client.
func dial(t *testing.T, e *env) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: e.alloc.SocketPath(), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

func refusedWith(err error, code string) bool {
	var pe *broker.ProtocolError
	return errors.As(err, &pe) && pe.Code == code
}
