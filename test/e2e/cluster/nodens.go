package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// nsFileDir holds the bound namespace files of isolated nodes' mount
// namespaces. unshare(1) binds a mount namespace's file only on a mount
// that is not shared: the directory is bound onto itself, private.
const nsFileDir = "/run/xdpq-e2e/ns"

// nodePrivateDirs are the host's directories an isolated node has a
// private copy of (from Dir/nsroot/<base>), where programs on any node
// find them at fixed paths: the kubelet's root (device plugins, plugin
// registration, pod resources), xdpq's API socket and lock, CDI specs,
// network namespaces, the device-info files, containerd's shim sockets
// and libcni's cache.
var nodePrivateDirs = []string{
	DefaultKubeletRootDir, "/run/xdpq", "/run/cdi", "/etc/cdi", "/run/netns",
	"/run/k8s.cni.cncf.io", "/run/containerd", "/var/lib/cni",
}

// nodeNS is an isolated node's network and mount namespaces, kind's node
// container without a container: the network namespace has eth0 on the
// cluster's network (and whatever the node's CNI adds); the mount
// namespace has a sysfs of that network namespace (its own links), a
// bpffs of its own, and private copies of nodePrivateDirs. The rest of
// the host's file system (the binaries, /proc, /dev, the cgroupfs, /tmp,
// the node's Dir) is shared.
type nodeNS struct {
	// Netns and Mnt are the bound namespace files.
	Netns, Mnt string
	// HostVeth is the host's end of eth0, on the network's bridge.
	HostVeth string
}

// nsNames returns the namespace files and host veth name of the node
// whose directory is dir and whose address is ip.
func nsNames(dir string, ip netip.Addr) *nodeNS {
	b := "xdpq-e2e-" + filepath.Base(dir)
	return &nodeNS{
		Netns:    filepath.Join("/run/netns", b),
		Mnt:      filepath.Join(nsFileDir, b+".mnt"),
		HostVeth: fmt.Sprintf("xdpqe2ew%d", ip.As4()[3]),
	}
}

// newNodeNS makes the namespaces of the node in dir, with eth0 at ip in
// nw, the default route through the host, and alias (if not "") showing
// dir: a path of the host's that is the node's own Dir inside.
func newNodeNS(ctx context.Context, dir string, nw *Network, ip netip.Addr, alias string) (_ *nodeNS, err error) {
	s := nsNames(dir, ip)
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("node namespaces: %w", err), s.destroy())
		}
	}()
	if err := privateDir(nsFileDir); err != nil {
		return nil, err
	}
	for _, f := range []string{s.Netns, s.Mnt} {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			return nil, err
		}
	}
	// A sysfs belongs to the network namespace of its mounter: the script
	// runs in the new one. /sys is made of a new sysfs, the host's
	// cgroupfs bound in and a new bpffs, shared, as the chart's
	// HostToContainer mounts want; then each private directory.
	root := filepath.Join(dir, "nsroot")
	sys := filepath.Join(root, "sys")
	script := []string{
		"mkdir -p " + shq(sys),
		"mount -t sysfs sysfs " + shq(sys),
		"mount --rbind /sys/fs/cgroup " + shq(sys+"/fs/cgroup"),
		"mount -t bpf bpf " + shq(sys+"/fs/bpf"),
		// The host's sysfs and what is under it (its bpffs) go, or a
		// lookup of /sys/fs/bpf would find them below the new ones.
		"umount -l /sys",
		"mount --move " + shq(sys) + " /sys",
		"mount --make-shared /sys/fs/bpf",
	}
	// The new mount namespace has a copy of every host mount, the first
	// node's among them (its pods' volumes, its containers' overlays, its
	// namespaces' files): those at or under the directories the node gets
	// its own of, and under the nodes' directories (dir's parent), go
	// first, deepest first, or a program there would find the first
	// node's mount at a path below its own (containerd reads the
	// propagation of /run/netns from the first mount it finds there). A
	// mount listed twice, or under one detached before it, is gone when
	// its turn comes: what is left the node's tests look for.
	own := append(slices.Clone(nodePrivateDirs), alias, filepath.Dir(dir))
	var pats []string
	for _, d := range own {
		if d != "" {
			pats = append(pats, shq(d), shq(d)+"/*")
		}
	}
	script = append(script, "findmnt -rn -o TARGET | while read -r m; do case \"$m\" in "+strings.Join(pats, "|")+
		") echo \"$m\";; esac; done | sort -r | while read -r m; do umount -l \"$m\" 2>/dev/null || :; done")
	for _, d := range nodePrivateDirs {
		src := filepath.Join(root, strings.ReplaceAll(strings.Trim(d, "/"), "/", "_"))
		script = append(script, "mkdir -p "+shq(src)+" "+shq(d), "mount --bind "+shq(src)+" "+shq(d))
	}
	script = append(script, "mount --make-shared /run/netns")
	if alias != "" {
		script = append(script, "mkdir -p "+shq(alias), "mount --bind "+shq(dir)+" "+shq(alias))
	}
	cmd := exec.CommandContext(ctx, "unshare", "--net="+s.Netns, "--mount="+s.Mnt, "--propagation=private",
		"--", "/bin/sh", "-ec", strings.Join(script, "\n"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("unshare: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return s, s.link(nw, ip)
}

// link makes eth0 in the node's network namespace, its host end on the
// network's bridge, lo and eth0 up with ip and a default route through
// the host.
func (s *nodeNS) link(nw *Network, ip netip.Addr) error {
	nsh, err := ns.GetNS(s.Netns)
	if err != nil {
		return err
	}
	defer func() { _ = nsh.Close() }() // a namespace's descriptor
	if err := deleteLink(s.HostVeth); err != nil {
		return err
	}
	br, err := netlink.LinkByName(nw.Bridge)
	if err != nil {
		return err
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: s.HostVeth, MasterIndex: br.Attrs().Index},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(nsh.Fd())),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s: %w", s.HostVeth, err)
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		return fmt.Errorf("%s up: %w", s.HostVeth, err)
	}
	return nsh.Do(func(ns.NetNS) error {
		for _, name := range []string{"lo", "eth0"} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return fmt.Errorf("%s up: %w", name, err)
			}
			if name != "eth0" {
				continue
			}
			addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(nw.Prefix.Bits(), 32)}}
			if err := netlink.AddrAdd(l, addr); err != nil {
				return fmt.Errorf("eth0 address %s: %w", ip, err)
			}
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: nw.Host.AsSlice()}); err != nil {
				return fmt.Errorf("default route via %s: %w", nw.Host, err)
			}
		}
		return nil
	})
}

