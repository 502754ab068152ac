package broker_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testing/node"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(podEnv); role != "" {
		os.Exit(podMain(role))
	}
	os.Exit(testnet.MainWithLeakCheck(m))
}

// env is a node whose daemon can restart: a veth NIC (xa) managed by an
// agent, a broker serving allocation alloc-1 of its queues 0 and 1 (and
// alloc-2 of queues 2 and 3 if asked). Stopping the daemon closes the
// broker and the agent and leaves the kernel as it is (program attached,
// maps pinned, sockets in the XSKMAP); starting it again adopts that, as
// a restarted daemon does.
type env struct {
	cfg    envConfig
	p      *testnet.Pair
	far    *node.Node // the far side's sockets (Peer); closing it removes the pair
	agentC agent.Config
	a      *agent.Agent
	stopA  func()
	srv    *broker.Server
	alloc  broker.Allocation   // alloc-1
	allocs []broker.Allocation // alloc-1 (and alloc-2)
	leases *record[leaseEvent] // every OnLease call, of every server
	logs   *record[string]     // every message the servers logged
}

type envConfig struct {
	owner         broker.Owner
	owner2        *broker.Owner // alloc-2's, if not owner
	limits        wire.Limits
	busyPoll      *wire.BusyPoll
	mode          xsk.Mode
	twoAllocs     bool
	stepTimeout   time.Duration // default 500ms
	maxHandshakes int
	maxConns      int
	links         []string // names in each allocation's directory
	claimPod      func(ctx context.Context, alloc string, pod broker.PodIdentity) error
}

type leaseEvent struct {
	alloc string
	socks []broker.LeaseSocket // nil: ended
}

func newEnv(t *testing.T, owner broker.Owner, lim wire.Limits) *env {
	return newEnvWith(t, envConfig{owner: owner, limits: lim})
}

func newEnvWith(t *testing.T, cfg envConfig) *env {
	t.Helper()
	testnet.RequireRoot(t)
	if cfg.stepTimeout == 0 {
		cfg.stepTimeout = 500 * time.Millisecond
	}
	e := &env{cfg: cfg, leases: &record[leaseEvent]{}, logs: &record[string]{}}
	var err error
	if e.p, err = testnet.Create(4); err != nil {
		t.Fatal(err)
	}
	e.far = &node.Node{Pair: e.p}
	t.Cleanup(func() { e.far.Close() })
	if err := xdp.MountBPFFS(xdp.DefaultBPFFS); err != nil {
		t.Fatal(err)
	}
	pins, err := os.MkdirTemp(xdp.DefaultBPFFS, "xdpq-broker-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pins) })
	log := slog.New(&logTap{Handler: slog.NewTextHandler(t.Output(), nil), rec: e.logs})
	e.agentC = agent.Config{NetNS: e.p.NSPath(), PinDir: filepath.Join(pins, "xdpq"), StateDir: t.TempDir(),
		Linger: 50 * time.Millisecond, Logger: log}
	for i, id := range []string{"alloc-1", "alloc-2"} {
		if i == 1 && !cfg.twoAllocs {
			break
		}
		// The pod runs as another user: its socket's directory must be open to it.
		dir, err := os.MkdirTemp("", "xdpq-alloc-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		owner := cfg.owner
		if i == 1 && cfg.owner2 != nil {
			owner = *cfg.owner2
		}
		e.allocs = append(e.allocs, broker.Allocation{ID: id, Netdev: xsk.Netdev{Name: "xa", Ifindex: e.p.A.Index, NetNS: e.p.NSPath()},
			Queues: []uint32{uint32(2 * i), uint32(2*i + 1)}, Owner: owner, Limits: cfg.limits, BusyPoll: cfg.busyPoll, Mode: cfg.mode, Dir: dir, Links: inDir(dir, cfg.links)})
	}
	e.alloc = e.allocs[0]
	e.startDaemon(t, nil)
	t.Cleanup(func() {
		if e.srv != nil {
			e.stopDaemon(t, true)
		}
	})
	return e
}

// startDaemon starts the agent and the broker, with the leases a previous
// daemon recorded.
func (e *env) startDaemon(t *testing.T, resumable map[string][]broker.LeaseSocket) {
	t.Helper()
	a, err := agent.New(e.agentC)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := a.Run(ctx); err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	e.a = a
	e.stopA = func() {
		cancel()
		wg.Wait()
	}
	if err := a.Manage("xa", agent.Policy{Steering: agent.SteerHardware}); err != nil {
		t.Fatal(err)
	}
	e.srv = broker.NewServer(broker.Config{StepTimeout: e.cfg.stepTimeout, MaxHandshakes: e.cfg.maxHandshakes, MaxConnections: e.cfg.maxConns,
		ClaimPod: e.cfg.claimPod, Logger: e.agentC.Logger, OnLease: func(alloc string, socks []broker.LeaseSocket) {
			e.leases.add(leaseEvent{alloc, socks})
		}}, a)
	for _, al := range e.allocs {
		al.Resumable = resumable[al.ID]
		if err := e.srv.Add(al); err != nil {
			t.Fatal(err)
		}
	}
}

// stopDaemon closes the broker and the agent; unmanage also takes the
// netdev out of management (the program goes, the pins too), as at the
// end of a test.
func (e *env) stopDaemon(t *testing.T, unmanage bool) {
	t.Helper()
	e.srv.Close()
	e.srv = nil
	e.stopA()
	if unmanage {
		if err := e.a.Unmanage("xa"); err != nil {
			t.Error(err)
		}
	}
	if err := e.a.Close(); err != nil {
		t.Error(err)
	}
}

// sockets returns the queues of xa with a socket in the agent's XSKMAP.
func (e *env) sockets() []uint32 {
	for _, s := range e.a.Status() {
		if s.Netdev == "xa" {
			return s.Sockets
		}
	}
	return nil
}

// lastLease returns what OnLease said last of the allocation, and whether
// it said anything.
func lastLease(evs []leaseEvent, alloc string) ([]broker.LeaseSocket, bool) {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].alloc == alloc {
			return evs[i].socks, true
		}
	}
	return nil, false
}

