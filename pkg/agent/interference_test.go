package agent_test

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/ethtool"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// TestOneAgentPerNetdev: a second agent with pins and state of its own
// does not manage a netdev the first one manages: it is refused, naming
// the first one's process, before it touches the netdev, and the first
// one's flow stays. Once the first lets the netdev go, the second takes
// it. A process that holds the netdev's lock without being an agent is
// named the same way. (Before, the second took the first one's program
// back without pins, and its sync removed the first one's flows.)
func TestOneAgentPerNetdev(t *testing.T) {
	p := testnet.NewPair(t, 2)
	a1 := start(t, p, time.Second)
	if err := a1.Set("xa", agent.Policy{Mode: xdp.ModeNative}); err != nil {
		t.Fatal(err)
	}
	flow := agent.Flow{Protocol: xdp.UDP, Dst: host(p.A.Addr.String()), DstPort: 5000, Queues: []uint32{0}}
	if err := a1.Steer("xa", "pod-a", []agent.Flow{flow}); err != nil {
		t.Fatal(err)
	}
	a2 := start(t, p, time.Second)
	err := a2.Set("xa", agent.Policy{Mode: xdp.ModeNative})
	if !errors.Is(err, agent.ErrNetdevHeld) || !strings.Contains(err.Error(), fmt.Sprintf("(pid %d: ", os.Getpid())) {
		t.Fatalf("a second agent on the netdev: %v; want it refused, naming this process", err)
	}
	if st := a2.Status(); len(st) != 0 {
		t.Errorf("the second agent reports %+v; want nothing managed", st)
	}
	if n, err := a2.SyncSteering("xa", nil); err == nil || n != 0 {
		t.Errorf("the second agent synced the netdev's steering: %d removed, %v", n, err)
	}
	if err := a1.VerifySteering("xa", "pod-a"); err != nil {
		t.Errorf("the first agent's flow: %v", err)
	}

	if err := a1.Unmanage("xa"); err != nil {
		t.Fatal(err)
	}
	if err := a2.Set("xa", agent.Policy{Mode: xdp.ModeNative}); err != nil {
		t.Fatalf("the netdev once the first agent let it go: %v", err)
	}
	if err := a2.Unmanage("xa"); err != nil {
		t.Fatal(err)
	}

	// Not an agent, in the netdev's namespace: named too.
	var squatter *net.UnixListener
	if err := p.NS.Do(func(ns.NetNS) (err error) {
		squatter, err = net.ListenUnix("unix", &net.UnixAddr{Name: "@xdpq.io/netdev/xa", Net: "unix"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	err = a2.Set("xa", agent.Policy{Mode: xdp.ModeNative})
	squatter.Close()
	if !errors.Is(err, agent.ErrNetdevHeld) || !strings.Contains(err.Error(), fmt.Sprintf("(pid %d: ", os.Getpid())) {
		t.Fatalf("a netdev whose lock another process holds: %v", err)
	}
	if err := a2.Set("xa", agent.Policy{Mode: xdp.ModeNative}); err != nil {
		t.Fatalf("the netdev once the other process let it go: %v", err)
	}
}

// TestRepairSoftwareSteering: flow map entries deleted behind the
// agent's back (bpftool map delete) are put back where they were, and
// only those; a second repair finds nothing to do.
func TestRepairSoftwareSteering(t *testing.T) {
	p := testnet.NewPair(t, 4)
	a := start(t, p, time.Second)
	if err := a.Set("xa", agent.Policy{Steering: agent.SteerSoftware, Mode: xdp.ModeNative}); err != nil {
		t.Fatal(err)
	}
	flows := map[string]agent.Flow{
		"pod-a": {Protocol: xdp.UDP, Dst: host("10.0.0.1"), DstPort: 5000, Queues: []uint32{0, 1}},
		"pod-b": {Protocol: xdp.TCP, Dst: host("10.0.0.2"), DstPort: 443, Queues: []uint32{2}},
	}
	for owner, f := range flows {
		if err := a.Steer("xa", owner, []agent.Flow{f}); err != nil {
			t.Fatal(err)
		}
	}
	prog, err := a.Program("xa")
	if err != nil {
		t.Fatal(err)
	}
	have, err := prog.Flows()
	if err != nil {
		t.Fatal(err)
	}
	if back, err := a.RepairSteering("xa"); err != nil || len(back) != 0 {
		t.Fatalf("repair with nothing gone: %v, %v", back, err)
	}
	// One of pod-a's two entries (one per queue), and pod-b's.
	for f := range have {
		if f.Dst == host("10.0.0.2").Addr() || f.Dst == host("10.0.0.1").Addr() && f.Queue == 1 {
			if err := prog.DeleteFlow(f); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := a.VerifySteering("xa", "pod-b"); err == nil {
		t.Fatal("verify after pod-b's entry was deleted: no error")
	}
	back, err := a.RepairSteering("xa")
	if err != nil || !maps.Equal(back, map[string]int{"pod-a": 1, "pod-b": 1}) {
		t.Fatalf("repair put back %v, %v; want a flow of each pod", back, err)
	}
	now, err := prog.Flows()
	if err != nil || !maps.Equal(now, have) {
		t.Fatalf("the flow map after repair: %v, %v; want %v", now, err, have)
	}
	for owner := range flows {
		if err := a.VerifySteering("xa", owner); err != nil {
			t.Errorf("verify %s after repair: %v", owner, err)
		}
	}
	if back, err := a.RepairSteering("xa"); err != nil || len(back) != 0 {
		t.Fatalf("a second repair: %v, %v", back, err)
	}
}

// TestRepairHardwareSteering: on a NIC with ntuple filters (a fake: veth
// has none), an owner's rule deleted behind the agent's back (ethtool -N
// delete) is put back at its location, and someone else's rule put in an
// owner's place in xdpq's range is replaced; rules outside the range
// stay.
func TestRepairHardwareSteering(t *testing.T) {
	p := testnet.NewPair(t, 4)
	nic := newFakeNtupleNIC(4)
	a := newAgentWithNIC(t, p, nic, pinDir(t), t.TempDir())
	if err := a.Set("xa", agent.Policy{Rules: agent.RuleRange{First: 100, Count: 4}}); err != nil {
		t.Fatal(err)
	}
	if err := a.Steer("xa", "pod-a", []agent.Flow{
		{Protocol: xdp.UDP, Dst: host("10.0.0.1"), DstPort: 5000, Queues: []uint32{2}},
		{Protocol: xdp.TCP, Dst: host("10.0.0.2"), DstPort: 443, Queues: []uint32{3}},
	}); err != nil {
		t.Fatal(err)
	}
	foreign := ethtool.Rule{Location: 5, Type: ethtool.UDP4, Dst: host("192.0.2.1"), Queue: 0}
	nic.AddRule("xa", foreign)
	want := maps.Clone(nic.rules)

	nic.DeleteRule("xa", 100)
	nic.DeleteRule("xa", 101)
	nic.AddRule("xa", ethtool.Rule{Location: 101, Type: ethtool.UDP4, Dst: host("192.0.2.9"), Queue: 0})
	back, err := a.RepairSteering("xa")
	if err != nil || !maps.Equal(back, map[string]int{"pod-a": 2}) {
		t.Fatalf("repair put back %v, %v; want pod-a's two flows", back, err)
	}
	if !reflect.DeepEqual(nic.rules, want) {
		t.Fatalf("rules after repair: %v; want %v", nic.rules, want)
	}
	if back, err := a.RepairSteering("xa"); err != nil || len(back) != 0 {
		t.Fatalf("a second repair: %v, %v", back, err)
	}
}

// TestProgramPutBack: xdpq's program taken off the netdev behind the
// agent's back while a socket is bound (ip link set dev xa xdpdrv off)
// is attached again, and the socket receives again.
func TestProgramPutBack(t *testing.T) {
	p := testnet.NewPair(t, 2)
	a := start(t, p, time.Second)
	if err := a.Set("xa", agent.Policy{Mode: xdp.ModeNative, Steering: agent.SteerSoftware}); err != nil {
		t.Fatal(err)
	}
	if err := a.Steer("xa", "pod-a", []agent.Flow{{Protocol: xdp.UDP, Dst: host(p.A.Addr.String()), DstPort: 5000, Queues: []uint32{0}}}); err != nil {
		t.Fatal(err)
	}
	s0, r0 := socket(t, p, 0)
	if err := a.AddSocket("xa", 0, s0.FD()); err != nil {
		t.Fatal(err)
	}
	waitState(t, a, "xa", agent.StateFilter)
	send := sender(t, p, 0)
	if err := r0.Expect(send.UDP(10), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	progID := func() uint32 {
		t.Helper()
		var id uint32
		if err := p.NS.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName("xa")
			if err == nil && l.Attrs().Xdp != nil {
				id = l.Attrs().Xdp.ProgId
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	was := progID()
	if err := p.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("xa")
		if err != nil {
			return err
		}
		return netlink.LinkSetXdpFdWithFlags(l, -1, unix.XDP_FLAGS_DRV_MODE)
	}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); progID() != was; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("xdpq's program %d taken off: the hook has %d", was, progID())
		}
	}
	if err := r0.Expect(send.UDP(10), time.Now().Add(5*time.Second)); err != nil {
		t.Fatalf("after the program was put back: %v", err)
	}
}

// TestEnsureAfterRestart: one of an owner's two flows is deleted while
// no agent runs; the next agent's sync takes the one it finds, and
// EnsureSteering installs the other (before, the daemon's check of the
// owner's flows passed on the one held, and the other stayed missing).
func TestEnsureAfterRestart(t *testing.T) {
	p := testnet.NewPair(t, 4)
	pins, state := pinDir(t), t.TempDir()
	flows := []agent.Flow{
		{Protocol: xdp.UDP, Dst: host("10.0.0.1"), DstPort: 5000, Queues: []uint32{0}},
		{Protocol: xdp.TCP, Dst: host("10.0.0.1"), DstPort: 443, Queues: []uint32{1}},
	}
	a := startWith(t, agent.Config{NetNS: p.NSPath(), PinDir: pins, StateDir: state})
	policy := agent.Policy{Steering: agent.SteerSoftware, Mode: xdp.ModeNative}
	if err := a.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	if err := a.Steer("xa", "pod-a", flows); err != nil {
		t.Fatal(err)
	}
	prog, err := a.Program("xa")
	if err != nil {
		t.Fatal(err)
	}
	have, err := prog.Flows()
	if err != nil || len(have) != 2 {
		t.Fatalf("the flow map: %v, %v", have, err)
	}
	for f := range have {
		if f.Port == 443 {
			if err := prog.DeleteFlow(f); err != nil {
				t.Fatal(err)
			}
		}
	}
	a.Close()

	a = startWith(t, agent.Config{NetNS: p.NSPath(), PinDir: pins, StateDir: state})
	if err := a.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	keep := map[string][]agent.Flow{"pod-a": flows}
	if n, err := a.SyncSteering("xa", keep); err != nil || n != 0 {
		t.Fatalf("sync removed %d, %v", n, err)
	}
	if err := a.VerifySteering("xa", "pod-a"); err != nil {
		t.Fatalf("verify after sync: %v (it checks the flows held, the one found)", err)
	}
	added, err := a.EnsureSteering("xa", "pod-a", flows)
	if err != nil || added != 1 {
		t.Fatalf("ensure installed %d, %v; want the missing flow", added, err)
	}
	prog, err = a.Program("xa")
	if err != nil {
		t.Fatal(err)
	}
	if now, err := prog.Flows(); err != nil || !maps.Equal(now, have) {
		t.Fatalf("the flow map after ensure: %v, %v; want %v", now, err, have)
	}
	if added, err := a.EnsureSteering("xa", "pod-a", flows); err != nil || added != 0 {
		t.Fatalf("ensure again: %d, %v", added, err)
	}
}