// wrap returns the command line that runs path with args inside the
// namespaces: nsenter without a fork (-F), so that the program keeps the
// pid, process group and parent-death signal the caller gives it.
func (s *nodeNS) wrap(path string, args []string) (string, []string) {
	return "nsenter", append([]string{"-F", "--net=" + s.Netns, "--mount=" + s.Mnt, "--", path}, args...)
}

// pids returns the processes in the node's mount or network namespace.
func (s *nodeNS) pids() []int {
	var inos []uint64
	for _, f := range []string{s.Mnt, s.Netns} {
		var st syscall.Stat_t
		if syscall.Stat(f, &st) == nil && st.Dev != 0 {
			inos = append(inos, st.Ino)
		}
	}
	if len(inos) == 0 {
		return nil
	}
	entries, _ := os.ReadDir("/proc") // none read: none found, and the caller finds the namespace busy
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		for _, kind := range []string{"mnt", "net"} {
			var st syscall.Stat_t
			if syscall.Stat(filepath.Join("/proc", e.Name(), "ns", kind), &st) != nil {
				continue
			}
			if slices.Contains(inos, st.Ino) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// kill kills what runs in the namespaces and waits until it is gone.
func (s *nodeNS) kill() error {
	pids := s.pids()
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL) // gone already is fine; waitGone checks
	}
	if err := waitGone(pids); err != nil {
		return fmt.Errorf("node namespaces: %w", err)
	}
	return nil
}

// destroy kills what runs in the namespaces and removes them: the mount
// namespace takes its mounts (sysfs, bpffs and pins, the private
// directories, containers' overlays) with it, the network namespace its
// links. What a killed run left is removed the same way.
func (s *nodeNS) destroy() error {
	var errs []error
	if err := s.kill(); err != nil {
		errs = append(errs, err)
	}
	// The host's end first: a network namespace is freed after its last
	// user, and its links with it, a moment later.
	if err := deleteLink(s.HostVeth); err != nil {
		errs = append(errs, err)
	}
	for _, f := range []string{s.Mnt, s.Netns} {
		if err := syscall.Unmount(f, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", f, err))
		}
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// privateDir makes dir a mount of its own, private: bound onto itself
// unless it is a mount point already.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	mps, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	bound := false
	for _, mp := range mps {
		bound = bound || mp == dir
	}
	if !bound {
		if err := syscall.Mount(dir, dir, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s: %w", dir, err)
		}
	}
	if err := syscall.Mount("", dir, "", syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make %s private: %w", dir, err)
	}
	return nil
}

// shq quotes s for sh.
func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Exec runs a program on the node, in an isolated node's namespaces (the
// first node's are the host's), and returns its combined output; an
// error includes it.
func (n *Node) Exec(ctx context.Context, args ...string) ([]byte, error) {
	path, rest := args[0], args[1:]
	if n.ns != nil {
		path, rest = n.ns.wrap(path, rest)
	}
	out, err := exec.CommandContext(ctx, path, rest...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("node %s: %s: %w: %s", n.Name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}
