package broker_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(podEnv); role != "" {
		os.Exit(podMain(role))
	}
	os.Exit(testnet.MainWithLeakCheck(m))
}

// env is a node: a veth NIC (xa) managed by an agent, a broker serving
// one allocation of its queues 0 and 1, and sockets on the peer (xb) that
// send to those queues and receive what the pod transmits.
type env struct {
	p     *testnet.Pair
	a     *agent.Agent
	srv   *broker.Server
	alloc broker.Allocation
}

func newEnv(t *testing.T, owner broker.Owner, lim broker.Limits) *env {
	t.Helper()
	p := testnet.NewPair(t, 4)
	if err := xdp.MountBPFFS(xdp.DefaultBPFFS); err != nil {
		t.Fatal(err)
	}
	base, err := os.MkdirTemp(xdp.DefaultBPFFS, "xdpq-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	a, err := agent.New(agent.Config{NetNS: p.NSPath(), PinDir: filepath.Join(base, "xdpq"), StateDir: t.TempDir(),
		Linger: 50 * time.Millisecond, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); a.Run(ctx) }()
	if err := a.Manage("xa", agent.Policy{Steering: agent.SteerHardware}); err != nil {
		t.Fatal(err)
	}
	srv := broker.NewServer(broker.Config{StepTimeout: 500 * time.Millisecond, Logger: log}, a)
	// The pod runs as another user: the socket's directory must be open to it.
	dir, err := os.MkdirTemp("", "xdpq-alloc-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	alloc := broker.Allocation{ID: "alloc-1", Netdev: xsk.Netdev{Name: "xa", Ifindex: p.A.Index, NetNS: p.NSPath()},
		Queues: []uint32{0, 1}, Owner: owner, Limits: lim, Dir: dir}
	if err := srv.Add(alloc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Close()
		cancel()
		wg.Wait()
		a.Close()
		os.RemoveAll(dir)
	})
	return &env{p: p, a: a, srv: srv, alloc: alloc}
}

func (e *env) sockets() []uint32 {
	for _, s := range e.a.Status() {
		if s.Netdev == "xa" {
			return s.Sockets
		}
	}
	return nil
}

// waitSockets waits until the agent has exactly n sockets for xa.
func (e *env) waitSockets(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(e.sockets()) != n {
		if time.Now().After(deadline) {
			t.Fatalf("agent has sockets %v, want %d", e.sockets(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// peer is B's side: a socket per queue, sending to A and receiving what A sends.
type peer struct {
	send []*traffic.Sender
	recv []*traffic.Receiver
}

func (e *env) peer(t *testing.T) *peer {
	t.Helper()
	prog, err := xdp.Load(xdp.Direct, xdp.LoadOptions{Queues: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	if _, err := xdp.Attach(e.p.NSPath(), e.p.B.Index, prog.Prog(), xdp.ModeNative); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { xdp.Detach(e.p.NSPath(), e.p.B.Index, xdp.ModeNative, prog.Prog()) })
	dev := xsk.Netdev{Name: "xb", Ifindex: e.p.B.Index, NetNS: e.p.NSPath()}
	umem, socks, err := xsk.Open(dev, []uint32{0, 1}, 4096, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048},
		Rings: xsk.Rings{Fill: 1024, Completion: 1024, RX: 1024, TX: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range socks {
			s.Close()
		}
		umem.Close()
	})
	pr := &peer{}
	for i, s := range socks {
		rx, tx := make([]uint64, 1024), make([]uint64, 1024)
		for j := range 1024 {
			rx[j], tx[j] = umem.FrameAddr(2*i*1024+j), umem.FrameAddr((2*i+1)*1024+j)
		}
		r, err := traffic.NewReceiver(s, rx)
		if err != nil {
			t.Fatal(err)
		}
		pr.recv = append(pr.recv, r)
		pr.send = append(pr.send, traffic.NewSender(s, tx, 0))
		if err := prog.SetSocket(uint32(i), s.FD()); err != nil {
			t.Fatal(err)
		}
	}
	return pr
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
