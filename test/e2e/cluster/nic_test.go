package cluster

import (
	"bytes"
	"encoding/binary"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/xdpq/xdpq/internal/testing/testnet"
)

// TestNIC adds a NIC of 4 queues: the host side up in the host's
// namespace, the peer up in the traffic namespace, a frame the peer
// sends arrives on the host side; a second NIC of the same name replaces
// it (as after a killed run), and Close removes both sides and the
// namespace.
func TestNIC(t *testing.T) {
	testnet.RequireRoot(t)
	const name = "xdpqe2etest"
	old, err := AddNIC(name, 4)
	if err != nil {
		t.Fatal(err)
	}
	n := AddNICForTest(t, name, 4)
	if _, err := netlink.LinkByIndex(old.Index); err == nil {
		t.Errorf("the first NIC's link (index %d) is still there after a second of its name", old.Index)
	}
	if err := old.Close(); err != nil {
		t.Errorf("close the replaced NIC: %v", err)
	}

	host, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if a := host.Attrs(); a.NumRxQueues != 4 || a.NumTxQueues != 4 || a.Flags&1 == 0 || a.Index != n.Index {
		t.Errorf("host side: %d rx, %d tx queues, flags %v, index %d; want 4, 4, up, %d", a.NumRxQueues, a.NumTxQueues, a.Flags, a.Index, n.Index)
	}
	err = n.PeerNS.Do(func(ns.NetNS) error {
		peer, err := netlink.LinkByName(n.Peer)
		if err != nil {
			return err
		}
		if a := peer.Attrs(); a.NumRxQueues != 4 || a.NumTxQueues != 4 || a.Flags&1 == 0 {
			t.Errorf("peer: %d rx, %d tx queues, flags %v; want 4, 4, up", a.NumRxQueues, a.NumTxQueues, a.Flags)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	checkFrame(t, n)

	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	var nf netlink.LinkNotFoundError
	if _, err := netlink.LinkByName(name); !errors.As(err, &nf) {
		t.Errorf("%s after Close: %v, want not found", name, err)
	}
}

// checkFrame sends a frame of a local experimental EtherType from n's
// peer and checks it arrives on n, in n's namespace.
func checkFrame(t *testing.T, n *NIC) {
	t.Helper()
	var peerIndex int
	err := n.PeerNS.Do(func(ns.NetNS) error {
		peer, err := netlink.LinkByName(n.Peer)
		if err != nil {
			return err
		}
		peerIndex = peer.Attrs().Index
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	const etherType = 0x88b5
	var rx int
	err = n.Do(func() error { // a socket stays in the namespace it was made in
		var err error
		rx, err = syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, int(htons(etherType)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(rx)
	if err := syscall.Bind(rx, &syscall.SockaddrLinklayer{Protocol: htons(etherType), Ifindex: n.Index}); err != nil {
		t.Fatal(err)
	}
	tv := syscall.NsecToTimeval(int64(5 * time.Second))
	if err := syscall.SetsockoptTimeval(rx, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	frame := append(append(append([]byte{}, n.MAC...), n.PeerMAC...), byte(etherType>>8), byte(etherType&0xff))
	frame = append(frame, []byte("xdpq e2e nic")...)
	for len(frame) < 60 {
		frame = append(frame, 0)
	}
	err = n.PeerNS.Do(func(ns.NetNS) error {
		tx, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer syscall.Close(tx)
		return syscall.Sendto(tx, frame, 0, &syscall.SockaddrLinklayer{Ifindex: peerIndex, Halen: 6})
	})
	if err != nil {
		t.Fatalf("send from the peer: %v", err)
	}
	buf := make([]byte, 2048)
	got, _, err := syscall.Recvfrom(rx, buf, 0)
	if err != nil {
		t.Fatalf("receive on %s: %v", n.Name, err)
	}
	if !bytes.Equal(buf[:got], frame) {
		t.Errorf("received %x, sent %x", buf[:got], frame)
	}
}

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}
