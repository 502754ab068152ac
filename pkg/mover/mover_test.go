package mover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/testing/testnet"
)

func TestMain(m *testing.M) { os.Exit(testnet.MainWithLeakCheck(m)) }

// The machine's kernel has no dummy, netdevsim or spare NIC: the netdev
// handed to the pod is one end of a veth pair ("xa"). A veth is destroyed
// with the namespace holding it, where a VF would return to the initial
// namespace; the tests that need a VF's return say "Simulated" and put the
// netdev where the kernel would.

// env is a node namespace with veth xa/xb, a pod namespace held as the
// daemon holds it, and a Mover for them.
type env struct {
	t       testing.TB
	node    *testnet.Pair
	nodeNS  netns.NsHandle
	nodeNL  *netlink.Handle
	podPath string
	pod     netns.NsHandle
	podNL   *netlink.Handle
	m       *Mover
}

// newNS makes a bind-mounted network namespace and returns its path; it is
// unmounted when the test ends, unless the test did it first.
func newNS(t testing.TB) string {
	t.Helper()
	testnet.RequireRoot(t) // a namespace mounted under /var/run/netns
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	path := n.Path()
	n.Close()
	t.Cleanup(func() {
		if _, err := os.Stat(path); err == nil {
			unix.Unmount(path, unix.MNT_DETACH)
			os.Remove(path)
		}
	})
	return path
}

func handle(t testing.TB, h netns.NsHandle) *netlink.Handle {
	t.Helper()
	nl, err := netlink.NewHandleAt(h, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nl.Close)
	return nl
}

func setup(t testing.TB, cfg Config) *env {
	t.Helper()
	e := &env{t: t, node: testnet.NewPair(t, 1)}
	var err error
	if e.nodeNS, err = netns.GetFromPath(e.node.NSPath()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.nodeNS.Close() })
	e.nodeNL = handle(t, e.nodeNS)
	e.podPath = newNS(t)
	if e.pod, err = HoldNetNS(e.podPath); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.pod.Close() })
	e.podNL = handle(t, e.pod)
	cfg.Node = e.node.NSPath()
	if cfg.Init == "" {
		cfg.Init = cfg.Node
	}
	if e.m, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.m.Close() })
	return e
}

// snap is what the tests compare byte for byte: a link's name, ifindex,
// flags (but for the carrier's, which follow asynchronously) and state.
type snap struct {
	Name  string
	Index int
	Flags uint32
	State State
}

func (s snap) is(o snap) bool {
	return s.Name == o.Name && s.Index == o.Index && s.Flags == o.Flags && s.State.equal(o.State, true)
}

func snapOf(a *netlink.LinkAttrs) snap {
	return snap{a.Name, a.Index, a.RawFlags &^ (unix.IFF_RUNNING | unix.IFF_LOWER_UP | unix.IFF_DORMANT | unix.IFF_ECHO), stateOf(a)}
}

func (e *env) snap(h *netlink.Handle, name string) snap {
	e.t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		e.t.Fatalf("%s: %v", name, err)
	}
	return snapOf(l.Attrs())
}

// absent fails unless no link of h is named name.
func (e *env) absent(h *netlink.Handle, where, name string) {
	e.t.Helper()
	if l, err := h.LinkByName(name); err == nil {
		e.t.Fatalf("%s has a %s (ifindex %d)", where, name, l.Attrs().Index)
	}
}

// set puts state s on link name of h, as an operator (or DPDK) would.
func set(t *testing.T, h *netlink.Handle, name string, s State) {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	a := l.Attrs()
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("set %s: %v", name, err)
		}
	}
	check(h.LinkSetDown(l))
	if s.MAC != "" {
		mac, err := net.ParseMAC(s.MAC)
		check(err)
		check(h.LinkSetHardwareAddr(l, mac))
	}
	check(h.LinkSetMTU(l, s.MTU))
	check(h.LinkSetTxQLen(l, s.TxQLen))
	check(h.LinkSetAlias(l, s.Alias))
	for _, n := range a.AltNames {
		check(h.LinkDelAltName(l, n))
	}
	for _, n := range s.AltNames {
		check(h.LinkAddAltName(l, n))
	}
	onOff := func(on bool, setOn, setOff func(netlink.Link) error) {
		if on {
			check(setOn(l))
		} else {
			check(setOff(l))
		}
	}
	onOff(s.Promisc, h.SetPromiscOn, h.SetPromiscOff)
	onOff(s.AllMulti, h.LinkSetAllmulticastOn, h.LinkSetAllmulticastOff)
	onOff(!s.NoARP, h.LinkSetARPOn, h.LinkSetARPOff)
	onOff(s.Multicast, h.LinkSetMulticastOn, h.LinkSetMulticastOff)
	if s.Up {
		check(h.LinkSetUp(l))
	}
}

// persist round-trips a record through JSON and Validate, as the daemon
// stores it before the move.
func persist(t *testing.T, r Record) Record {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Record
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if err := back.Validate(); err != nil {
		t.Fatal(err)
	}
	return back
}

