package daemon

import (
	"context"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// dpdkClient does what DPDK's af_xdp driver does with use_cni=1 (libxdp
// with program loading inhibited): the device plugin handshake on the
// allocation's socket for the netdev's XSKMAP, a socket of its own bound
// to queue of ifname in the pod's namespace, inserted into the map; then
// /fin and the connection closes, as DPDK's does. It returns a receiver
// on its socket.
func dpdkClient(t *testing.T, socket string, pod ns.NetNS, ifname string, queue uint32) *traffic.Receiver {
	t.Helper()
	c, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(c)
	if err := unix.Connect(c, &unix.SockaddrUnix{Name: socket}); err != nil {
		t.Fatal(err)
	}
	ask := func(cmd string) (string, int) {
		t.Helper()
		if _, err := unix.Write(c, []byte(cmd)); err != nil {
			t.Fatal(err)
		}
		buf, oob := make([]byte, 128), make([]byte, unix.CmsgSpace(4))
		n, oobn, _, _, err := unix.Recvmsg(c, buf, oob, 0)
		if err != nil {
			t.Fatal(err)
		}
		fd := -1
		if msgs, _ := unix.ParseSocketControlMessage(oob[:oobn]); len(msgs) == 1 {
			if fds, _ := unix.ParseUnixRights(&msgs[0]); len(fds) == 1 {
				fd = fds[0]
			}
		}
		return string(buf[:n]), fd
	}
	for cmd, want := range map[string]string{"/connect,pod": "/host_ok", "/version": "0.1"} {
		if r, _ := ask(cmd); r != want {
			t.Fatalf("%s: %q, want %q", cmd, r, want)
		}
	}
	r, mapFD := ask("/xsk_map_fd," + ifname)
	if r != "/fd_ack" || mapFD < 0 {
		t.Fatalf("/xsk_map_fd,%s: %q", ifname, r)
	}
	m, err := ebpf.NewMapFromFD(mapFD)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var ifindex int
	if err := pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ifname)
		if err == nil {
			ifindex = l.Attrs().Index
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	umem, socks, err := xsk.Open(xsk.Netdev{Name: ifname, Ifindex: ifindex, NetNS: pod.Path()}, []uint32{queue}, 256,
		xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: xsk.Rings{Fill: 256, Completion: 64, RX: 256}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { socks[0].Close(); umem.Close() })
	if err := m.Update(queue, uint32(socks[0].FD()), ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if r, _ := ask("/fin"); r != "/fin_ack" {
		t.Fatalf("/fin: %q", r)
	}
	addrs := make([]uint64, 256)
	for i := range addrs {
		addrs[i] = umem.FrameAddr(i)
	}
	rcv, err := traffic.NewReceiver(socks[0], addrs)
	if err != nil {
		t.Fatal(err)
	}
	return rcv
}

// TestDPDKNetdevPool: DPDK in a netdev-mode pool with the defaults
// (attach: when-bound). Before the handshake the netdev in the pod has no
// program; once the map is handed out xdpq's program is attached and
// stays so after the handshake's connection closed, so the socket DPDK
// inserted receives, byte for byte, also across a daemon restart. DEL
// brings the netdev back to the node without the program. (Before, the
// program was attached only while an xdpq-bound socket existed, and DPDK
// received nothing.)
func TestDPDKNetdevPool(t *testing.T) {
	pair := testnet.NewPair(t, 2)
	dir := t.TempDir()
	o := standaloneOpts(t, pair, dir, testPins(t), "pools: [{name: vf, mode: netdev, devices: {netdevs: [xa]}}]\n")
	d, stop := runDaemon(t, o)
	ctx := context.Background()
	a, err := d.Alloc(ctx, api.AllocRequest{Pool: "vf", Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer testutils.UnmountNS(pod)
	defer pod.Close()
	ref := api.AttachmentRef{ContainerID: "c1", IfName: "net1"}
	if _, err := d.CNIAdd(ctx, api.CNIAddRequest{ContainerID: ref.ContainerID, IfName: ref.IfName, Netns: pod.Path(), Allocation: a.ID}); err != nil {
		t.Fatal(err)
	}
	if n := netdevOf(t, d, "xa"); n.State != "None" {
		t.Errorf("the netdev in the pod before any handshake: %+v, want no program", n)
	}

	rcv := dpdkClient(t, a.Socket, pod, "net1", 0)
	if n := netdevOf(t, d, "xa"); n.State != "Direct" {
		t.Errorf("the netdev in the pod after the handshake: %+v, want xdpq's program", n)
	}
	if err := rcv.Expect(sendFrames(t, pair, 100)[0], time.Now().Add(5*time.Second)); err != nil {
		t.Fatalf("DPDK's socket: %v", err)
	}

	stop()
	d, _ = runDaemon(t, o)
	if err := rcv.Expect(sendFrames(t, pair, 100)[0], time.Now().Add(5*time.Second)); err != nil {
		t.Fatalf("DPDK's socket after a daemon restart: %v", err)
	}
	if n := netdevOf(t, d, "xa"); n.State != "Direct" {
		t.Errorf("the netdev in the pod after the restart: %+v, want xdpq's program", n)
	}
	// The probe of busy queues would keep the program too, while DPDK's
	// socket exists: the record is what keeps it whatever DPDK does.
	if att, _ := d.ledger.Attachment("c1/net1"); !att.MapOut {
		t.Error("the attachment's record lost that its map was handed out")
	}
	if pn := d.pod("xa"); pn == nil || !pn.policy.AttachAlways {
		t.Error("the restarted daemon's pod agent does not keep the program attached")
	}

	if err := d.CNIDel(ctx, ref); err != nil {
		t.Fatal(err)
	}
	att, err := xdp.Query(pair.NSPath(), pair.A.Index)
	if err != nil || att != nil {
		t.Errorf("xa back on the node with a program: %+v %v", att, err)
	}
}
