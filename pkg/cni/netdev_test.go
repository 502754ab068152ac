package cni

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/api"
	xdpqclient "github.com/xdpq/xdpq/pkg/client"
)

const netdevPool = "pools: [{name: vf, mode: netdev, steering: software, devices: {netdevs: [xa]}}]\n"

func (n *node) netdevConf(ver string, mtu int, flows string) []byte {
	return []byte(fmt.Sprintf(`{"cniVersion":%q,"name":"vf","type":"xdpq","daemonSocket":%q,"mtu":%d,
		"ipam":{"type":"host-local","subnet":"10.77.0.0/24","dataDir":%q},"flows":[%s]}`,
		ver, n.socket, mtu, n.data, flows))
}

// link returns the link named name in the namespace at path, or nil.
func linkIn(t *testing.T, path, name string) netlink.Link {
	t.Helper()
	var l netlink.Link
	err := ns.WithNetNSPath(path, func(ns.NetNS) error {
		var err error
		l, err = netlink.LinkByName(name)
		return err
	})
	if err != nil {
		if _, ok := err.(netlink.LinkNotFoundError); ok {
			return nil
		}
		t.Fatal(err)
	}
	return l
}

// checkHome checks that xa is back on the node as it was: its name, MTU
// 1500, no alias, no address, under the node agent.
func (n *node) checkHome(t *testing.T) {
	t.Helper()
	l := linkIn(t, n.pair.NSPath(), "xa")
	if l == nil {
		t.Fatal("xa is not back on the node")
	}
	if l.Attrs().MTU != 1500 || l.Attrs().Alias != "" || l.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("xa back with mtu %d, alias %q, flags %v", l.Attrs().MTU, l.Attrs().Alias, l.Attrs().Flags)
	}
	s, err := api.NewClient(n.socket).Status()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range s.Netdevs {
		if d.Netdev == "xa" && strings.Contains(d.Reason, "pod netns") {
			t.Errorf("xa still reported in a pod: %+v", d)
		}
	}
}

// waitStatusOf waits until ok holds of the node daemon's status.
func waitStatusOf(t *testing.T, n *node, ok func(*api.Status) bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		s, err := api.NewClient(n.socket).Status()
		if err == nil && ok(s) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon's status: %+v %v", s, err)
		}
		time.Sleep(10 * time.Millisecond) // the daemon has no event stream to wait on
	}
}