// dpdk changes in the pod what a DPDK application may leave behind.
func dpdk(t *testing.T, h *netlink.Handle, name string) {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	s := stateOf(l.Attrs())
	s.MAC, s.MTU, s.TxQLen = "02:aa:bb:cc:dd:ee", 3000, 64
	s.Promisc, s.AllMulti, s.NoARP = true, true, true
	s.AltNames = []string{"dpdk-port0"}
	set(t, h, name, s)
	for _, a := range []string{"10.66.0.9/24", "fd00:66::9/64"} {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.AddrAdd(l, addr); err != nil {
			t.Fatalf("address %s in the pod: %v", a, err)
		}
	}
}

// noPodAddrs checks that the netdev back on the node kept none of the
// addresses dpdk gave it in the pod.
func noPodAddrs(t *testing.T, h *netlink.Handle, name string) {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if a.IP.IsGlobalUnicast() {
			t.Errorf("%s back on the node with the pod's address %s", name, a.IPNet)
		}
	}
}

// nodeStates are node-side states a pooled netdev may be in.
var nodeStates = []struct {
	name  string
	state State
}{
	{"up plain", State{MTU: 1500, MAC: "02:58:44:50:51:01", TxQLen: 1000, Up: true, Multicast: true}},
	{"down", State{MTU: 1500, MAC: "02:58:44:50:51:01", TxQLen: 1000, Multicast: true}},
	{"everything set", State{MTU: 9000, MAC: "02:00:00:00:00:42", Alias: "uplink a", AltNames: []string{"enp59s0f0v1", "xdpq-test-vf"},
		TxQLen: 500, Up: true, Promisc: true, AllMulti: true, NoARP: true}},
}

// TestMoveInOut moves xa into the pod and back for each node state, the
// pod changing it like DPDK in between, and compares byte for byte.
func TestMoveInOut(t *testing.T) {
	for _, tc := range nodeStates {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, Config{})
			set(t, e.nodeNL, "xa", tc.state)
			before := e.snap(e.nodeNL, "xa")
			r, err := e.m.Prepare("xa", "net1", 1400)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Node.equal(tc.state, true) {
				t.Fatalf("prepared %s, want %s", r.Node, tc.state)
			}
			r = persist(t, r)
			l, err := e.m.MoveIn(r, e.pod)
			if err != nil {
				t.Fatal(err)
			}
			in := e.snap(e.podNL, "net1")
			if l.Name != "net1" || l.Index != in.Index || l.MAC.String() != tc.state.MAC {
				t.Errorf("MoveIn returned %+v; in the pod: %+v", l, in)
			}
			if in.State.MTU != 1400 || in.State.Alias != "xa" || !in.State.Up || len(in.State.AltNames) != 0 {
				t.Errorf("in the pod: %s; want mtu 1400, alias xa, up, no altnames", in.State)
			}
			e.absent(e.nodeNL, "the node", "xa")
			e.absent(e.nodeNL, "the node", r.Temp)
			for _, n := range tc.state.AltNames {
				e.absent(e.nodeNL, "the node", n)
				e.absent(e.podNL, "the pod", n)
			}
			loc, err := e.m.Locate(r, e.pod)
			if err != nil || loc.Place != InPod || !loc.Settled {
				t.Fatalf("Locate after MoveIn: %v, %v", loc, err)
			}

			dpdk(t, e.podNL, "net1")
			if err := e.m.MoveOut(context.Background(), r, e.pod); err != nil {
				t.Fatal(err)
			}
			if after := e.snap(e.nodeNL, "xa"); !after.is(before) {
				t.Errorf("back on the node:\n got %+v\nwant %+v", after, before)
			}
			noPodAddrs(t, e.nodeNL, "xa")
			e.absent(e.podNL, "the pod", "net1")
			e.absent(e.podNL, "the pod", r.Temp)
			if loc, err := e.m.Locate(r, e.pod); err != nil || loc.Place != OnNode || !loc.Settled {
				t.Fatalf("Locate after MoveOut: %v, %v", loc, err)
			}
			// MoveOut again: nothing to do, nothing done.
			did, err := e.m.moveOut(context.Background(), r, e.pod, 0)
			if err != nil || len(did) != 0 {
				t.Fatalf("second MoveOut: did %v, %v", did, err)
			}
		})
	}
}

// watch collects the link notifications of namespace h until one
// satisfies last, and returns them all.
func watch(t *testing.T, h netns.NsHandle) (wait func(last func(*netlink.LinkAttrs) bool) []netlink.LinkUpdate) {
	t.Helper()
	ch := make(chan netlink.LinkUpdate, 1024)
	done := make(chan struct{})
	if err := netlink.LinkSubscribeWithOptions(ch, done, netlink.LinkSubscribeOptions{Namespace: &h}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(done)
		for range ch {
		}
	})
	return func(last func(*netlink.LinkAttrs) bool) []netlink.LinkUpdate {
		t.Helper()
		var seen []netlink.LinkUpdate
		deadline := time.After(10 * time.Second)
		for {
			select {
			case u, ok := <-ch:
				if !ok {
					t.Fatal("link notifications ended")
				}
				seen = append(seen, u)
				if last(u.Attrs()) {
					return seen
				}
			case <-deadline:
				t.Fatalf("no final notification within 10s; saw %d", len(seen))
			}
		}
	}
}

func carries(a *netlink.LinkAttrs, name string) bool {
	return a.Name == name || slices.Contains(a.AltNames, name)
}

