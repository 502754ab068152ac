package xsk_test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testing/handover"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// The handover test runs this test binary a second time as the "pod":
// uid 65534, no capabilities, in a new network namespace holding only lo,
// talking to the test over a SOCK_SEQPACKET socket on fd 3.
const childEnv = "XDPQ_XSK_TEST_CHILD"

const (
	childFrames    = 4096
	framesPerQueue = 1024 // each queue: this many to fill, this many to transmit
	perQueue       = 1000 // frames each way per queue
)

var childRings = xsk.Rings{Fill: 1024, Completion: 1024, RX: 1024, TX: 1024}

func pattern(src, dst net.HardwareAddr, s, d netip.Addr, id uint32, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		b, err := frame.Spec{SrcMAC: src, DstMAC: dst, Src: s, Dst: d, Protocol: 17,
			SrcPort: 9, DstPort: uint16(7000 + id), Payload: frame.Payload(id, uint64(i), 100)}.Build()
		if err != nil {
			panic(err)
		}
		out[i] = b
	}
	return out
}

// TestHandoverToUnprivilegedProcess is the core promise of xdpq: a process
// with no privileges receives bound AF_XDP sockets for 2 queues, sharing a
// UMEM it allocated itself, and receives and transmits byte-exact. It
// cannot re-bind them or create its own, and when it exits the kernel
// clears its XSKMAP entries and frees the queues.
func TestHandoverToUnprivilegedProcess(t *testing.T) {
	p := testnet.NewPair(t, 4)
	nsPath := p.NSPath()
	queues := []uint32{0, 1}

	// The direct program on A (the NIC the pod gets) and on B, where the
	// test receives what the pod transmits.
	progs := map[int]*xdp.Program{}
	for _, ifindex := range []int{p.A.Index, p.B.Index} {
		prog, err := xdp.Load(xdp.Direct, xdp.LoadOptions{Queues: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { prog.Close() })
		if _, err := xdp.Attach(nsPath, ifindex, prog.Prog(), xdp.ModeNative); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { xdp.Detach(nsPath, ifindex, xdp.ModeNative, prog.Prog()) })
		progs[ifindex] = prog
	}
	devA := xsk.Netdev{Name: p.A.Name, Ifindex: p.A.Index, NetNS: nsPath}
	devB := xsk.Netdev{Name: p.B.Name, Ifindex: p.B.Index, NetNS: nsPath}
	bumem, bsocks, err := xsk.Open(devB, queues, 4096, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: childRings})
	if err != nil {
		t.Fatal(err)
	}
	defer bumem.Close()
	var brecv []*traffic.Receiver
	var bsend []*traffic.Sender
	for i, s := range bsocks {
		defer s.Close()
		r, err := traffic.NewReceiver(s, frameRange(bumem, 2*i*framesPerQueue, framesPerQueue))
		if err != nil {
			t.Fatal(err)
		}
		brecv = append(brecv, r)
		bsend = append(bsend, traffic.NewSender(s, frameRange(bumem, (2*i+1)*framesPerQueue, framesPerQueue), 0))
		if err := progs[p.B.Index].SetSocket(queues[i], s.FD()); err != nil {
			t.Fatal(err)
		}
	}

	// Start the pod.
	var stderr bytes.Buffer
	pod, err := handover.StartPod([]string{"-test.run=^$"}, childEnv+"=pod", nil, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Kill()
	conn := pod.Conn
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\nchild stderr:\n%s", append(args, stderr.String())...)
	}

	// 1. The pod sends the memfd it allocated.
	_, fds, err := handover.Expect(conn, "umem", 1)
	if err != nil || len(fds) != 1 {
		fail("umem: %d fds, %v", len(fds), err)
	}
	memfd := fds[0]
	// 2. The privileged side binds and hands over the sockets.
	bound, err := xsk.Bind(devA, memfd, queues, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: childRings})
	unix.Close(memfd)
	if err != nil {
		fail("bind: %v", err)
	}
	var sockFDs []int
	for _, b := range bound {
		sockFDs = append(sockFDs, b.FD)
	}
	err = handover.Send(conn, handover.Msg{Step: "sockets", Queues: queues, Rings: childRings,
		AMAC: p.A.MAC, BMAC: p.B.MAC, AAddr: p.A.Addr, BAddr: p.B.Addr}, sockFDs...)
	if err != nil {
		fail("send sockets: %v", err)
	}
	// 3. Only once its fill rings are filled do the sockets go in the XSKMAP.
	if _, _, err := handover.Expect(conn, "ready", 0); err != nil {
		fail("%v", err)
	}
	for _, b := range bound {
		if err := progs[p.A.Index].SetSocket(b.Queue, b.FD); err != nil {
			t.Fatal(err)
		}
		unix.Close(b.FD) // an open copy here would keep the socket alive
	}
	// 4. Traffic to the pod.
	for i, q := range queues {
		if err := bsend[i].Send(pattern(p.B.MAC, p.A.MAC, p.B.Addr, p.A.Addr, q, perQueue), time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if err := handover.Send(conn, handover.Msg{Step: "sent"}); err != nil {
		fail("%v", err)
	}
	// 5. The pod reports what it received and transmits back.
	report, _, err := handover.Expect(conn, "report", 0)
	if err != nil {
		fail("%v", err)
	}
	if report.UID != "65534" || strings.Trim(report.CapEff, "0") != "" {
		t.Errorf("the pod was not unprivileged: uid %s, CapEff %s", report.UID, report.CapEff)
	}
	if len(report.Links) != 1 || report.Links[0] != "lo" {
		t.Errorf("the pod's netns holds %v, want only lo", report.Links)
	}
	if len(report.Counts) != len(queues) {
		t.Errorf("pod reported %d queues", len(report.Counts))
	}
	for i, n := range report.Counts {
		if n != perQueue {
			t.Errorf("pod queue %d: received %d of %d byte-exact frames", queues[i], n, perQueue)
		}
	}
	if report.RebindErr != unix.EBUSY.Error() {
		t.Errorf("pod re-binding its socket: %q, want EBUSY", report.RebindErr)
	}
	if report.SocketErr != unix.EPERM.Error() {
		t.Errorf("pod creating an AF_XDP socket: %q, want EPERM", report.SocketErr)
	}
	for i, q := range queues {
		if err := brecv[i].Expect(pattern(p.A.MAC, p.B.MAC, p.A.Addr, p.B.Addr, 100+q, perQueue), time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	// 6. The pod exits; its sockets close.
	if err := handover.Send(conn, handover.Msg{Step: "exit"}); err != nil {
		fail("%v", err)
	}
	if err := pod.Wait(); err != nil {
		fail("pod: %v", err)
	}

	// The XSKMAP entries are gone: the direct program passes the frames to
	// the kernel stack, where a UDP socket gets them.
	var udp *net.UDPConn
	if err := p.NS.Do(func(ns.NetNS) (err error) {
		udp, err = net.ListenUDP("udp4", &net.UDPAddr{IP: p.A.Addr.AsSlice(), Port: 7000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	after := pattern(p.B.MAC, p.A.MAC, p.B.Addr, p.A.Addr, 0, 10)
	if err := bsend[0].Send(after, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	udp.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	for i := range after {
		n, err := udp.Read(buf)
		if err != nil {
			t.Fatalf("after the pod exited, frame %d did not reach the kernel: %v", i, err)
		}
		if !bytes.Equal(buf[:n], after[i][14+20+8:]) {
			t.Fatalf("after the pod exited, datagram %d differs", i)
		}
	}
	// And the queues can be bound again.
	mf, err := xsk.NewMemfd("again", 1<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	defer mf.Close()
	again, err := xsk.Bind(devA, int(mf.Fd()), queues, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: xsk.Rings{Fill: 64, Completion: 64, RX: 64}})
	if err != nil {
		t.Fatalf("queues not free after the pod exited: %v", err)
	}
	for _, b := range again {
		unix.Close(b.FD)
	}
}

func frameRange(u *xsk.UMEM, first, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = u.FrameAddr(first + i)
	}
	return out
}

// childMain is the pod. It reports failures to the parent and by exit code.
func childMain(string) int { return handover.RunPod(30*time.Second, pod) }

func pod(conn *net.UnixConn) error {
	cfg := xsk.UMEMConfig{FrameSize: 2048}
	mf, err := xsk.NewMemfd("pod-umem", childFrames*2048, false)
	if err != nil {
		return err
	}
	umem, err := xsk.MapUMEM(int(mf.Fd()), cfg)
	if err != nil {
		return err
	}
	defer umem.Close()
	if err := handover.Send(conn, handover.Msg{Step: "umem"}, int(mf.Fd())); err != nil {
		return err
	}
	mf.Close()

	m, fds, err := handover.Expect(conn, "sockets", 2)
	if err != nil {
		return err
	}
	if len(fds) != len(m.Queues) {
		return fmt.Errorf("want sockets for %v, got %+v with %d fds", m.Queues, m, len(fds))
	}
	var socks []*xsk.Socket
	var recvs []*traffic.Receiver
	var sends []*traffic.Sender
	for i, fd := range fds {
		s, err := xsk.Adopt(fd, umem, m.Rings)
		if err != nil {
			return err
		}
		defer s.Close()
		socks = append(socks, s)
		r, err := traffic.NewReceiver(s, frameRange(umem, 2*i*framesPerQueue, framesPerQueue))
		if err != nil {
			return err
		}
		recvs = append(recvs, r)
		sends = append(sends, traffic.NewSender(s, frameRange(umem, (2*i+1)*framesPerQueue, framesPerQueue), 0))
	}
	if err := handover.Send(conn, handover.Msg{Step: "ready"}); err != nil {
		return err
	}
	if _, _, err := handover.Expect(conn, "sent", 0); err != nil {
		return err
	}

	rep := handover.Msg{Step: "report"}
	for i, q := range m.Queues {
		want := pattern(m.BMAC, m.AMAC, m.BAddr, m.AAddr, q, perQueue)
		good := 0
		recvs[i].Receive(perQueue, time.Now().Add(5*time.Second), func(b []byte) error {
			if good < len(want) && bytes.Equal(b, want[good]) {
				good++
			}
			return nil
		})
		rep.Counts = append(rep.Counts, uint64(good))
		if err := sends[i].Send(pattern(m.AMAC, m.BMAC, m.AAddr, m.BAddr, 100+q, perQueue), time.Now().Add(5*time.Second)); err != nil {
			return err
		}
	}
	rep.RebindErr = errString(unix.Bind(socks[0].FD(), &unix.SockaddrXDP{Ifindex: 1, QueueID: 2}))
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW, 0)
	if err == nil {
		unix.Close(fd)
	}
	rep.SocketErr = errString(err)
	if err := handover.Identity(&rep); err != nil {
		return err
	}
	if err := handover.Send(conn, rep); err != nil {
		return err
	}
	_, _, err = handover.Expect(conn, "exit", 0)
	return err
}

func errString(err error) string {
	var errno unix.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	if err == nil {
		return "no error"
	}
	return err.Error()
}
