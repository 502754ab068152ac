// Package nic discovers the netdevs xdpq can pool: name, ifindex, driver,
// PCI address and ids, NUMA node, queue count, and the XDP features the
// driver reports (native XDP, redirect, AF_XDP zero-copy).
//
// Hardware facts come from sysfs under a root that tests point at a fake
// tree (t.TempDir()); XDP features come from the kernel's "netdev" generic
// netlink family (Linux 6.3 and later) through mdlayher/genetlink. Which
// addresses the netdevs of a namespace hold (Holders) comes from an
// rtnetlink address dump.
package nic