// TestNamesAppearLast watches the notifications of both namespaces: the
// first message that carries the pod name shows the netdev complete but for
// up, and so does the first that carries its node name (or one of its
// alternative names) on the way back.
func TestNamesAppearLast(t *testing.T) {
	for _, tc := range nodeStates {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, Config{})
			set(t, e.nodeNL, "xa", tc.state)
			r, err := e.m.Prepare("xa", "net1", 1400)
			if err != nil {
				t.Fatal(err)
			}
			podWatch := watch(t, e.pod)
			if _, err := e.m.MoveIn(r, e.pod); err != nil {
				t.Fatal(err)
			}
			seen := podWatch(func(a *netlink.LinkAttrs) bool { return a.Name == "net1" && isUp(a) })
			first := slices.IndexFunc(seen, func(u netlink.LinkUpdate) bool { return carries(u.Attrs(), "net1") })
			if a := seen[first].Attrs(); a.MTU != 1400 || a.Alias != "xa" || len(a.AltNames) != 0 {
				t.Errorf("net1 first appeared with mtu %d, alias %q, altnames %v; want mtu 1400, alias xa, none", a.MTU, a.Alias, a.AltNames)
			}

			dpdk(t, e.podNL, "net1")
			nodeWatch := watch(t, e.nodeNS)
			if err := e.m.MoveOut(context.Background(), r, e.pod); err != nil {
				t.Fatal(err)
			}
			// Restored xa, then a change on xb: the last of MoveOut's
			// notifications came before it.
			if err := e.nodeNL.LinkSetAlias(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: e.node.B.Index}}, "sentinel"); err != nil {
				t.Fatal(err)
			}
			seen = nodeWatch(func(a *netlink.LinkAttrs) bool { return a.Index == e.node.B.Index && a.Alias == "sentinel" })
			names := append([]string{"xa"}, tc.state.AltNames...)
			var ours []netlink.LinkUpdate
			for _, u := range seen {
				if u.Attrs().Index != e.node.B.Index {
					ours = append(ours, u)
				}
			}
			first = slices.IndexFunc(ours, func(u netlink.LinkUpdate) bool {
				return slices.ContainsFunc(names, func(n string) bool { return carries(u.Attrs(), n) })
			})
			if first < 0 {
				t.Fatalf("no notification carried xa among %d", len(ours))
			}
			a := ours[first].Attrs()
			got := stateOf(a)
			if !got.equal(tc.state, false) || got.Up {
				t.Errorf("%s first carried a node name with %s; want %s, down", a.Name, got, tc.state)
			}
			if end := stateOf(ours[len(ours)-1].Attrs()); !end.equal(tc.state, true) || ours[len(ours)-1].Attrs().Name != "xa" {
				t.Errorf("last notification: %s %s; want xa %s", ours[len(ours)-1].Attrs().Name, end, tc.state)
			}
		})
	}
}

// TestNameClashInPod: the pod has a net1 already. MoveIn says so and
// changes nothing, on the node (not one notification) or in the pod.
func TestNameClashInPod(t *testing.T) {
	e := setup(t, Config{})
	if err := e.podNL.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "net1"}, PeerName: "peer1"}); err != nil {
		t.Fatal(err)
	}
	theirs := e.snap(e.podNL, "net1")
	before := e.snap(e.nodeNL, "xa")
	r, err := e.m.Prepare("xa", "net1", 0)
	if err != nil {
		t.Fatal(err)
	}
	nodeWatch := watch(t, e.nodeNS)
	_, err = e.m.MoveIn(r, e.pod)
	if !errors.Is(err, ErrNameTaken) {
		t.Fatalf("MoveIn: %v; want ErrNameTaken", err)
	}
	t.Log(err)
	if err := e.nodeNL.LinkSetAlias(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: e.node.B.Index}}, "sentinel"); err != nil {
		t.Fatal(err)
	}
	for _, u := range nodeWatch(func(a *netlink.LinkAttrs) bool { return a.Alias == "sentinel" }) {
		if u.Attrs().Index == before.Index {
			t.Errorf("xa changed: %s %s", u.Attrs().Name, stateOf(u.Attrs()))
		}
	}
	if after := e.snap(e.nodeNL, "xa"); !after.is(before) {
		t.Errorf("xa: got %+v, want %+v", after, before)
	}
	if after := e.snap(e.podNL, "net1"); !after.is(theirs) {
		t.Errorf("the pod's net1: got %+v, want %+v", after, theirs)
	}
	// The Record of the refused move must not claim the pod's net1.
	if loc, err := e.m.Locate(r, e.pod); err != nil || loc.Place != OnNode || !loc.Settled {
		t.Errorf("Locate: %v, %v; want settled on the node", loc, err)
	}
}