// TestNetdevPool: in a netdev-mode pool, ADD moves the whole netdev into
// the pod's netns, renamed to CNI_IFNAME with the MTU asked for and the
// IPAM address on it; CHECK verifies it against prevResult; DEL brings it
// back to the node as it was, three times in a row; per spec version.
func TestNetdevPool(t *testing.T) {
	n := startNodeWith(t, 0, netdevPool, "vf", 1)
	for _, ver := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		t.Run(ver, func(t *testing.T) {
			pod, err := testutils.NewNS()
			if err != nil {
				t.Fatal(err)
			}
			defer testutils.UnmountNS(pod)
			defer pod.Close()
			args := &skel.CmdArgs{ContainerID: "vf-" + ver, Netns: pod.Path(), IfName: "net1",
				Args: "XDPQ_ALLOCATION=" + n.alloc, StdinData: n.netdevConf(ver, 1400, "")}
			r, _, err := testutils.CmdAddWithArgs(args, func() error { return CmdAdd(args) })
			if err != nil {
				t.Fatal(err)
			}
			res, err := current.NewResultFromResult(r)
			if err != nil {
				t.Fatal(err)
			}
			if linkIn(t, n.pair.NSPath(), "xa") != nil {
				t.Fatal("xa is still on the node after ADD")
			}
			l := linkIn(t, pod.Path(), "net1")
			if l == nil {
				t.Fatal("no net1 in the pod")
			}
			if l.Attrs().MTU != 1400 || l.Attrs().Alias != "xa" || l.Attrs().Flags&net.FlagUp == 0 {
				t.Errorf("net1: mtu %d alias %q flags %v", l.Attrs().MTU, l.Attrs().Alias, l.Attrs().Flags)
			}
			if ver != "0.4.0" || len(res.Interfaces) > 0 {
				if len(res.Interfaces) != 1 || res.Interfaces[0].Name != "net1" || res.Interfaces[0].Sandbox != pod.Path() ||
					res.Interfaces[0].Mac != n.pair.A.MAC.String() {
					t.Errorf("result interfaces %+v", res.Interfaces)
				}
			}
			var addrs []netlink.Addr
			if nerr := ns.WithNetNSPath(pod.Path(), func(ns.NetNS) error { addrs, err = netlink.AddrList(l, netlink.FAMILY_V4); return err }); nerr != nil {
				t.Fatal(nerr)
			}
			if len(res.IPs) != 1 || len(addrs) != 1 || !addrs[0].IP.Equal(res.IPs[0].Address.IP) {
				t.Errorf("net1 has %v, IPAM gave %v", addrs, res.IPs)
			}

			check := withPrev(t, args, r)
			if err := testutils.CmdCheckWithArgs(check, func() error { return CmdCheck(check) }); err != nil {
				t.Errorf("CHECK: %v", err)
			}
			if err := ns.WithNetNSPath(pod.Path(), func(ns.NetNS) error { return netlink.LinkSetMTU(l, 1300) }); err != nil {
				t.Fatal(err)
			}
			err = testutils.CmdCheckWithArgs(check, func() error { return CmdCheck(check) })
			if err == nil || !strings.Contains(err.Error(), "mtu 1300, configured 1400") {
				t.Errorf("CHECK with the MTU changed in the pod: %v", err)
			}

			for i := range 3 {
				if err := testutils.CmdDelWithArgs(args, func() error { return CmdDel(args) }); err != nil {
					t.Fatalf("DEL %d: %v", i+1, err)
				}
			}
			if linkIn(t, pod.Path(), "net1") != nil {
				t.Error("net1 is still in the pod after DEL")
			}
			n.checkHome(t)
			if leases := n.leases("vf"); len(leases) != 0 {
				t.Errorf("leases left: %v", leases)
			}
		})
	}
}

