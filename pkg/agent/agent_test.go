package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

func TestMain(m *testing.M) {
	if os.Getenv(daemonEnv) != "" {
		os.Exit(daemonMain())
	}
	os.Exit(testnet.MainWithLeakCheck(m))
}

const operatorObj = "testdata/operator.o"

// pinDir returns a fresh directory on bpffs for a test's pins.
func pinDir(t testing.TB) string {
	t.Helper()
	if err := xdp.MountBPFFS(xdp.DefaultBPFFS); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(xdp.DefaultBPFFS, "xdpq-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "xdpq")
}

// testAgent is an agent a test runs, with its change notifications.
type testAgent struct {
	*agent.Agent
	changed chan struct{}
}

// start runs an agent for the pair's namespace until the test ends.
func start(t testing.TB, p *testnet.Pair, linger time.Duration) *testAgent {
	t.Helper()
	return startWith(t, agent.Config{NetNS: p.NSPath(), PinDir: pinDir(t), Linger: linger, StateDir: t.TempDir()})
}

// startWith runs an agent with cfg (a resync period of an hour unless set)
// until the test ends.
func startWith(t testing.TB, cfg agent.Config) *testAgent {
	t.Helper()
	a := &testAgent{changed: make(chan struct{}, 1)}
	cfg.OnChange = func() {
		select {
		case a.changed <- struct{}{}:
		default: // one pending notification is enough: waitFor reads the report anew
		}
	}
	if cfg.Resync == 0 {
		cfg.Resync = time.Hour
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	var err error
	if a.Agent, err = agent.New(cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := a.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		a.Close()
	})
	return a
}

// waitFor waits until cond holds for the agent's report, reading it again
// on each of the agent's change notifications.
func (a *testAgent) waitFor(t testing.TB, what string, cond func([]agent.Status) bool) []agent.Status {
	t.Helper()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for {
		all := a.Status()
		if cond(all) {
			return all
		}
		select {
		case <-a.changed:
		case <-deadline.C:
			t.Fatalf("%s: still %+v", what, all)
		}
	}
}

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Now()} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type reporter interface{ Status() []agent.Status }

func status(a reporter, netdev string) agent.Status {
	for _, s := range a.Status() {
		if s.Netdev == netdev {
			return s
		}
	}
	return agent.Status{}
}

// waitState waits until the agent reports the netdev in state.
func waitState(t testing.TB, a *testAgent, netdev string, state agent.State) agent.Status {
	t.Helper()
	all := a.waitFor(t, netdev+" "+string(state), func(all []agent.Status) bool {
		return slices.ContainsFunc(all, func(s agent.Status) bool { return s.Netdev == netdev && s.State == state })
	})
	return status(agentReport(all), netdev)
}

// agentReport is a report already read.
type agentReport []agent.Status

func (r agentReport) Status() []agent.Status { return r }

// ip runs ip(8) in the pair's namespace, as an operator would.
func ip(t testing.TB, p *testnet.Pair, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"-n", filepath.Base(p.NSPath())}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// openXSK opens a socket on queue of l with a UMEM of n frames, closed
// when the test ends, and returns it with the frames' addresses.
func openXSK(t testing.TB, p *testnet.Pair, l testnet.Link, queue uint32, n int, rings xsk.Rings) (*xsk.Socket, []uint64) {
	t.Helper()
	dev := xsk.Netdev{Name: l.Name, Ifindex: l.Index, NetNS: p.NSPath()}
	umem, socks, err := xsk.Open(dev, []uint32{queue}, n, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: rings})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { socks[0].Close(); umem.Close() })
	addrs := make([]uint64, n)
	for i := range addrs {
		addrs[i] = umem.FrameAddr(i)
	}
	return socks[0], addrs
}

// socket opens a receiving socket on the queue of A.
func socket(t testing.TB, p *testnet.Pair, queue uint32) (*xsk.Socket, *traffic.Receiver) {
	t.Helper()
	s, addrs := openXSK(t, p, p.A, queue, 256, xsk.Rings{Fill: 256, Completion: 64, RX: 256})
	r, err := traffic.NewReceiver(s, addrs)
	if err != nil {
		t.Fatal(err)
	}
	return s, r
}

// peer sends from one of B's queues.
type peer struct {
	t     testing.TB
	p     *testnet.Pair
	queue uint32
	s     *traffic.Sender
	seq   uint64
}

func sender(t testing.TB, p *testnet.Pair, queue uint32) *peer {
	t.Helper()
	s, addrs := openXSK(t, p, p.B, queue, 256, xsk.Rings{Fill: 64, Completion: 256, TX: 256})
	return &peer{t: t, p: p, queue: queue, s: traffic.NewSender(s, addrs, 0)}
}

