package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// The crash test runs the agent in a separate "daemon" process (this test
// binary again) so that it can be killed with SIGKILL. The daemon manages
// the netdevs named in its environment and takes commands on fd 3:
// "add <netdev> <queue>" with a socket fd attached, "status", and
// "wait <netdev> <state>", answered with the netdev's status once it is
// in that state (waiting on the agent's change notifications) or after
// five seconds.
const daemonEnv = "XDPQ_AGENT_TEST_DAEMON"

func daemonMain() int {
	cfg := strings.Split(os.Getenv(daemonEnv), ";") // netns;pindir;statedir;netdev,netdev
	f := os.NewFile(3, "ctl")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	conn := c.(*net.UnixConn)
	changed := make(chan struct{}, 1)
	a, err := agent.New(agent.Config{NetNS: cfg[0], PinDir: cfg[1], StateDir: cfg[2], Linger: 200 * time.Millisecond,
		Resync: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
		OnChange: func() {
			select {
			case changed <- struct{}{}:
			default:
			}
		}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	for _, n := range strings.Split(cfg[3], ",") {
		if err := a.Set(n, agent.Policy{Steering: agent.SteerHardware}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	go a.Run(context.Background())
	buf := make([]byte, 4096)
	for {
		n, fds, err := xsk.RecvFDs(conn, buf, 1)
		if err != nil {
			return 0
		}
		var reply []byte
		switch f := strings.Fields(string(buf[:n])); {
		case len(f) == 3 && f[0] == "add" && len(fds) == 1:
			q, _ := strconv.Atoi(f[2])
			err := a.AddSocket(f[1], uint32(q), fds[0])
			unix.Close(fds[0])
			reply = []byte(fmt.Sprint(err))
		case len(f) == 1 && f[0] == "status":
			reply, _ = json.Marshal(a.Status())
		case len(f) == 3 && f[0] == "wait":
			timeout := time.After(5 * time.Second)
		wait:
			for {
				st := status(a, f[1])
				reply, _ = json.Marshal(st)
				if st.State == agent.State(f[2]) {
					break
				}
				select {
				case <-changed:
				case <-timeout:
					break wait
				}
			}
		default:
			reply = []byte("bad command")
		}
		xsk.SendFDs(conn, reply, nil)
	}
}

type daemon struct {
	cmd  *exec.Cmd
	conn *net.UnixConn
	log  *strings.Builder
	mu   sync.Mutex
}

func startDaemon(t *testing.T, nsPath, pins, state, netdevs string) *daemon {
	t.Helper()
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	parent, child := os.NewFile(uintptr(sp[0]), "ctl"), os.NewFile(uintptr(sp[1]), "ctl")
	defer child.Close()
	c, err := net.FileConn(parent)
	parent.Close()
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{conn: c.(*net.UnixConn), log: &strings.Builder{}}
	d.cmd = exec.Command(os.Args[0], "-test.run=^$")
	d.cmd.Env = append(os.Environ(), daemonEnv+"="+nsPath+";"+pins+";"+state+";"+netdevs)
	d.cmd.ExtraFiles = []*os.File{child}
	d.cmd.Stderr = &lockedWriter{d: d}
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.kill() })
	return d
}

type lockedWriter struct{ d *daemon }

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.d.mu.Lock()
	defer w.d.mu.Unlock()
	return w.d.log.Write(p)
}

func (d *daemon) logs() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.log.String()
}

func (d *daemon) call(t *testing.T, cmd string, fds ...int) []byte {
	t.Helper()
	d.conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := xsk.SendFDs(d.conn, []byte(cmd), fds); err != nil {
		t.Fatalf("%s: %v\ndaemon log:\n%s", cmd, err, d.logs())
	}
	buf := make([]byte, 64<<10)
	n, _, err := xsk.RecvFDs(d.conn, buf, 0)
	if err != nil {
		t.Fatalf("%s: %v\ndaemon log:\n%s", cmd, err, d.logs())
	}
	return buf[:n]
}

// waitState asks the daemon to answer once the netdev is in state.
func (d *daemon) waitState(t *testing.T, netdev string, state agent.State) agent.Status {
	t.Helper()
	var s agent.Status
	if err := json.Unmarshal(d.call(t, "wait "+netdev+" "+string(state)), &s); err != nil {
		t.Fatal(err)
	}
	if s.State != state {
		t.Fatalf("%s: %s (%s), want %s\ndaemon log:\n%s", netdev, s.State, s.Reason, state, d.logs())
	}
	return s
}

func (d *daemon) kill() {
	if d.cmd.ProcessState == nil {
		d.cmd.Process.Signal(syscall.SIGKILL)
		d.cmd.Wait()
	}
	d.conn.Close()
}