// TestNameClashOnNode: while xa is in the pod the node gets another xa.
// MoveOut leaves the netdev under its temporary name, restored and down,
// and says so; once the name is free, MoveOut completes.
func TestNameClashOnNode(t *testing.T) {
	e := setup(t, Config{})
	before := e.snap(e.nodeNL, "xa")
	r, err := e.m.Prepare("xa", "net1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.MoveIn(r, e.pod); err != nil {
		t.Fatal(err)
	}
	dpdk(t, e.podNL, "net1")
	if err := e.nodeNL.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "xa"}, PeerName: "xc"}); err != nil {
		t.Fatal(err)
	}
	theirs := e.snap(e.nodeNL, "xa")
	err = e.m.MoveOut(context.Background(), r, e.pod)
	if !errors.Is(err, ErrNameTaken) {
		t.Fatalf("MoveOut: %v; want ErrNameTaken", err)
	}
	t.Log(err)
	if after := e.snap(e.nodeNL, "xa"); !after.is(theirs) {
		t.Errorf("the other xa: got %+v, want %+v", after, theirs)
	}
	loc, err := e.m.Locate(r, e.pod)
	if err != nil || loc.Place != Between || loc.Netns != "node" || loc.Link.Name != r.Temp {
		t.Fatalf("Locate: %v, %v; want half moved as %s on the node", loc, err, r.Temp)
	}
	if !loc.State.equal(r.Node, false) || loc.State.Up {
		t.Errorf("waiting as %s with %s; want %s, down", r.Temp, loc.State, r.Node)
	}
	if err := e.nodeNL.LinkDel(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: theirs.Index}}); err != nil {
		t.Fatal(err)
	}
	if err := e.m.MoveOut(context.Background(), r, e.pod); err != nil {
		t.Fatal(err)
	}
	if after := e.snap(e.nodeNL, "xa"); !after.is(before) {
		t.Errorf("back on the node:\n got %+v\nwant %+v", after, before)
	}
}

// destroy removes the pod's namespace: the daemon's hold goes, then the
// runtime's bind mount (unmounted without MNT_DETACH: HoldNetNS must not
// keep it busy).
func (e *env) destroy() {
	e.t.Helper()
	e.podNL.Close()
	e.pod.Close()
	e.pod = netns.None()
	if err := unix.Unmount(e.podPath, 0); err != nil {
		e.t.Fatalf("unmount the pod's netns: %v", err)
	}
	os.Remove(e.podPath)
}

// TestPodNetnsDeletedVeth: a veth in a pod whose namespace is deleted is
// destroyed with it. MoveOut and Recover say so at once.
func TestPodNetnsDeletedVeth(t *testing.T) {
	e := setup(t, Config{})
	r, err := e.m.Prepare("xa", "net1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.MoveIn(r, e.pod); err != nil {
		t.Fatal(err)
	}
	e.destroy()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = e.m.MoveOut(ctx, r, netns.None())
	if !errors.Is(err, ErrGone) || ctx.Err() != nil {
		t.Fatalf("MoveOut: %v; want ErrGone at once", err)
	}
	t.Log(err)
	if loc, err := e.m.Recover(ctx, r, netns.None()); !errors.Is(err, ErrGone) || loc.Place != Nowhere {
		t.Fatalf("Recover: %v, %v; want nowhere, ErrGone", loc, err)
	}
}