// waitActive waits until the server reported the allocation's lease
// active, and returns its sockets.
func (e *env) waitActive(t *testing.T, alloc string) []broker.LeaseSocket {
	t.Helper()
	var socks []broker.LeaseSocket
	e.leases.wait(t, "lease of "+alloc+" active", func(evs []leaseEvent) bool {
		socks, _ = lastLease(evs, alloc)
		return socks != nil
	})
	return socks
}

// waitEnded waits until the server reported the allocation's lease ended
// (its sockets out of the XSKMAP, its connection closed).
func (e *env) waitEnded(t *testing.T, alloc string) {
	t.Helper()
	e.leases.wait(t, "lease of "+alloc+" ended", func(evs []leaseEvent) bool {
		socks, ok := lastLease(evs, alloc)
		return ok && socks == nil
	})
}

func (e *env) peer(t *testing.T) *node.Peer {
	t.Helper()
	p, err := e.far.Peer([]uint32{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// record collects what something reports, for tests to wait on.
type record[T any] struct {
	mu   sync.Mutex
	all  []T
	wake chan struct{} // closed and replaced on every add
}

func (r *record[T]) add(v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, v)
	if r.wake != nil {
		close(r.wake)
		r.wake = nil
	}
}

func (r *record[T]) snapshot() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.all)
}

// wait waits up to 10s for cond to hold of everything recorded.
func (r *record[T]) wait(t *testing.T, what string, cond func([]T) bool) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ok := cond(r.all)
		if r.wake == nil {
			r.wake = make(chan struct{})
		}
		wake := r.wake
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-wake:
		case <-deadline.C:
			t.Fatalf("waiting for %s: not within 10s", what)
		}
	}
}

// logTap records the message of every log record.
type logTap struct {
	slog.Handler
	rec *record[string]
}

func (h *logTap) Handle(ctx context.Context, r slog.Record) error {
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			msg += ": " + a.Value.String()
		}
		return true
	})
	h.rec.add(msg)
	return h.Handler.Handle(ctx, r)
}

func (h *logTap) WithAttrs(as []slog.Attr) slog.Handler {
	return &logTap{Handler: h.Handler.WithAttrs(as), rec: h.rec}
}

func (h *logTap) WithGroup(name string) slog.Handler {
	return &logTap{Handler: h.Handler.WithGroup(name), rec: h.rec}
}

// countLogs counts the recorded messages that start with prefix.
func countLogs(msgs []string, prefix string) int {
	n := 0
	for _, m := range msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
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
	return dialPath(t, e.alloc.SocketPath())
}

func dialPath(t *testing.T, path string) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

func refusedWith(err error, code string) bool {
	var pe *wire.ProtocolError
	return errors.As(err, &pe) && pe.Code == code
}

// inDir gives the paths of names in dir.
func inDir(dir string, names []string) []string {
	var out []string
	for _, n := range names {
		out = append(out, filepath.Join(dir, n))
	}
	return out
}