// Raw sends frames.
func (x *peer) Raw(frames [][]byte) {
	x.t.Helper()
	if err := x.s.Send(frames, time.Now().Add(5*time.Second)); err != nil {
		x.t.Fatal(err)
	}
}

// UDP sends n numbered UDP frames to A's port 5000 and returns them.
func (x *peer) UDP(n int) [][]byte {
	x.t.Helper()
	frames := make([][]byte, n)
	for i := range frames {
		f, err := frame.Spec{SrcMAC: x.p.B.MAC, DstMAC: x.p.A.MAC, Src: x.p.B.Addr, Dst: x.p.A.Addr, Protocol: 17,
			SrcPort: 1, DstPort: 5000, Payload: frame.Payload(x.queue, x.seq, 32)}.Build()
		if err != nil {
			x.t.Fatal(err)
		}
		frames[i] = f
		x.seq++
	}
	x.Raw(frames)
	return frames
}

// TestStatusByName: Status lists the managed netdevs in the order of their
// names, whatever the order of Set (and of the agent's map), each entry
// its own netdev's.
func TestStatusByName(t *testing.T) {
	p := testnet.NewPair(t, 4)
	a := start(t, p, time.Hour)
	for _, name := range []string{p.B.Name, p.A.Name} { // xb, then xa
		if err := a.Set(name, agent.Policy{Steering: agent.SteerHardware}); err != nil {
			t.Fatal(err)
		}
	}
	for range 20 { // two entries of a map: either order half the time
		all := a.Status()
		var got []string
		for _, s := range all {
			got = append(got, fmt.Sprintf("%s#%d", s.Netdev, s.Ifindex))
		}
		if want := []string{fmt.Sprintf("%s#%d", p.A.Name, p.A.Index), fmt.Sprintf("%s#%d", p.B.Name, p.B.Index)}; !slices.Equal(got, want) {
			t.Fatalf("status lists %v, want %v", got, want)
		}
	}
}

// TestProgramFollowsSockets: no socket, no program; the first socket
// brings the program; after the last one goes, it stays for the linger
// period, then goes.
func TestProgramFollowsSockets(t *testing.T) {
	p := testnet.NewPair(t, 4)
	a := start(t, p, 300*time.Millisecond)
	if err := a.Set(p.A.Name, agent.Policy{Steering: agent.SteerHardware}); err != nil {
		t.Fatal(err)
	}
	if s := status(a, p.A.Name); s.State != agent.StateNone {
		t.Fatalf("managed without sockets: %+v", s)
	}
	if att, _ := xdp.Query(p.NSPath(), p.A.Index); att != nil {
		t.Fatalf("program attached without sockets: %+v", att)
	}
	s1, r1 := socket(t, p, 1)
	if err := a.AddSocket(p.A.Name, 1, s1.FD()); err != nil {
		t.Fatal(err)
	}
	st := status(a, p.A.Name)
	if st.State != agent.StateDirect || st.Mode != xdp.ModeNative || len(st.Sockets) != 1 {
		t.Fatalf("after the first socket: %+v", st)
	}
	send := sender(t, p, 1)
	if err := r1.Expect(send.UDP(100), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := a.AddSocket(p.A.Name, 9, s1.FD()); err == nil || !strings.HasPrefix(err.Error(), "add socket to "+p.A.Name+"/q9: the netdev has ") {
		t.Errorf("socket on a queue the netdev lacks: %v", err)
	}
	removed := time.Now()
	if err := a.RemoveSocket(p.A.Name, 1, 0); err != nil {
		t.Fatal(err)
	}
	if s := status(a, p.A.Name); s.State != agent.StateDirect {
		t.Fatalf("program gone before the linger period: %+v", s)
	}
	waitState(t, a, p.A.Name, agent.StateNone)
	if d := time.Since(removed); d < 300*time.Millisecond {
		t.Errorf("detached after %v, before the 300ms linger", d)
	}
	if att, _ := xdp.Query(p.NSPath(), p.A.Index); att != nil {
		t.Fatalf("program still attached: %+v", att)
	}
}

// TestForeignProgramPrecedence50: an operator's program, attached with
// ip(8) over xdpq's and removed again 50 times: each time the agent steps
// aside, and each time it comes back; the socket receives afterwards.
func TestForeignProgramPrecedence50(t *testing.T) {
	p := testnet.NewPair(t, 4)
	a := start(t, p, time.Second)
	if err := a.Set(p.A.Name, agent.Policy{Steering: agent.SteerHardware}); err != nil {
		t.Fatal(err)
	}
	s0, r0 := socket(t, p, 0)
	if err := a.AddSocket(p.A.Name, 0, s0.FD()); err != nil {
		t.Fatal(err)
	}
	ours := waitState(t, a, p.A.Name, agent.StateDirect).Program
	send := sender(t, p, 0)
	for i := range 50 {
		ip(t, p, "-force", "link", "set", "dev", p.A.Name, "xdpdrv", "obj", operatorObj, "sec", "xdp")
		st := waitState(t, a, p.A.Name, agent.StateOverridden)
		if st.Foreign != "operator_pass" {
			t.Fatalf("round %d: overridden by %q", i, st.Foreign)
		}
		if att, _ := xdp.Query(p.NSPath(), p.A.Index); att == nil || att.Name != "operator_pass" {
			t.Fatalf("round %d: the agent touched the operator's program: %+v", i, att)
		}
		ip(t, p, "link", "set", "dev", p.A.Name, "xdpdrv", "off")
		st = waitState(t, a, p.A.Name, agent.StateDirect)
		if st.Program != ours {
			t.Fatalf("round %d: came back with program %d, want %d", i, st.Program, ours)
		}
	}
	if err := r0.Expect(send.UDP(100), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	// Each come-back is a re-attach in the metrics, timed.
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a.CollectorAs(func(n string) string { return "node-" + n }))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "xdpq_agent_reattach_duration_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		if got := mf.GetMetric()[0].GetLabel()[0].GetValue(); got != "node-"+p.A.Name {
			t.Errorf("re-attaches reported for netdev %q", got)
		}
		if h.GetSampleCount() != 50 || h.GetSampleSum() <= 0 || h.GetSampleSum() > 50*2.5 {
			t.Errorf("re-attaches: %d taking %gs in all, want 50", h.GetSampleCount(), h.GetSampleSum())
		}
		return
	}
	t.Error("no re-attach histogram")
}