// TestReturnedByKernelSimulated: a netdev with a driver of its own whose
// pod's namespace is destroyed lands in the initial namespace under its pod
// name if free there, else dev<ifindex>, its alias kept. The test puts the
// veth there itself, as the kernel would a VF, in a namespace standing for
// the initial one.
func TestReturnedByKernelSimulated(t *testing.T) {
	for _, name := range []string{"net1", "dev%d"} {
		t.Run(name, func(t *testing.T) {
			initPath := newNS(t)
			e := setup(t, Config{Init: initPath})
			initNS, err := netns.GetFromPath(initPath)
			if err != nil {
				t.Fatal(err)
			}
			defer initNS.Close()
			initNL := handle(t, initNS)
			set(t, e.nodeNL, "xa", nodeStates[2].state)
			before := e.snap(e.nodeNL, "xa")
			r, err := e.m.Prepare("xa", "net1", 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.m.MoveIn(r, e.pod); err != nil {
				t.Fatal(err)
			}
			dpdk(t, e.podNL, "net1")
			l, err := e.podNL.LinkByName("net1")
			if err != nil {
				t.Fatal(err)
			}
			if err := e.podNL.LinkSetNsFd(l, int(initNS)); err != nil {
				t.Fatal(err)
			}
			if name != "net1" {
				l, err := initNL.LinkByName("net1")
				if err != nil {
					t.Fatal(err)
				}
				if err := initNL.LinkSetName(l, fmt.Sprintf(name, l.Attrs().Index)); err != nil {
					t.Fatal(err)
				}
			}
			e.destroy()
			if loc, err := e.m.Locate(r, netns.None()); err != nil || loc.Place != Between || loc.Netns != "initial" {
				t.Fatalf("Locate: %v, %v; want half moved in the initial namespace", loc, err)
			}
			loc, err := e.m.Recover(context.Background(), r, netns.None())
			if err != nil || loc.Place != OnNode || !loc.Settled {
				t.Fatalf("Recover: %v, %v", loc, err)
			}
			if after := e.snap(e.nodeNL, "xa"); !after.is(before) {
				t.Errorf("back on the node:\n got %+v\nwant %+v", after, before)
			}
		})
	}
}

// TestMoveOutWaitsForReturnSimulated: MoveOut, finding a netdev with a
// driver of its own nowhere, waits for the kernel to return it. The veth
// stands for a VF (its Record says "device"); it waits in a namespace
// standing for the dying pod's until MoveOut waits, then the test hands it
// to the one standing for the initial namespace, as cleanup_net would.
func TestMoveOutWaitsForReturnSimulated(t *testing.T) {
	initPath, limboPath := newNS(t), newNS(t)
	e := setup(t, Config{Init: initPath})
	initNS, err := netns.GetFromPath(initPath)
	if err != nil {
		t.Fatal(err)
	}
	defer initNS.Close()
	limboNS, err := netns.GetFromPath(limboPath)
	if err != nil {
		t.Fatal(err)
	}
	defer limboNS.Close()
	limboNL := handle(t, limboNS)
	before := e.snap(e.nodeNL, "xa")
	r, err := e.m.Prepare("xa", "net1", 0)
	if err != nil {
		t.Fatal(err)
	}
	r.Kind = "device"
	if _, err := e.m.MoveIn(r, e.pod); err != nil {
		t.Fatal(err)
	}
	l, err := e.podNL.LinkByName("net1")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.podNL.LinkSetNsFd(l, int(limboNS)); err != nil {
		t.Fatal(err)
	}
	e.destroy()

	waiting := make(chan struct{})
	e.m.waiting = func() { close(waiting) }
	var wg sync.WaitGroup
	var moved error
	wg.Go(func() {
		<-waiting
		l, err := limboNL.LinkByName("net1")
		if err == nil {
			err = limboNL.LinkSetNsFd(l, int(initNS))
		}
		moved = err
	})
	err = e.m.MoveOut(context.Background(), r, netns.None())
	wg.Wait()
	if moved != nil {
		t.Fatal(moved)
	}
	if err != nil {
		t.Fatal(err)
	}
	if after := e.snap(e.nodeNL, "xa"); !after.is(before) {
		t.Errorf("back on the node:\n got %+v\nwant %+v", after, before)
	}

	// A netdev that does not come back within ReturnWait is ErrNotFound.
	e.m.waiting = nil
	e.m.wait = 50 * time.Millisecond
	r.Name, r.Index, r.Temp = "xz", 999, tempName(999)
	if err := e.m.MoveOut(context.Background(), r, netns.None()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("MoveOut of a netdev that never returns: %v; want ErrNotFound", err)
	}
}

// TestCrashDuringMoveIn stops MoveIn after each of its steps, as a SIGKILL
// between two netlink calls would, then has MoveOut put it right from the
// Record alone.
func TestCrashDuringMoveIn(t *testing.T) {
	for _, tc := range nodeStates {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, Config{})
			set(t, e.nodeNL, "xa", tc.state)
			before := e.snap(e.nodeNL, "xa")
			r, err := e.m.Prepare("xa", "net1", 1400)
			if err != nil {
				t.Fatal(err)
			}
			r = persist(t, r)
			// A crash after the Record is persisted, before any step.
			if did, err := e.m.moveOut(context.Background(), r, e.pod, 0); err != nil || len(did) != 0 {
				t.Fatalf("MoveOut before any step: did %v, %v", did, err)
			}
			_, steps, err := e.m.moveIn(r, e.pod, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("MoveIn: %s", strings.Join(steps, "; "))
			if err := e.m.MoveOut(context.Background(), r, e.pod); err != nil {
				t.Fatal(err)
			}
			for k := 1; k < len(steps); k++ {
				_, did, err := e.m.moveIn(r, e.pod, k)
				if !errors.Is(err, errStopped) || !slices.Equal(did, steps[:k]) {
					t.Fatalf("crash after %d steps: did %v, %v; want %v", k, did, err, steps[:k])
				}
				loc, err := e.m.Locate(r, e.pod)
				if err != nil {
					t.Fatal(err)
				}
				e.checkPlace(r, loc, false)
				if err := e.m.MoveOut(context.Background(), r, e.pod); err != nil {
					t.Fatalf("after %q: MoveOut: %v", steps[k-1], err)
				}
				if after := e.snap(e.nodeNL, "xa"); !after.is(before) {
					t.Fatalf("after %q, back on the node:\n got %+v\nwant %+v", steps[k-1], after, before)
				}
				e.absent(e.podNL, "the pod", "net1")
			}
		})
	}
}

// TestCrashDuringMoveOut stops MoveOut after each of its steps, then has a
// new MoveOut finish from the Record alone.
func TestCrashDuringMoveOut(t *testing.T) {
	for _, tc := range nodeStates {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, Config{})
			set(t, e.nodeNL, "xa", tc.state)
			before := e.snap(e.nodeNL, "xa")
			r, err := e.m.Prepare("xa", "net1", 1400)
			if err != nil {
				t.Fatal(err)
			}
			in := func() {
				t.Helper()
				if _, err := e.m.MoveIn(r, e.pod); err != nil {
					t.Fatal(err)
				}
				dpdk(t, e.podNL, "net1")
			}
			in()
			steps, err := e.m.moveOut(context.Background(), r, e.pod, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("MoveOut: %s", strings.Join(steps, "; "))
			for k := 1; k < len(steps); k++ {
				in()
				did, err := e.m.moveOut(context.Background(), r, e.pod, k)
				if !errors.Is(err, errStopped) || !slices.Equal(did, steps[:k]) {
					t.Fatalf("crash after %d steps: did %v, %v; want %v", k, did, err, steps[:k])
				}
				loc, err := e.m.Locate(r, e.pod)
				if err != nil {
					t.Fatal(err)
				}
				e.checkPlace(r, loc, true)
				if err := e.m.MoveOut(context.Background(), r, e.pod); err != nil {
					t.Fatalf("after %q: MoveOut: %v", steps[k-1], err)
				}
				if after := e.snap(e.nodeNL, "xa"); !after.is(before) {
					t.Fatalf("after %q, back on the node:\n got %+v\nwant %+v", steps[k-1], after, before)
				}
			}
		})
	}
}

