// Package agent keeps the XDP program state of the netdevs xdpq manages
// consistent with the sockets bound on them, and delivers the semantics
// of the direct-receive patch series that upstream never merged:
//
//   - A netdev with at least one bound xdpq socket and no foreign XDP
//     program gets xdpq's program (direct, or filter for software
//     steering). A netdev with no bound socket has no xdpq program, after a
//     linger period (Config.Linger): attaching or detaching makes drivers
//     such as i40e, ice and mlx5 reconfigure their rings, a short outage
//     for the whole NIC, so pod churn must not flap it. Policy.AttachAlways
//     keeps the program on while the netdev is managed.
//   - A foreign program has precedence whenever it appears: the agent never
//     replaces or detaches it, reports the netdev Overridden, and keeps the
//     XSKMAP pinned at <PinDir>/<netdev>/xsks so that the operator's
//     program can redirect into it.
//   - When the foreign program goes, the agent attaches its own again,
//     driven by netlink link notifications (RTM_NEWLINK carries IFLA_XDP);
//     a slow periodic resync is only a safety net.
//   - Programs are attached through netlink, not a bpf_link, so they
//     outlive the daemon: traffic keeps flowing while it restarts. On
//     start the agent loads its program on the maps pinned by its
//     predecessor, adopts an attached xdpq program that uses them, finds
//     the queues that still have sockets (see xsk.BusyQueues; only where
//     a predecessor's XSKMAP is pinned, since a probe leaves the queues
//     busy for a while) and removes the program from netdevs that have
//     none.
//
// Policy.Exclusive instead holds the program with a pinned bpf_link:
// the kernel then refuses every other XDP program on the netdev (no
// precedence, no operator override) until the link is removed; the pin
// keeps it across daemon restarts. Use it where nobody else may own the
// hook.
package agent
