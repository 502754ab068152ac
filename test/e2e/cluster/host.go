package cluster

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/xdpq/xdpq/internal/atomicfile"
)

// legacyContainerLogs is where the kubelet links each container's log
// whatever its podLogsDir.
const legacyContainerLogs = "/var/log/containers"

// cniCacheDir is where libcni (in containerd's CRI plugin) caches each
// attachment's result.
const cniCacheDir = "/var/lib/cni/results"

// kubeletSysctls are what the kubelet sets (protectKernelDefaults is
// false) and the bridge plugin (a gateway turns forwarding on), as paths
// under /proc/sys. Stop restores them.
func kubeletSysctls() []string {
	return []string{"kernel/panic_on_oops", "vm/overcommit_memory", "kernel/panic", "net/ipv4/ip_forward"}
}

// cleanHost removes what the node's programs may have left on the host
// once they are stopped, or what a killed run left (atStart): shims of
// the node's containerd, processes and cgroups of pods, mounts under the
// node's directories, the bridge, CNI cache entries, the kubelet's files,
// the node's directory; and it restores the sysctls saved by StartNode.
// It removes no directory while a mount remains under it.
func (n *Node) cleanHost(atStart bool) error {
	if n.ns != nil {
		return n.cleanIsolated()
	}
	var errs []error
	if err := killShims(n.ContainerdSocket); err != nil {
		errs = append(errs, err)
	}
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	if _, err := os.Stat("/sys/fs/cgroup/kubepods"); err == nil {
		roots = append(roots, "/sys/fs/cgroup/kubepods")
	}
	if err := removeCgroups(roots); err != nil {
		errs = append(errs, err)
	}
	mountsLeft := false
	for _, d := range []string{n.KubeletRootDir, n.Dir} {
		if err := unmountUnder(d); err != nil {
			errs = append(errs, err)
			mountsLeft = true
		}
	}
	if l, err := netlink.LinkByName(Bridge); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete bridge %s: %w", Bridge, err))
		}
	}
	if m, err := filepath.Glob(filepath.Join(cniCacheDir, CNINetwork+"-*")); err == nil {
		for _, p := range m {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	errs = append(errs, removeLogLinks(n.path("pod-logs")))
	if err := restoreSysctls(n.path("sysctls.json")); err != nil {
		errs = append(errs, err)
	}
	if !mountsLeft {
		errs = append(errs, n.removeKubeletFiles())
		if err := os.RemoveAll(n.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("node: clean up: %w", err)
	}
	return nil
}

// killShims kills the containerd shims serving the containerd at socket,
// found by their -address argument.
func killShims(socket string) error {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	var pids []int
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
		if !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		if i := slices.Index(args, "-address"); i >= 0 && i+1 < len(args) && args[i+1] == socket {
			pids = append(pids, pid)
		}
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL) // gone already is fine; waitGone checks
	}
	return waitGone(pids)
}