// checkPlace checks a half-done move's Location against the namespaces:
// the node name is on the node only when Locate says OnNode, and then,
// on the way back, with all the node state but up.
func (e *env) checkPlace(r Record, loc Location, out bool) {
	e.t.Helper()
	switch loc.Place {
	case OnNode:
		s := e.snap(e.nodeNL, r.Name)
		if out && (!s.State.equal(r.Node, false) || s.State.Up) {
			e.t.Fatalf("back under its name with %s; want %s, down", s.State, r.Node)
		}
	case InPod:
		e.snap(e.podNL, r.IfName)
		e.absent(e.nodeNL, "the node", r.Name)
	case Between:
		e.absent(e.nodeNL, "the node", r.Name)
		e.absent(e.podNL, "the pod", r.IfName)
		if loc.Link.Name != r.Temp {
			e.t.Fatalf("half moved as %s, not %s", loc.Link.Name, r.Temp)
		}
	default:
		e.t.Fatalf("Locate: %v", loc)
	}
}

// TestRecover: a netdev in the pod under its name stays (what the pod did
// to it is the pod's business); a half-moved one comes back.
func TestRecover(t *testing.T) {
	e := setup(t, Config{})
	before := e.snap(e.nodeNL, "xa")
	r, err := e.m.Prepare("xa", "net1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.MoveIn(r, e.pod); err != nil {
		t.Fatal(err)
	}
	loc, err := e.m.Recover(context.Background(), r, e.pod)
	if err != nil || loc.Place != InPod || !loc.Settled {
		t.Fatalf("Recover, settled in the pod: %v, %v", loc, err)
	}
	dpdk(t, e.podNL, "net1")
	l, _ := e.podNL.LinkByName("net1")
	if err := e.podNL.LinkSetDown(l); err != nil {
		t.Fatal(err)
	}
	loc, err = e.m.Recover(context.Background(), r, e.pod)
	if err != nil || loc.Place != InPod || loc.Settled || loc.State.Up {
		t.Fatalf("Recover, changed by the pod: %v, %v", loc, err)
	}
	if _, err := e.m.moveOut(context.Background(), r, e.pod, 3); !errors.Is(err, errStopped) {
		t.Fatal(err)
	}
	loc, err = e.m.Recover(context.Background(), r, e.pod)
	if err != nil || loc.Place != OnNode || !loc.Settled {
		t.Fatalf("Recover, half moved: %v, %v", loc, err)
	}
	if after := e.snap(e.nodeNL, "xa"); !after.is(before) {
		t.Errorf("back on the node:\n got %+v\nwant %+v", after, before)
	}
}

// TestPodRenamedIt: the pod renamed its netdev; its alias still finds it.
// A pod that also clears the alias loses a virtual netdev to xdpq: a VF
// would still be found by its parent device.
func TestPodRenamedIt(t *testing.T) {
	e := setup(t, Config{})
	before := e.snap(e.nodeNL, "xa")
	r, err := e.m.Prepare("xa", "net1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.MoveIn(r, e.pod); err != nil {
		t.Fatal(err)
	}
	l, _ := e.podNL.LinkByName("net1")
	if err := e.podNL.LinkSetName(l, "renamed"); err != nil {
		t.Fatal(err)
	}
	if err := e.m.MoveOut(context.Background(), r, e.pod); err != nil {
		t.Fatal(err)
	}
	if after := e.snap(e.nodeNL, "xa"); !after.is(before) {
		t.Errorf("back on the node:\n got %+v\nwant %+v", after, before)
	}

	if _, err := e.m.MoveIn(r, e.pod); err != nil {
		t.Fatal(err)
	}
	l, _ = e.podNL.LinkByName("net1")
	if err := e.podNL.LinkSetAlias(l, ""); err != nil {
		t.Fatal(err)
	}
	if err := e.podNL.LinkSetName(l, "renamed"); err != nil {
		t.Fatal(err)
	}
	if err := e.m.MoveOut(context.Background(), r, e.pod); !errors.Is(err, ErrNotFound) {
		t.Fatalf("MoveOut of a virtual netdev stripped of its marks: %v; want ErrNotFound", err)
	}
}

// TestMoveInRollback: a step in the pod fails (an MTU the veth refuses):
// MoveIn puts everything back and says what failed.
func TestMoveInRollback(t *testing.T) {
	e := setup(t, Config{})
	set(t, e.nodeNL, "xa", nodeStates[2].state)
	before := e.snap(e.nodeNL, "xa")
	r, err := e.m.Prepare("xa", "net1", 70000)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.m.MoveIn(r, e.pod)
	if err == nil || !strings.Contains(err.Error(), "mtu 70000") {
		t.Fatalf("MoveIn: %v; want the mtu refused", err)
	}
	t.Log(err)
	if after := e.snap(e.nodeNL, "xa"); !after.is(before) {
		t.Errorf("back on the node:\n got %+v\nwant %+v", after, before)
	}
	e.absent(e.podNL, "the pod", r.Temp)
	e.absent(e.podNL, "the pod", "net1")
}

