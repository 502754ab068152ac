package cni

import (
	"net/netip"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/xdpq/xdpq/internal/traffic"
	xdpqclient "github.com/xdpq/xdpq/pkg/client"
)

// TestAttachmentTraffic is the attachment the way a pod uses it: after
// ADD, the pod's sockets receive its flow (udp to its IPAM address, port
// 2152) byte for byte on both queues and nothing else sent beside it
// (another port, another address); after DEL, the same flow no longer
// reaches the pod.
func TestAttachmentTraffic(t *testing.T) {
	n := startNode(t)
	args := &skel.CmdArgs{ContainerID: "upf-1", Netns: n.pair.NSPath(), IfName: "net1",
		Args: "XDPQ_ALLOCATION=" + n.alloc, StdinData: n.conf("1.1.0")}
	r, _, err := testutils.CmdAddWithArgs(args, func() error { return CmdAdd(args) })
	if err != nil {
		t.Fatal(err)
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		t.Fatal(err)
	}
	podIP, _ := netip.AddrFromSlice(res.IPs[0].Address.IP.To4())

	lease, err := xdpqclient.Connect(n.broker, xdpqclient.Options{Name: "upf", Ring: 256, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Close()
	recv := make([]*traffic.Receiver, len(lease.Sockets))
	for i, s := range lease.Sockets {
		if recv[i], err = traffic.NewReceiver(s, lease.RXFrames(i)); err != nil {
			t.Fatal(err)
		}
	}

	mine := sendMixed(t, n, podIP, 50)
	for i, q := range lease.Queues {
		if err := recv[i].Expect(mine[q], time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("queue %d: %v", q, err)
		}
	}
	// Nothing else arrives: every neighbour frame went to the kernel.
	for i, q := range lease.Queues {
		if extra, _ := recv[i].Receive(-1, time.Now().Add(200*time.Millisecond), func([]byte) error { return nil }); extra != 0 {
			t.Errorf("queue %d: %d frames that are not the pod's flow", q, extra)
		}
	}

	if err := testutils.CmdDelWithArgs(args, func() error { return CmdDel(args) }); err != nil {
		t.Fatal(err)
	}
	sendMixed(t, n, podIP, 20)
	for i, q := range lease.Queues {
		if got, _ := recv[i].Receive(-1, time.Now().Add(300*time.Millisecond), func([]byte) error { return nil }); got != 0 {
			t.Errorf("queue %d: the pod still receives %d frames after DEL", q, got)
		}
	}
}
