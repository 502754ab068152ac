// Package agent keeps the XDP program state of the netdevs xdpq manages
// consistent with the sockets bound on them, and delivers the semantics
// of the direct-receive patch series that upstream never merged:
//
//   - A netdev with at least one bound xdpq socket and no foreign XDP
//     program gets xdpq's program (direct, or filter for software
//     steering). A netdev with no bound socket has no xdpq program, after a
//     linger period (Policy.Linger, else Config.Linger): attaching or
//     detaching makes drivers such as i40e, ice and mlx5 reconfigure their
//     rings, a short outage for the whole NIC, so pod churn must not flap
//     it. Policy.AttachAlways
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
//     none. When the pins are gone but an xdpq program is still attached
//     (bpffs not persisted, another pin directory), it is recognised by
//     name and instruction tag, taken back with its maps, and the maps are
//     pinned again: the pods' sockets are in its XSKMAP.
//
// Set is the one way in: it manages a netdev, or brings a managed one to a
// new policy in place (a config reload), field by field; Status reports
// the policy in force. A change of steering loads the other program on the
// same XSKMAP and swaps it in one step, so the sockets never notice.
// SyncSteering settles the flows after a restart, removing those no owner
// claims; AdoptSteering, for a daemon that could not read all of its
// state, leaves them in place.
//
// Set, Unmanage and the steering calls change a netdev outside the agent's
// lock, holding that netdev's token; the reconciler skips a netdev whose
// token is held and reconciles it when the token comes back.
//
// Policy.Exclusive instead holds the program with a pinned bpf_link:
// the kernel then refuses every other XDP program on the netdev (no
// precedence, no operator override) until the link is removed; the pin
// keeps it across daemon restarts. Use it where nobody else may own the
// hook.
package agent