// TestTwoNetdevsConcurrently moves both ends of the pair into one pod at
// once and back.
func TestTwoNetdevsConcurrently(t *testing.T) {
	e := setup(t, Config{})
	before := map[string]snap{"xa": e.snap(e.nodeNL, "xa"), "xb": e.snap(e.nodeNL, "xb")}
	var recs []Record
	for i, n := range []string{"xa", "xb"} {
		r, err := e.m.Prepare(n, fmt.Sprintf("net%d", i+1), 0)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	errs := make([]error, len(recs))
	var wg sync.WaitGroup
	for i, r := range recs {
		wg.Go(func() { _, errs[i] = e.m.MoveIn(r, e.pod) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for i, r := range recs {
		wg.Go(func() { errs[i] = e.m.MoveOut(context.Background(), r, e.pod) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for n, s := range before {
		if after := e.snap(e.nodeNL, n); !after.is(s) {
			t.Errorf("%s back on the node:\n got %+v\nwant %+v", n, after, s)
		}
	}
}

// TestRefused: what Prepare and MoveIn refuse, with nothing changed.
func TestRefused(t *testing.T) {
	e := setup(t, Config{})
	before := e.snap(e.nodeNL, "xa")
	for _, tc := range []struct {
		netdev, ifname string
		mtu            int
		want           string
	}{
		{"nope", "net1", 0, "not found"},
		{"xa", "a/b", 0, "'/'"},
		{"xa", "sixteen-bytes-xx", 0, "longer than 15"},
		{"xa", "net1", -1, "negative"},
	} {
		if _, err := e.m.Prepare(tc.netdev, tc.ifname, tc.mtu); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Prepare(%q, %q, %d): %v; want %q", tc.netdev, tc.ifname, tc.mtu, err, tc.want)
		}
	}

	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := e.nodeNL.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	xa, _ := e.nodeNL.LinkByName("xa")
	if err := e.nodeNL.LinkSetMaster(xa, br); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Prepare("xa", "net1", 0); err == nil || !strings.Contains(err.Error(), "port of") {
		t.Errorf("Prepare of a bridge port: %v", err)
	}
	if err := e.nodeNL.LinkSetNoMaster(xa); err != nil {
		t.Fatal(err)
	}
	if err := e.nodeNL.LinkDel(br); err != nil {
		t.Fatal(err)
	}

	if err := e.nodeNL.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: tempName(before.Index)}, PeerName: "xc"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Prepare("xa", "net1", 0); !errors.Is(err, ErrNameTaken) {
		t.Errorf("Prepare with the temporary name taken: %v", err)
	}
	if err := e.nodeNL.LinkDel(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "xc"}}); err != nil {
		t.Fatal(err)
	}

	r, err := e.m.Prepare("xa", "net1", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.MoveIn(r, e.nodeNS); err == nil || !strings.Contains(err.Error(), "shares the node's") {
		t.Errorf("MoveIn into the node's own namespace: %v", err)
	}
	if _, err := e.m.MoveIn(r, netns.None()); err == nil {
		t.Error("MoveIn with no pod namespace: no error")
	}
	changed := r
	changed.Node.MTU = 1280
	if _, err := e.m.MoveIn(changed, e.pod); err == nil || !strings.Contains(err.Error(), "prepare again") {
		t.Errorf("MoveIn with a stale Record: %v", err)
	}
	bad := r
	bad.Temp = "eth0"
	if _, err := e.m.MoveIn(bad, e.pod); err == nil || !strings.Contains(err.Error(), "want \"xdpq") {
		t.Errorf("MoveIn with a Record whose temporary name is not its own: %v", err)
	}
	if after := e.snap(e.nodeNL, "xa"); !after.is(before) {
		t.Errorf("xa:\n got %+v\nwant %+v", after, before)
	}
}

// TestHoldNetNS: the namespace lives as long as the hold, and the hold
// does not keep the runtime's bind mount busy.
func TestHoldNetNS(t *testing.T) {
	testnet.RequireRoot(t)
	path := newNS(t)
	h, err := HoldNetNS(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := unix.Unmount(path, 0); err != nil {
		t.Fatalf("unmount a held netns: %v", err)
	}
	os.Remove(path)
	nl := handle(t, h)
	if _, err := nl.LinkByName("lo"); err != nil {
		t.Fatalf("the held namespace: %v", err)
	}
	if _, err := HoldNetNS(path); err == nil {
		t.Fatal("HoldNetNS of a removed path: no error")
	}
}

// BenchmarkMoveInOut measures a round trip, into the pod and back, with
// the node namespace holding links more links besides xa.
func BenchmarkMoveInOut(b *testing.B) {
	for _, links := range []int{0, 500} {
		b.Run(fmt.Sprintf("node links=%d", links+3), func(b *testing.B) {
			e := setup(b, Config{})
			for i := range links / 2 {
				if err := e.nodeNL.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("bench%da", i)}, PeerName: fmt.Sprintf("bench%db", i)}); err != nil {
					b.Fatal(err)
				}
			}
			r, err := e.m.Prepare("xa", "net1", 0)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := e.m.MoveIn(r, e.pod); err != nil {
					b.Fatal(err)
				}
				if err := e.m.MoveOut(context.Background(), r, e.pod); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestMoveOutFromHandMadeStates builds half-done states with netlink calls
// of its own, not the package's steps, and has MoveOut put each right.
func TestMoveOutFromHandMadeStates(t *testing.T) {
	type op func(e *env, r Record, l netlink.Link) error
	var (
		down    = func(e *env, r Record, l netlink.Link) error { return e.nodeNL.LinkSetDown(l) }
		up      = func(e *env, r Record, l netlink.Link) error { return e.nodeNL.LinkSetUp(l) }
		aliased = func(e *env, r Record, l netlink.Link) error { return e.nodeNL.LinkSetAlias(l, r.Name) }
		temp    = func(e *env, r Record, l netlink.Link) error { return e.nodeNL.LinkSetName(l, r.Temp) }
		kern    = func(e *env, r Record, l netlink.Link) error {
			return e.nodeNL.LinkSetName(l, fmt.Sprintf("dev%d", r.Index))
		}
		prom = func(e *env, r Record, l netlink.Link) error { return e.nodeNL.SetPromiscOn(l) }
		mtu  = func(e *env, r Record, l netlink.Link) error { return e.nodeNL.LinkSetMTU(l, 3000) }
		mac  = func(e *env, r Record, l netlink.Link) error {
			return e.nodeNL.LinkSetHardwareAddr(l, net.HardwareAddr{2, 0xaa, 0, 0, 0, 1})
		}
		toPod = func(e *env, r Record, l netlink.Link) error { return e.nodeNL.LinkSetNsFd(l, int(e.pod)) }
		// In the pod from here on.
		podName = func(e *env, r Record, _ netlink.Link) error {
			l, err := e.podNL.LinkByName(r.Temp)
			if err == nil {
				err = e.podNL.LinkSetName(l, r.IfName)
			}
			return err
		}
		podUp = func(e *env, r Record, _ netlink.Link) error {
			l, err := e.podNL.LinkByName(r.IfName)
			if err == nil {
				err = e.podNL.LinkSetUp(l)
			}
			return err
		}
	)
	for _, tc := range []struct {
		name string
		ops  []op
	}{
		{"on the node, down and aliased", []op{down, aliased}},
		{"on the node under the temporary name", []op{down, aliased, temp}},
		{"on the node under the temporary name, changed and up", []op{down, aliased, temp, mtu, prom, mac, up}},
		{"in the pod under the temporary name, changed", []op{down, aliased, mtu, prom, temp, toPod}},
		{"in the pod under its pod name, up", []op{down, aliased, temp, toPod, podName, podUp}},
		{"on the node under a name the kernel gave it, up", []op{down, aliased, kern, prom, up}},
		{"on the node under its own name, changed and up", []op{mtu, prom, mac}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, Config{})
			before := e.snap(e.nodeNL, "xa")
			r, err := e.m.Prepare("xa", "net1", 0)
			if err != nil {
				t.Fatal(err)
			}
			l, err := e.nodeNL.LinkByName("xa")
			if err != nil {
				t.Fatal(err)
			}
			for i, o := range tc.ops {
				if err := o(e, r, l); err != nil {
					t.Fatalf("op %d: %v", i, err)
				}
			}
			if err := e.m.MoveOut(context.Background(), r, e.pod); err != nil {
				t.Fatal(err)
			}
			if after := e.snap(e.nodeNL, "xa"); !after.is(before) {
				t.Errorf("back on the node:\n got %+v\nwant %+v", after, before)
			}
			e.absent(e.podNL, "the pod", r.Temp)
			e.absent(e.podNL, "the pod", r.IfName)
		})
	}
}

// TestInitNetns: a mover in the initial network namespace (the DaemonSet's
// host network) takes it as the initial one by its inode, without opening
// pid 1's (which needs CAP_SYS_PTRACE, and which this sandbox's pid 1
// refuses even to root); a pod's namespace is not taken for it.
func TestInitNetns(t *testing.T) {
	testnet.RequireRoot(t)
	self, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(self), &st); err != nil {
		t.Fatal(err)
	}
	if st.Ino != initNetnsInode {
		t.Fatalf("the test runs in netns inode %#x, not the initial namespace's fixed %#x: a kernel without PROC_NET_INIT_INO, or not the host's namespace", st.Ino, initNetnsInode)
	}
	if !isInitNetns(self) {
		t.Error("the initial namespace not recognised")
	}
	m, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.InitErr() != nil || m.init.IsOpen() {
		t.Errorf("in the initial namespace: init open %v, InitErr %v", m.init.IsOpen(), m.InitErr())
	}
	pair := testnet.NewPair(t, 1)
	pod, err := netns.GetFromPath(pair.NSPath())
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	if isInitNetns(pod) {
		t.Errorf("a pod's namespace %s taken for the initial one", pair.NSPath())
	}
}
