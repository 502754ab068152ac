package daemon

// Capabilities are the capabilities the daemon needs, by name as in
// capabilities(7) without "CAP_", each with its reason. The chart's
// DaemonSet adds exactly these to an unprivileged container, and
// TestCapabilities measures them: the daemon does all its work with these
// alone, and fails at some of it without any one.
//
// CAP_BPF is not among them: CAP_SYS_ADMIN, needed anyway, gives what it
// would (the kernel's bpf_capable). Neither are CAP_DAC_OVERRIDE and
// CAP_FOWNER (root owns every directory the daemon writes in and every
// file whose mode it sets) nor CAP_KILL (a peer's liveness is read from
// its pidfd, not signalled).
var Capabilities = map[string]string{
	"net_admin":  "attach XDP programs, load programs of XDP type and create XSKMAPs, ethtool steering, move netdevs between namespaces",
	"net_raw":    "create AF_XDP sockets (the pod gets them bound, and needs no capability)",
	"ipc_lock":   "register a pod's memfd as UMEM: the kernel pins its pages, and charges them to the daemon's locked-memory limit without it",
	"sys_admin":  "enter pods' network namespaces (setns) and mount sysfs there, for CNI ADD and netdev-mode pools; create BPF maps and load programs",
	"chown":      "give a standalone allocation's socket to the uid that may connect",
	"sys_ptrace": "open other processes' network namespaces: a DRA netdev claim's pod sandbox's (/proc/<pid>/ns/net) where the runtime mounts pods' namespaces out of the daemon's sight (containerd's netns_mounts_under_state_dir), and pid 1's (where the kernel returns a netdev-mode pool's netdev when its pod's namespace goes) when the daemon is not in the initial namespace itself or the kernel does not give that namespace its fixed inode",
}