// waitGone waits until the processes pids have exited. The kernel
// notifies only a parent, which the test is not: it polls.
func waitGone(pids []int) error {
	deadline := time.Now().Add(stopTimeout)
	for _, pid := range pids {
		for syscall.Kill(pid, 0) == nil {
			if time.Now().After(deadline) {
				return fmt.Errorf("process %d still runs after SIGKILL", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// cleanIsolated removes what an isolated node's programs may have left
// once they are stopped, or what a killed run left: every process in its
// namespaces, the shims of its containerd, its cgroup root with the
// pods' cgroups, the namespaces with their mounts and links, the
// kubelet's links to its pods' logs, and its directory. The host's
// directories, bridge, sysctls and the first node's cgroups it leaves
// alone: the node has private ones or shares the machine's.
func (n *Node) cleanIsolated() error {
	var errs []error
	// Processes first: a cgroup with one cannot be removed.
	if err := n.ns.kill(); err != nil {
		errs = append(errs, err)
	}
	if err := killShims(n.ContainerdSocket); err != nil {
		errs = append(errs, err)
	}
	roots, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", n.CgroupRoot))
	if err := removeCgroups(roots); err != nil {
		errs = append(errs, err)
	}
	if err := n.ns.destroy(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, removeLogLinks(n.path("pod-logs")))
	if err := unmountUnder(n.Dir); err != nil { // the host has none of its own there, unless a killed run bound one
		errs = append(errs, err)
	} else if err := os.RemoveAll(n.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("node %s: clean up: %w", n.Name, err)
	}
	return nil
}

// makeCgroupRoot makes an isolated node's cgroup root in every
// hierarchy, which its kubelet wants to exist, with the cpus and memory
// nodes of the machine in cpuset's (a new cpuset has none).
func makeCgroupRoot(root string) error {
	hs, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return err
	}
	for _, h := range hs {
		if !h.IsDir() {
			continue
		}
		d := filepath.Join("/sys/fs/cgroup", h.Name(), root)
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("cgroup root: %w", err)
		}
		if h.Name() != "cpuset" {
			continue
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			b, err := os.ReadFile(filepath.Join(filepath.Dir(d), f))
			if err != nil {
				return fmt.Errorf("cgroup root: %w", err)
			}
			if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
				return fmt.Errorf("cgroup root: %w", err)
			}
		}
	}
	return nil
}

// removeCgroups kills what runs in the cgroups under roots (and roots
// themselves) and removes them, deepest first: the first node's kubepods
// in every hierarchy, which only its kubelet makes on this machine, or
// an isolated node's root.
func removeCgroups(roots []string) error {
	var dirs []string
	for _, r := range roots {
		// The function answers every error itself (a directory that went
		// is skipped), so WalkDir returns nil.
		_ = filepath.WalkDir(r, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	var pids []int
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, pid) {
				pids = append(pids, pid)
			}
		}
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL) // gone already is fine; waitGone checks
	}
	if err := waitGone(pids); err != nil {
		return fmt.Errorf("pod cgroups: %w", err)
	}
	// Deepest first: a cgroup with children cannot be removed.
	slices.SortFunc(dirs, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	var errs []error
	for _, d := range dirs {
		if err := rmdirCgroup(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// rmdirCgroup removes an empty cgroup; a killed process leaves its
// cgroup busy for a moment after it is reaped.
func rmdirCgroup(d string) error {
	deadline := time.Now().Add(stopTimeout)
	for {
		err := syscall.Rmdir(d)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mountsUnder returns the mount points at or under dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read-only
	var mps []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mps = append(mps, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	slices.SortStableFunc(mps, func(a, b string) int { return len(b) - len(a) })
	return slices.Compact(mps), nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder unmounts everything mounted at or under dir (a mount a
// process still holds is detached) and checks nothing is left.
func unmountUnder(dir string) error {
	for range 3 { // a mount may hide another at the same point
		mps, err := mountsUnder(dir)
		if err != nil {
			return err
		}
		if len(mps) == 0 {
			return nil
		}
		for _, mp := range mps {
			if err := syscall.Unmount(mp, 0); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				_ = syscall.Unmount(mp, syscall.MNT_DETACH) // what stays, mountsUnder below reports
			}
		}
	}
	mps, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	if len(mps) > 0 {
		return fmt.Errorf("mounts left under %s: %q", dir, mps)
	}
	return nil
}

// removeKubeletFiles removes what the kubelet wrote in its root
// directory. In device-plugins, shared with device plugins of other
// programs, it removes only the kubelet's socket and checkpoint.
func (n *Node) removeKubeletFiles() error {
	entries, err := os.ReadDir(n.KubeletRootDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if e.Name() == "device-plugins" {
			continue
		}
		errs = append(errs, os.RemoveAll(filepath.Join(n.KubeletRootDir, e.Name())))
	}
	for _, f := range []string{"kubelet.sock", "kubelet_internal_checkpoint"} {
		if err := os.Remove(filepath.Join(n.KubeletRootDir, "device-plugins", f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeLogLinks removes the kubelet's links in /var/log/containers to
// logs under podLogs, and the directory if that empties it.
func removeLogLinks(podLogs string) error {
	var errs []error
	entries, err := os.ReadDir(legacyContainerLogs)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	left := 0
	for _, e := range entries {
		p := filepath.Join(legacyContainerLogs, e.Name())
		if t, err := os.Readlink(p); err == nil && strings.HasPrefix(t, podLogs+"/") {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		left++
	}
	if left == 0 {
		if err := os.Remove(legacyContainerLogs); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// saveSysctls writes the values of kubeletSysctls to path.
func saveSysctls(path string) error {
	vals := map[string]string{}
	for _, s := range kubeletSysctls() {
		b, err := os.ReadFile(filepath.Join("/proc/sys", s))
		if err != nil {
			return fmt.Errorf("save sysctls: %w", err)
		}
		vals[s] = strings.TrimSpace(string(b))
	}
	b, err := json.Marshal(vals)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return atomicfile.WriteFile(path, b, 0o644)
}

// restoreSysctls sets the sysctls saved at path and removes the file.
func restoreSysctls(path string) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var vals map[string]string
	if err := json.Unmarshal(b, &vals); err != nil {
		return fmt.Errorf("restore sysctls: %s: %w", path, err)
	}
	var errs []error
	for s, v := range vals {
		if err := os.WriteFile(filepath.Join("/proc/sys", s), []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", strings.ReplaceAll(s, "/", "."), v, err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return os.Remove(path)
}
