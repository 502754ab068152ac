package cluster

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
)

// NIC is the node's stand-in for a NIC: a veth in the host's network
// namespace, where the node's hostNetwork pods (xdpq's DaemonSet) see it,
// and its peer in a network namespace of its own, the traffic side.
// Frames the peer transmits on its tx queue k arrive on the NIC's rx
// queue k (native XDP). IPv6 is off on both, so no stray neighbour
// discovery frame arrives.
type NIC struct {
	// Name, Index and MAC are the host side's.
	Name  string
	Index int
	MAC   net.HardwareAddr
	// Queues is the number of rx (and tx) queues of each side.
	Queues int
	// Peer and PeerMAC are the traffic side's, in PeerNS.
	Peer    string
	PeerMAC net.HardwareAddr
	PeerNS  ns.NetNS
	// NodeNetns is the bound network namespace file of the isolated node
	// whose NIC this is (AddNICOn), "" for the first node's, in the
	// host's namespace.
	NodeNetns string

	closeOnce sync.Once
	closeErr  error
}

// AddNIC creates a NIC named name (at most 15 bytes; the peer is named
// name+"p" when that fits, "peer" otherwise) with queues rx and tx
// queues on each side, both up. A link of that name left in the host
// namespace by a killed run is removed first. Close removes it.
func AddNIC(name string, queues int) (*NIC, error) {
	return addNIC("", name, queues)
}

// AddNICOn creates a NIC (see AddNIC) of node: in an isolated node's
// network namespace, where its pods see it, in the host's for the first
// node.
func AddNICOn(node *Node, name string, queues int) (*NIC, error) {
	netns := ""
	if node.ns != nil {
		netns = node.ns.Netns
	}
	return addNIC(netns, name, queues)
}

func addNIC(netns, name string, queues int) (*NIC, error) {
	if len(name) == 0 || len(name) > 15 {
		return nil, fmt.Errorf("nic %q: a link name is 1 to 15 bytes", name)
	}
	err := inNetns(netns, func() error {
		if old, err := netlink.LinkByName(name); err == nil {
			if err := netlink.LinkDel(old); err != nil {
				return fmt.Errorf("nic %s: remove a killed run's: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	peerNS, err := testutils.NewNS()
	if err != nil {
		return nil, fmt.Errorf("nic %s: traffic namespace: %w", name, err)
	}
	n := &NIC{Name: name, Queues: queues, Peer: name + "p", PeerNS: peerNS, NodeNetns: netns}
	if len(n.Peer) > 15 {
		n.Peer = "peer"
	}
	if err := inNetns(netns, n.create); err != nil {
		return nil, errors.Join(fmt.Errorf("nic %s: %w", name, err), n.Close())
	}
	return n, nil
}

// create adds the pair in the caller's namespace (the host's or the
// node's), moves the peer into PeerNS and sets both up.
func (n *NIC) create() error {
	// A temporary peer name: the host may already have a link of Peer's.
	tmpPeer := fmt.Sprintf("xdpqtmp%d", os.Getpid()%100000000)
	veth := &netlink.Veth{
		LinkAttrs:       netlink.LinkAttrs{Name: n.Name, NumTxQueues: n.Queues, NumRxQueues: n.Queues},
		PeerName:        tmpPeer,
		PeerNumTxQueues: uint32(n.Queues),
		PeerNumRxQueues: uint32(n.Queues),
		PeerNamespace:   netlink.NsFd(int(n.PeerNS.Fd())),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth: %w", err)
	}
	host, err := netlink.LinkByName(n.Name)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join("/proc/sys/net/ipv6/conf", n.Name, "disable_ipv6"), []byte("1"), 0o644); err != nil {
		return fmt.Errorf("disable IPv6: %w", err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("up: %w", err)
	}
	n.Index, n.MAC = host.Attrs().Index, host.Attrs().HardwareAddr
	return n.PeerNS.Do(func(ns.NetNS) error {
		for _, k := range []string{"all", "default"} {
			if err := os.WriteFile(filepath.Join("/proc/sys/net/ipv6/conf", k, "disable_ipv6"), []byte("1"), 0o644); err != nil {
				return fmt.Errorf("disable IPv6 in the traffic namespace: %w", err)
			}
		}
		peer, err := netlink.LinkByName(tmpPeer)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetName(peer, n.Peer); err != nil {
			return fmt.Errorf("name peer: %w", err)
		}
		if err := netlink.LinkSetUp(peer); err != nil {
			return fmt.Errorf("up peer: %w", err)
		}
		n.PeerMAC = peer.Attrs().HardwareAddr
		return nil
	})
}

// AddNICForTest adds a NIC (see AddNIC) that is removed when the test
// ends.
func AddNICForTest(tb testing.TB, name string, queues int) *NIC {
	tb.Helper()
	return nicForTest(tb, "", name, queues)
}

// AddNICOnForTest adds a NIC of node (see AddNICOn) that is removed when
// the test ends, before the node stops.
func AddNICOnForTest(tb testing.TB, node *Node, name string, queues int) *NIC {
	tb.Helper()
	netns := ""
	if node.ns != nil {
		netns = node.ns.Netns
	}
	return nicForTest(tb, netns, name, queues)
}

func nicForTest(tb testing.TB, netns, name string, queues int) *NIC {
	tb.Helper()
	n, err := addNIC(netns, name, queues)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := n.Close(); err != nil {
			tb.Error(err)
		}
	})
	return n
}

// Close removes the pair and the traffic namespace. It is safe to call
// more than once; every call returns the first one's result.
func (n *NIC) Close() error {
	n.closeOnce.Do(func() { n.closeErr = n.remove() })
	return n.closeErr
}

func (n *NIC) remove() error {
	var errs []error
	// By index: a later NIC of the same name may have replaced this one.
	// A node's namespace gone took its NIC with it.
	if _, err := os.Stat(n.NodeNetns); n.NodeNetns == "" || err == nil {
		errs = append(errs, inNetns(n.NodeNetns, func() error {
			if l, err := netlink.LinkByIndex(n.Index); err == nil && n.Index != 0 && l.Attrs().Name == n.Name {
				if err := netlink.LinkDel(l); err != nil {
					return fmt.Errorf("nic %s: delete: %w", n.Name, err)
				}
			}
			return nil
		}))
	}
	if err := n.PeerNS.Close(); err != nil {
		errs = append(errs, fmt.Errorf("nic %s: close traffic namespace: %w", n.Name, err))
	}
	if err := testutils.UnmountNS(n.PeerNS); err != nil {
		errs = append(errs, fmt.Errorf("nic %s: remove traffic namespace: %w", n.Name, err))
	}
	return errors.Join(errs...)
}

// Do runs f in the NIC's network namespace: its node's, where its
// pods see it.
func (n *NIC) Do(f func() error) error { return inNetns(n.NodeNetns, f) }

// inNetns runs f in the network namespace bound at netns, or in the
// caller's when netns is "".
func inNetns(netns string, f func() error) error {
	if netns == "" {
		return f()
	}
	h, err := ns.GetNS(netns)
	if err != nil {
		return err
	}
	defer func() { _ = h.Close() }() // a namespace's descriptor
	return h.Do(func(ns.NetNS) error { return f() })
}
