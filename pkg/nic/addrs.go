package nic

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// maxDumpTries bounds the retries of an address dump the kernel
// interrupted (NLM_F_DUMP_INTR: addresses changed during it).
const maxDumpTries = 5

// Holders returns which of addrs a netdev of the network namespace at
// netnsPath ("" for the caller's) holds, and that netdev's name: the
// addresses whose traffic the namespace's own stack takes (a subnet's
// broadcast address among them, named "<netdev>'s broadcast", an IPv6
// prefix's subnet-router anycast address while the node forwards,
// "<netdev>'s subnet-router anycast", and an address a local route
// holds, "a local route on <netdev>"). It asks the
// kernel each time, so an address added a moment ago counts; only the
// netdevs of addresses asked for are named, so a node with thousands of
// pod veths (each with its link-local address) costs one dump.
func Holders(netnsPath string, addrs []netip.Addr) (map[netip.Addr]string, error) {
	if len(addrs) == 0 {
		return nil, nil
	}
	h, err := Handle(netnsPath)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	var list []netlink.Addr
	for try := 1; ; try++ {
		list, err = h.AddrList(nil, netlink.FAMILY_ALL)
		if !errors.Is(err, netlink.ErrDumpInterrupted) || try == maxDumpTries {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("list the addresses of netns %q: %w", netnsPath, err)
	}
	want := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		want[a.Unmap()] = true
	}
	held := map[netip.Addr]string{}
	// The netdev of each IPv6 prefix whose subnet-router anycast address
	// is asked (the route to it names lo).
	subnetRouter := map[netip.Addr]int{}
	names := map[int]string{}
	name := func(index int) string {
		n, ok := names[index]
		if !ok {
			n = "ifindex " + strconv.Itoa(index)
			if l, err := h.LinkByIndex(index); err == nil {
				n = l.Attrs().Name
			} // else gone since the dump: the address was held, and its ifindex says where
			names[index] = n
		}
		return n
	}
	for _, a := range list {
		if a.IPNet == nil {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP)
		if ok && want[ip.Unmap()] {
			held[ip.Unmap()] = name(a.LinkIndex)
		}
		if ones, bits := a.Mask.Size(); ok && ip.Is6() && !ip.Is4In6() && bits == 128 && ones < 127 {
			if p, err := ip.Prefix(ones); err == nil && want[p.Addr()] {
				subnetRouter[p.Addr()] = a.LinkIndex
			}
		}
		// The subnet's directed broadcast: the stack takes what is sent
		// to it as the node's (and its neighbours').
		if brd, ok := netip.AddrFromSlice(a.Broadcast); ok && want[brd.Unmap()] {
			if _, unicast := held[brd.Unmap()]; !unicast {
				held[brd.Unmap()] = name(a.LinkIndex) + "'s broadcast"
			}
		}
	}
	// A local route holds whole prefixes without an address on any
	// netdev (AnyIP: ip route add local 10.0.0.0/24 dev lo): the stack
	// takes their traffic as the node's too. The kernel's route lookup
	// says so of each address the dump did not find.
	for _, a := range addrs {
		if _, ok := held[a.Unmap()]; ok {
			continue
		}
		routes, err := h.RouteGet(a.Unmap().AsSlice())
		if errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) || errors.Is(err, unix.EINVAL) {
			continue // no route, or none without an output device (link-local): not the node's
		}
		if err != nil {
			return nil, fmt.Errorf("look up the route to %s in netns %q: %w", a, netnsPath, err)
		}
		for _, r := range routes {
			if r.Type == unix.RTN_LOCAL || r.Type == unix.RTN_BROADCAST {
				held[a.Unmap()] = "a local route on " + name(r.LinkIndex)
				break
			}
			// The subnet-router anycast address of an IPv6 prefix of a
			// netdev (the prefix with its host part zero, RFC 4291
			// 2.6.1), which the node answers while it forwards.
			if r.Type == unix.RTN_ANYCAST {
				index, ok := subnetRouter[a.Unmap()]
				if !ok {
					index = r.LinkIndex
				}
				held[a.Unmap()] = name(index) + "'s subnet-router anycast"
				break
			}
		}
	}
	return held, nil
}

// Handle returns a netlink handle in the network namespace at path (""
// for the caller's), for the agent, the daemon and Holders alike. The
// caller closes it.
func Handle(path string) (*netlink.Handle, error) {
	if path == "" {
		h, err := netlink.NewHandle()
		if err != nil {
			return nil, fmt.Errorf("netlink: %w", err)
		}
		return h, nil
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("netns %s: %w", path, err)
	}
	defer func() { _ = ns.Close() }() // the handle's socket keeps the namespace
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink in netns %s: %w", path, err)
	}
	return h, nil
}
