package daemon

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/client"
)

// TestNetdevRecreatedUnderAllocation: the pool's netdev is deleted and
// made again with its name (a driver reload, an SR-IOV reset) while an
// allocation holds its queues and a pod leases them. The daemon manages
// the new netdev (not Missing for good), the pod's lease, whose sockets
// were bound to the netdev that went, ends and cannot be resumed, and
// the pod's next lease binds to the new netdev and receives its flow's
// frames byte for byte; the pool's queues are counted as they are held.
// (Before, the netdev stayed Missing until a restart and binds were
// refused "no such device".)
func TestNetdevRecreatedUnderAllocation(t *testing.T) {
	pair := testnet.NewPair(t, 4)
	d, _ := runDaemon(t, standaloneOpts(t, pair, t.TempDir(), testPins(t),
		"pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}}]\n"))
	a := allocWithFlow(t, d, pair, "upf")
	pod := connectPod(t, a.Socket)
	pod.expect(t, pair, "before the netdev is re-created")
	old := pair.A.Index

	if err := pair.Recreate(); err != nil {
		t.Fatal(err)
	}
	pod.waitEvent(t, client.EventLost)
	pod.waitEvent(t, client.EventFailed)
	if ifindex, _ := d.core.agent.Ifindex("xa"); ifindex != pair.A.Index || ifindex == old {
		t.Errorf("xa managed under ifindex %d after re-creation, want %d (was %d)", ifindex, pair.A.Index, old)
	}
	if n := netdevOf(t, d, "xa"); n.State == string(agent.StateMissing) {
		t.Errorf("xa after re-creation: %+v", n)
	}
	pod.lease.Close()

	again := connectPod(t, a.Socket)
	again.expect(t, pair, "after the netdev was re-created")
	if n := netdevOf(t, d, "xa"); n.State != string(agent.StateFilter) {
		t.Errorf("xa with a socket: %+v", n)
	}
	s, err := d.core.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if p := s.Pools[0]; p.Free != 0 || p.Allocations != 1 {
		t.Errorf("pool %+v; want its 2 queues held by the one allocation", p)
	}
}

// TestCNICheckNetdevMissing: CHECK of an attachment whose netdev is
// gone answers unavailable (503: it may pass once the netdev is back),
// naming the netdev and its state, not internal (500: the daemon
// failed), as it did.
func TestCNICheckNetdevMissing(t *testing.T) {
	pair := testnet.NewPair(t, 4)
	d, _ := runDaemon(t, standaloneOpts(t, pair, t.TempDir(), testPins(t),
		"pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}}]\n"))
	allocWithFlow(t, d, pair, "upf")
	ref := api.AttachmentRef{ContainerID: "c1", IfName: "net1"}
	if _, err := d.local.CNICheck(t.Context(), ref); err != nil {
		t.Fatalf("check with the netdev there: %v", err)
	}
	if err := pair.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("xa")
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); netdevOf(t, d, "xa").State != string(agent.StateMissing); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("xa deleted: %+v", netdevOf(t, d, "xa"))
		}
	}
	_, err := d.local.CNICheck(t.Context(), ref)
	if !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "netdev xa is Missing") {
		t.Fatalf("check with the netdev gone: %v; want unavailable, naming it Missing", err)
	}
}