// TestXDPLoaderHasPrecedence: a program loaded with xdp-loader while xdpq
// has none keeps the hook when sockets come, and xdpq attaches only once
// it is unloaded. The XSKMAP stays pinned for the operator meanwhile.
func TestXDPLoaderHasPrecedence(t *testing.T) {
	p := testnet.NewPair(t, 4)
	a := start(t, p, time.Second)
	if err := a.Set(p.A.Name, agent.Policy{Steering: agent.SteerHardware}); err != nil {
		t.Fatal(err)
	}
	loader := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"netns", "exec", filepath.Base(p.NSPath()), "xdp-loader"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("xdp-loader %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	loader("load", "-m", "native", p.A.Name, operatorObj)
	waitState(t, a, p.A.Name, agent.StateOverridden)
	s0, r0 := socket(t, p, 0)
	if err := a.AddSocket(p.A.Name, 0, s0.FD()); err != nil {
		t.Fatal(err)
	}
	st := status(a, p.A.Name)
	if st.State != agent.StateOverridden || !strings.Contains(st.Reason, "xsks pinned at") {
		t.Fatalf("a socket came: %+v", st)
	}
	if _, err := os.Stat(strings.TrimSpace(st.Reason[strings.LastIndex(st.Reason, " ")+1:])); err != nil {
		t.Errorf("the XSKMAP is not pinned where the report says: %v", err)
	}
	loader("unload", p.A.Name, "--all")
	waitState(t, a, p.A.Name, agent.StateDirect)
	send := sender(t, p, 0)
	if err := r0.Expect(send.UDP(50), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestExclusive: with a pinned bpf_link the kernel refuses the operator's
// program, even forced.
func TestExclusive(t *testing.T) {
	p := testnet.NewPair(t, 4)
	a := start(t, p, time.Second)
	if err := a.Set(p.A.Name, agent.Policy{Steering: agent.SteerHardware, Exclusive: true}); err != nil {
		t.Fatal(err)
	}
	s0, _ := socket(t, p, 0)
	if err := a.AddSocket(p.A.Name, 0, s0.FD()); err != nil {
		t.Fatal(err)
	}
	waitState(t, a, p.A.Name, agent.StateDirect)
	out, err := exec.Command("ip", "-n", filepath.Base(p.NSPath()), "-force", "link", "set", "dev", p.A.Name,
		"xdpdrv", "obj", operatorObj, "sec", "xdp").CombinedOutput()
	if err == nil {
		t.Fatalf("the kernel took a foreign program over the exclusive link:\n%s", out)
	}
	if att, _ := xdp.Query(p.NSPath(), p.A.Index); att == nil || !att.Ours {
		t.Fatalf("after the refused attach: %+v", att)
	}
	if err := a.Unmanage(p.A.Name); err != nil {
		t.Fatal(err)
	}
	if att, _ := xdp.Query(p.NSPath(), p.A.Index); att != nil {
		t.Fatalf("unmanaged, the link's program stays: %+v", att)
	}
}

// TestFilterPolicy: a software-steered netdev gets the filter program.
func TestFilterPolicy(t *testing.T) {
	p := testnet.NewPair(t, 4)
	a := start(t, p, time.Second)
	if err := a.Set(p.A.Name, agent.Policy{Steering: agent.SteerSoftware, Mode: xdp.ModeGeneric}); err != nil {
		t.Fatal(err)
	}
	s0, r0 := socket(t, p, 0)
	flow := agent.Flow{Protocol: xdp.UDP, Dst: netip.PrefixFrom(p.A.Addr, 32), DstPort: 5000, Queues: []uint32{0}}
	if err := a.Steer(p.A.Name, "pod-a", []agent.Flow{flow}); err != nil {
		t.Fatal(err)
	}
	if err := a.AddSocket(p.A.Name, 0, s0.FD()); err != nil {
		t.Fatal(err)
	}
	st := waitState(t, a, p.A.Name, agent.StateFilter)
	if st.Mode != xdp.ModeGeneric {
		t.Errorf("mode %v, want generic", st.Mode)
	}
	send := sender(t, p, 0)
	if err := r0.Expect(send.UDP(20), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// expectNothing checks that r has no frame queued.
func expectNothing(t testing.TB, r *traffic.Receiver) {
	t.Helper()
	if n, _ := r.Receive(-1, time.Now(), func([]byte) error { return nil }); n != 0 {
		t.Errorf("%d unexpected frames on the socket", n)
	}
}

// TestPinDirMustBeBPFFS: a pin dir outside a bpffs is refused, and nothing
// is mounted over its parent.
func TestPinDirMustBeBPFFS(t *testing.T) {
	testnet.RequireRoot(t)
	dir := t.TempDir()
	keep := filepath.Join(dir, "keep")
	os.WriteFile(keep, []byte("x"), 0o644)
	_, err := agent.New(agent.Config{PinDir: filepath.Join(dir, "xdpq"), StateDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "is not on a bpffs") {
		t.Fatalf("pin dir on tmpfs: %v", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("the pin dir's parent was covered: %v", err)
	}
}

// TestRemoveSocketOfPreviousHolder: a queue's previous socket closed, its
// next holder's socket bound and added, and only then the end of the
// previous one told (the broker ends a lease after its connection
// closed, and the queue may be given and bound again meanwhile): the new
// socket stays in the XSKMAP and receives. Removing by the queue alone
// took the new socket out, and the pod received nothing (make bench's pod
// rows lost a run so, one in five).
func TestRemoveSocketOfPreviousHolder(t *testing.T) {
	p := testnet.NewPair(t, 4)
	a := start(t, p, time.Minute)
	if err := a.Set(p.A.Name, agent.Policy{Steering: agent.SteerHardware}); err != nil {
		t.Fatal(err)
	}
	inode := func(s *xsk.Socket) uint64 {
		var st unix.Stat_t
		if err := unix.Fstat(s.FD(), &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	old, _ := socket(t, p, 1)
	if err := a.AddSocket(p.A.Name, 1, old.FD()); err != nil {
		t.Fatal(err)
	}
	oldInode := inode(old)
	old.Close()
	next, r := socket(t, p, 1) // the bind waits out the queue's busy time after the close
	if err := a.AddSocket(p.A.Name, 1, next.FD()); err != nil {
		t.Fatal(err)
	}
	if err := a.RemoveSocket(p.A.Name, 1, oldInode); err != nil {
		t.Fatal(err)
	}
	if st := status(a, p.A.Name); !slices.Equal(st.Sockets, []uint32{1}) {
		t.Fatalf("after the previous socket's end: sockets %v, want [1]", st.Sockets)
	}
	send := sender(t, p, 1)
	if err := r.Expect(send.UDP(100), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := a.RemoveSocket(p.A.Name, 1, inode(next)); err != nil {
		t.Fatal(err)
	}
	if st := status(a, p.A.Name); len(st.Sockets) != 0 {
		t.Fatalf("after the socket's own end: sockets %v", st.Sockets)
	}
}

// TestListening: once Listening is closed, Run follows the link
// notifications of the netdevs' namespace (its socket is open), and a
// foreign program that comes then is seen without the resync (an hour
// here).
func TestListening(t *testing.T) {
	p := testnet.NewPair(t, 2)
	a := start(t, p, 0)
	if err := a.Set(p.A.Name, agent.Policy{Steering: agent.SteerHardware, AttachAlways: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Listening():
	case <-time.After(10 * time.Second): // a bound on a hang, not synchronisation
		t.Fatal("Run does not listen")
	}
	if l, err := p.LinkListeners(); err != nil || len(l) != 1 {
		t.Fatalf("listening with sockets %v (%v), want Run's one", l, err)
	}
	waitState(t, a, p.A.Name, agent.StateDirect)
	ip(t, p, "-force", "link", "set", "dev", p.A.Name, "xdpdrv", "obj", operatorObj, "sec", "xdp")
	waitState(t, a, p.A.Name, agent.StateOverridden)
}