// TestDaemonCrash: with traffic flowing into a bound socket, SIGKILL the
// daemon: packets keep arriving. Start it again: it adopts its program and
// pins, removes the program from the netdev whose sockets went while it
// was dead, and touches nothing else.
func TestDaemonCrash(t *testing.T) {
	p := testnet.NewPair(t, 4)
	pins := pinDir(t)
	// A second netdev (veth xs, peer xt) whose socket will go while the
	// daemon is dead.
	if err := p.NS.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "xs"}, PeerName: "xt"}); err != nil {
			return err
		}
		for _, n := range []string{"xs", "xt"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	xs, err := netIndex(p, "xs")
	if err != nil {
		t.Fatal(err)
	}
	// The operator's program on xb, which the daemon does not manage.
	ip(t, p, "link", "set", "dev", p.B.Name, "xdpdrv", "obj", operatorObj, "sec", "xdp")
	operator, _ := xdp.Query(p.NSPath(), p.B.Index)

	state := t.TempDir()
	d1 := startDaemon(t, p.NSPath(), pins, state, "xa,xs")
	sA, rA := socket(t, p, 0)
	umemS, sockS, err := xsk.Open(xsk.Netdev{Name: "xs", Ifindex: xs, NetNS: p.NSPath()}, []uint32{0}, 64,
		xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: xsk.Rings{Fill: 64, Completion: 64, RX: 64}})
	if err != nil {
		t.Fatal(err)
	}
	defer umemS.Close()
	for _, c := range []struct {
		cmd string
		fd  int
	}{{"add xa 0", sA.FD()}, {"add xs 0", sockS[0].FD()}} {
		if out := string(d1.call(t, c.cmd, c.fd)); out != "<nil>" {
			t.Fatalf("%s: %s", c.cmd, out)
		}
	}
	before := d1.waitState(t, "xa", agent.StateDirect)
	d1.waitState(t, "xs", agent.StateDirect)

	// Traffic into xa's queue 0 for the rest of the test. The receiver
	// reports its count after each batch; a waiter takes the latest.
	var received atomic.Uint64
	progress := make(chan uint64, 1)
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			rA.Receive(-1, time.Now().Add(20*time.Millisecond), func([]byte) error { received.Add(1); return nil })
			n := received.Load()
			select {
			case <-progress: // drop the older count
			default:
			}
			progress <- n
		}
	}()
	flood := floodFrom(t, p, 0)
	go func() {
		defer wg.Done()
		flood(stop.Load)
	}()
	defer func() { stop.Store(true); wg.Wait() }()
	waitCount := func(what string, from uint64) {
		t.Helper()
		timeout := time.After(5 * time.Second)
		for n := received.Load(); n < from+10000; {
			select {
			case n = <-progress:
			case <-timeout:
				t.Fatalf("%s: %d frames arrived, want 10000", what, received.Load()-from)
			}
		}
	}
	waitCount("with the daemon up", received.Load())

	d1.kill()
	waitCount("with the daemon killed", received.Load())
	sockS[0].Close() // xs loses its socket while no daemon watches

	d2 := startDaemon(t, p.NSPath(), pins, state, "xa,xs")
	after := d2.waitState(t, "xa", agent.StateDirect)
	if after.Program != before.Program {
		t.Errorf("xa: program %d after the restart, want the adopted %d", after.Program, before.Program)
	}
	d2.waitState(t, "xs", agent.StateNone)
	if att, _ := xdp.Query(p.NSPath(), xs); att != nil {
		t.Errorf("xs keeps a program without sockets: %+v", att)
	}
	waitCount("after the restart", received.Load())
	if att, _ := xdp.Query(p.NSPath(), p.B.Index); att == nil || att.ID != operator.ID {
		t.Errorf("the operator's program on xb was touched: %+v, was %+v", att, operator)
	}
	if !strings.Contains(d2.logs(), "adopted attached program") {
		t.Errorf("the restarted daemon did not say it adopted:\n%s", d2.logs())
	}
}

func netIndex(p *testnet.Pair, name string) (int, error) {
	var idx int
	err := p.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		idx = l.Attrs().Index
		return nil
	})
	return idx, err
}

// floodFrom returns a function that floods A from B's queue until stop.
func floodFrom(t *testing.T, p *testnet.Pair, queue uint32) func(stop func() bool) {
	t.Helper()
	sock, addrs := openXSK(t, p, p.B, queue, 512, xsk.Rings{Fill: 64, Completion: 512, TX: 512})
	f, err := frame.Spec{SrcMAC: p.B.MAC, DstMAC: p.A.MAC, Src: p.B.Addr, Dst: p.A.Addr, Protocol: 17,
		SrcPort: 1, DstPort: 5000, Payload: frame.Payload(0, 0, 22)}.Build()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		copy(sock.UMEM().Bytes(a, uint32(len(f))), f)
	}
	return func(stop func() bool) {
		if _, err := traffic.Flood(sock, addrs, uint32(len(f)), 64, stop); err != nil {
			t.Error(err)
		}
	}
}
