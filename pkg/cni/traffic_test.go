package cni

import (
	"net/netip"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/traffic"
	xdpqclient "github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/xsk"
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

	// The sender: one socket per queue of xb; what it sends on queue k
	// arrives on xa's queue k.
	p := n.pair
	umem, senders, err := xsk.Open(xsk.Netdev{Name: p.B.Name, Ifindex: p.B.Index, NetNS: p.NSPath()}, []uint32{0, 1}, 512,
		xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: xsk.Rings{Fill: 64, Completion: 256, TX: 256}})
	if err != nil {
		t.Fatal(err)
	}
	defer umem.Close()
	tx := make([]*traffic.Sender, len(senders))
	for i, s := range senders {
		defer s.Close()
		addrs := make([]uint64, 256)
		for j := range addrs {
			addrs[j] = umem.FrameAddr(i*256 + j)
		}
		tx[i] = traffic.NewSender(s, addrs, 0)
	}
	build := func(q int, seq uint64, dst netip.Addr, port uint16) []byte {
		f, err := frame.Spec{SrcMAC: p.B.MAC, DstMAC: p.A.MAC, Src: p.B.Addr, Dst: dst, Protocol: 17,
			SrcPort: 40000, DstPort: port, Payload: frame.Payload(uint32(q), seq, 48)}.Build()
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	other := netip.MustParseAddr("10.77.1.9")
	// send interleaves the pod's flow with its two neighbours and returns
	// the pod's frames.
	send := func(q int, count int) [][]byte {
		var all, mine [][]byte
		for j := range count {
			f := build(q, uint64(3*j), podIP, 2152)
			mine = append(mine, f)
			all = append(all, f, build(q, uint64(3*j+1), podIP, 2153), build(q, uint64(3*j+2), other, 2152))
		}
		if err := tx[q].Send(all, time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		return mine
	}
	for i, q := range lease.Queues {
		want := send(int(q), 50)
		if err := recv[i].Expect(want, time.Now().Add(5*time.Second)); err != nil {
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
	for i, q := range lease.Queues {
		send(int(q), 20)
		if got, _ := recv[i].Receive(-1, time.Now().Add(300*time.Millisecond), func([]byte) error { return nil }); got != 0 {
			t.Errorf("queue %d: the pod still receives %d frames after DEL", q, got)
		}
	}
}
