// Package xdp loads xdpq's XDP programs (package bpf) with cilium/ebpf,
// attaches them to netdevs through netlink, reports what a netdev has
// attached and whether it is xdpq's, and manages the XSKMAP, the flow map
// and the counters of a loaded program.
//
// Both programs are in xdp.frags sections (loaded with
// BPF_F_XDP_HAS_FRAGS): drivers with XDP multi-buffer support attach them
// at a jumbo MTU, and a jumbo frame that comes in fragments is redirected
// whole to a socket bound with multi-buffer (xsk.Config.MultiBuffer). A
// kernel before 5.18 refuses the flag; there they are loaded without it,
// as before (and a netdev whose MTU does not fit a buffer refuses them).
//
// Programs are attached through netlink (IFLA_XDP), not a bpf_link, so an
// attached program outlives the process that attached it: the datapath
// does not depend on the daemon being alive. Attach never replaces a
// program that is already there (XDP_FLAGS_UPDATE_IF_NOEXIST), and Detach
// can be told to remove only a given program (XDP_FLAGS_REPLACE with
// IFLA_XDP_EXPECTED_FD), so a foreign program always has precedence.
//
// vishvananda/netlink sets IFLA_XDP only in the caller's network namespace,
// without IFLA_XDP_EXPECTED_FD, and does not report the per-mode program
// ids; this package builds those few messages with its nl package and runs
// them inside the netdev's namespace on a locked OS thread.
package xdp
