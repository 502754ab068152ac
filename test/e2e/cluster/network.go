package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
)

// The cluster's network (Options.Network): kind's docker network,
// without Docker.
const (
	// NetworkBridge is the host's bridge that nodes in namespaces of
	// their own join.
	NetworkBridge = "xdpqe2enet"
	// networkLockDir names the network's lock, .network.lock beside the
	// nodes' directories: one cluster network on a machine.
	networkLockDir = "/var/lib/xdpq-e2e/network"
)

// NetworkPrefix is the cluster network's range: the host (the control
// plane and the first node) is its first address, each isolated node
// the next one free.
var NetworkPrefix = netip.MustParsePrefix("10.250.0.0/24")

// Network is the cluster's network: a bridge on the host with the host's
// address, the control plane's and the first node's, which each isolated
// node joins by a veth from its own network namespace.
type Network struct {
	// Bridge is the host's bridge, NetworkBridge.
	Bridge string
	// Prefix is the network's range, NetworkPrefix.
	Prefix netip.Prefix
	// Host is the host's address on Bridge: the apiserver listens on it,
	// the first node's kubelet too.
	Host netip.Addr

	lock *os.File     // the network's lock, held until stop
	mu   sync.Mutex   // guards used
	used []netip.Addr // node addresses given, Host first
}

// startNetwork takes the network's lock (waiting for another cluster
// that holds it until ctx ends), removes a bridge a killed run left and
// makes the bridge with the host's address.
func startNetwork(ctx context.Context, log io.Writer) (nw *Network, err error) {
	if err := os.MkdirAll(filepath.Dir(networkLockDir), 0o755); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	lock, err := lockDir(ctx, networkLockDir, "network", log)
	if err != nil {
		return nil, err
	}
	nw = &Network{Bridge: NetworkBridge, Prefix: NetworkPrefix, Host: NetworkPrefix.Addr().Next(), lock: lock}
	nw.used = []netip.Addr{nw.Host}
	defer func() {
		if err != nil {
			err = errors.Join(err, nw.stop())
		}
	}()
	if err := deleteLink(nw.Bridge); err != nil {
		return nil, fmt.Errorf("network: a killed run's bridge: %w", err)
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: nw.Bridge}}
	if err := netlink.LinkAdd(br); err != nil {
		return nil, fmt.Errorf("network: add bridge %s: %w", nw.Bridge, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: nw.Host.AsSlice(), Mask: net.CIDRMask(nw.Prefix.Bits(), 32)}}
	if err := netlink.AddrAdd(br, addr); err != nil {
		return nil, fmt.Errorf("network: address %s on %s: %w", nw.Host, nw.Bridge, err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return nil, fmt.Errorf("network: %s up: %w", nw.Bridge, err)
	}
	return nw, nil
}

// take gives the next free address of the network to a node.
func (nw *Network) take() (netip.Addr, error) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	for a := nw.Host.Next(); nw.Prefix.Contains(a); a = a.Next() {
		if !slices.Contains(nw.used, a) {
			nw.used = append(nw.used, a)
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("network: no address left in %s", nw.Prefix)
}

// release gives a node's address back.
func (nw *Network) release(a netip.Addr) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if i := slices.Index(nw.used, a); i > 0 { // the host's stays
		nw.used = slices.Delete(nw.used, i, i+1)
	}
}

// stop deletes the bridge, unbinds the directory of isolated nodes'
// namespace files when none is left in it, and releases the network's
// lock.
func (nw *Network) stop() error {
	err := deleteLink(nw.Bridge)
	if entries, rerr := os.ReadDir(nsFileDir); rerr == nil && len(entries) == 0 {
		if uerr := syscall.Unmount(nsFileDir, 0); uerr != nil && !errors.Is(uerr, syscall.EINVAL) {
			err = errors.Join(err, fmt.Errorf("unmount %s: %w", nsFileDir, uerr))
		}
	}
	if nw.lock != nil {
		_ = nw.lock.Close() // a lock file, never written; closing releases the lock
		nw.lock = nil
	}
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	return nil
}

// deleteLink deletes the host's link name, if there is one.
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}