// TestNetdevPoolTraffic: the pod's sockets, bound by the broker inside the
// pod's netns on the moved netdev, receive the pod's flow byte for byte and
// nothing else; the rest reaches the pod's kernel stack on net1. After DEL
// the netdev is the node's again and a new lease binds there.
func TestNetdevPoolTraffic(t *testing.T) {
	n := startNodeWith(t, 0, netdevPool, "vf", 1)
	pod, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer testutils.UnmountNS(pod)
	defer pod.Close()
	args := &skel.CmdArgs{ContainerID: "vf-traffic", Netns: pod.Path(), IfName: "net1",
		Args: "XDPQ_ALLOCATION=" + n.alloc, StdinData: n.netdevConf("1.1.0", 0, `{"protocol":"udp","destinationPort":"2152"}`)}
	r, _, err := testutils.CmdAddWithArgs(args, func() error { return CmdAdd(args) })
	if err != nil {
		t.Fatal(err)
	}
	res, _ := current.NewResultFromResult(r)
	podIP, _ := netip.AddrFromSlice(res.IPs[0].Address.IP.To4())

	lease, err := xdpqclient.Connect(n.broker, xdpqclient.Options{Name: "vf", Ring: 256, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if lease.Netdev != "net1" || len(lease.Queues) != 4 {
		t.Errorf("welcome: netdev %q queues %v, want net1 and the netdev's 4", lease.Netdev, lease.Queues)
	}
	recv := make([]*traffic.Receiver, len(lease.Sockets))
	for i, s := range lease.Sockets {
		if recv[i], err = traffic.NewReceiver(s, lease.RXFrames(i)); err != nil {
			t.Fatal(err)
		}
	}
	before := rxPackets(t, pod.Path(), "net1")
	mine := sendMixed(t, n, podIP, 50)
	for i, q := range lease.Queues[:2] { // sendMixed sends on queues 0 and 1
		if err := recv[i].Expect(mine[q], time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("queue %d: %v", q, err)
		}
	}
	for i, q := range lease.Queues {
		if extra, _ := recv[i].Receive(-1, time.Now().Add(200*time.Millisecond), func([]byte) error { return nil }); extra != 0 {
			t.Errorf("queue %d: %d frames that are not the pod's flow", q, extra)
		}
	}
	// The other 200 frames went up the pod's own stack on net1.
	if got := rxPackets(t, pod.Path(), "net1") - before; got < 200 {
		t.Errorf("net1 in the pod counted %d packets, want the 200 that are not the flow", got)
	}

	if err := testutils.CmdDelWithArgs(args, func() error { return CmdDel(args) }); err != nil {
		t.Fatal(err)
	}
	n.checkHome(t)
	// The lease ended with the move; the allocation binds on the node now.
	lease.Close()
	lease2, err := xdpqclient.Connect(n.broker, xdpqclient.Options{Name: "vf", Ring: 256, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("lease after DEL: %v", err)
	}
	defer lease2.Close()
	if lease2.Netdev != "xa" {
		t.Errorf("after DEL the allocation is on %q, want xa", lease2.Netdev)
	}
}

func rxPackets(t *testing.T, path, name string) uint64 {
	t.Helper()
	l := linkIn(t, path, name)
	if l == nil || l.Attrs().Statistics == nil {
		t.Fatalf("no %s statistics", name)
	}
	return l.Attrs().Statistics.RxPackets
}

// TestNetdevPoolRefused: a netdev-mode ADD without a netns, an mtu on a
// queue pool, and an ADD into a pod while the netdev is in another pod are
// refused with the reason, and nothing moves.
func TestNetdevPoolRefused(t *testing.T) {
	n := startNodeWith(t, 0, netdevPool, "vf", 1)
	pod, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer testutils.UnmountNS(pod)
	defer pod.Close()
	args := &skel.CmdArgs{ContainerID: "vf-1", Netns: pod.Path(), IfName: "net1",
		Args: "XDPQ_ALLOCATION=" + n.alloc, StdinData: n.netdevConf("1.1.0", 0, "")}
	if _, err := api.NewClient(n.socket).CNIAdd(api.CNIAddRequest{ContainerID: "x", IfName: "net1", Allocation: n.alloc}); err == nil ||
		!strings.Contains(err.Error(), "needs the pod's netns") {
		t.Errorf("ADD without netns: %v", err)
	}
	if _, _, err := testutils.CmdAddWithArgs(args, func() error { return CmdAdd(args) }); err != nil {
		t.Fatal(err)
	}
	defer testutils.CmdDelWithArgs(args, func() error { return CmdDel(args) })
	other := *args
	other.ContainerID = "vf-2"
	_, _, err = testutils.CmdAddWithArgs(&other, func() error { return CmdAdd(&other) })
	if err == nil || !strings.Contains(err.Error(), "in use by attachment vf-1/net1") {
		t.Errorf("second pod on the netdev: %v", err)
	}
	if l := linkIn(t, pod.Path(), "net1"); l == nil {
		t.Error("the refused ADD moved the netdev out of the first pod")
	}

	q := startNode(t)
	qa := &skel.CmdArgs{ContainerID: "q-1", Netns: pod.Path(), IfName: "net2", Args: "XDPQ_ALLOCATION=" + q.alloc,
		StdinData: []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"q","type":"xdpq","daemonSocket":%q,"mtu":9000}`, q.socket))}
	if _, _, err := testutils.CmdAddWithArgs(qa, func() error { return CmdAdd(qa) }); err == nil || !strings.Contains(err.Error(), "mtu applies to netdev-mode pools") {
		t.Errorf("mtu on a queue pool: %v", err)
	}
}

// TestNetdevPoolNetnsGone: the pod's netns is gone (unmounted, no process
// in it) before DEL: the daemon, holding it, still brings the netdev back.
func TestNetdevPoolNetnsGone(t *testing.T) {
	n := startNodeWith(t, 0, netdevPool, "vf", 1)
	pod, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	path := pod.Path()
	args := &skel.CmdArgs{ContainerID: "vf-gone", Netns: path, IfName: "net1",
		Args: "XDPQ_ALLOCATION=" + n.alloc, StdinData: n.netdevConf("1.1.0", 9000, "")}
	if _, _, err := testutils.CmdAddWithArgs(args, func() error { return CmdAdd(args) }); err != nil {
		t.Fatal(err)
	}
	pod.Close()
	if err := testutils.UnmountNS(pod); err != nil {
		t.Fatal(err)
	}
	if err := testutils.CmdDelWithArgs(args, func() error { return CmdDel(args) }); err != nil {
		t.Fatal(err)
	}
	n.checkHome(t)
}

// TestNetdevPoolSurvivesRestart: a daemon restarted while a netdev is in
// its pod leaves it there, manages it there again (CHECK passes, a lease
// binds on net1 inside the pod), and DEL still brings it back.
func TestNetdevPoolSurvivesRestart(t *testing.T) {
	n := startNodeWith(t, 0, netdevPool, "vf", 1)
	pod, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer testutils.UnmountNS(pod)
	defer pod.Close()
	args := &skel.CmdArgs{ContainerID: "vf-restart", Netns: pod.Path(), IfName: "net1",
		Args: "XDPQ_ALLOCATION=" + n.alloc, StdinData: n.netdevConf("1.1.0", 0, `{"protocol":"udp","destinationPort":"2152"}`)}
	r, _, err := testutils.CmdAddWithArgs(args, func() error { return CmdAdd(args) })
	if err != nil {
		t.Fatal(err)
	}
	n.restart(nil)
	if linkIn(t, pod.Path(), "net1") == nil {
		t.Fatal("the restart took net1 out of the pod")
	}
	check := withPrev(t, args, r)
	if err := testutils.CmdCheckWithArgs(check, func() error { return CmdCheck(check) }); err != nil {
		t.Errorf("CHECK after the restart: %v", err)
	}
	lease, err := xdpqclient.Connect(n.broker, xdpqclient.Options{Name: "vf", Ring: 64, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if lease.Netdev != "net1" {
		t.Errorf("after the restart the allocation binds on %q, want net1", lease.Netdev)
	}
	lease.Close()
	if err := testutils.CmdDelWithArgs(args, func() error { return CmdDel(args) }); err != nil {
		t.Fatal(err)
	}
	n.checkHome(t)
}

// TestCollectGonePods: pods that go without a DEL (their netns removed,
// as the runtime does after the pod) lose their attachments on the
// daemon's own: the queue pool's flows go, the netdev pool's netdev comes
// back to the node, and their allocations stay.
func TestCollectGonePods(t *testing.T) {
	q := startNode(t)
	v := startNodeWith(t, 0, netdevPool, "vf", 1)
	var pods []ns.NetNS
	for _, c := range []struct {
		n    *node
		conf []byte
	}{{q, q.conf("1.1.0")}, {v, v.netdevConf("1.1.0", 0, "")}} {
		pod, err := testutils.NewNS()
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, pod)
		args := &skel.CmdArgs{ContainerID: "gone", Netns: pod.Path(), IfName: "net1",
			Args: "XDPQ_ALLOCATION=" + c.n.alloc, StdinData: c.conf}
		if _, _, err := testutils.CmdAddWithArgs(args, func() error { return CmdAdd(args) }); err != nil {
			t.Fatal(err)
		}
	}
	// Still there after a collection that ran while the pods live.
	began := time.Now()
	for _, n := range []*node{q, v} {
		waitStatusOf(t, n, func(s *api.Status) bool { return s.Collected.After(began) })
	}
	if q.flows(t) == 0 || linkIn(t, v.pair.NSPath(), "xa") != nil {
		t.Fatal("attachments of live pods were collected")
	}
	for _, pod := range pods {
		pod.Close()
		testutils.UnmountNS(pod)
	}
	// Gone when the daemon says so: its CHECK no longer knows them.
	for _, n := range []*node{q, v} {
		waitStatusOf(t, n, func(*api.Status) bool {
			_, err := api.NewClient(n.socket).CNICheck("gone", "net1")
			return err != nil && strings.Contains(err.Error(), "no attachment")
		})
	}
	if q.flows(t) != 0 {
		t.Errorf("%d flows of the gone pod", q.flows(t))
	}
	v.checkHome(t)
	for _, n := range []*node{q, v} {
		l, err := api.NewClient(n.socket).Allocations("")
		if err != nil || len(l.Allocations) != 1 {
			t.Errorf("allocations after the collection: %+v %v", l, err)
		}
	}
}
