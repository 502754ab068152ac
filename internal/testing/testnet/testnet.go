// Package testnet gives tests a veth pair in a fresh network namespace,
// and the checks that privileged tests share: run as root (and never skip
// under CI=true), and leak no file descriptors.
package testnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RequireRoot skips a test that needs root and the kernel, except under
// CI=true, where it fails: CI runs every such test.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		tb.Fatal("this test needs root and a kernel with AF_XDP; CI=true runs it as root")
	}
	tb.Skip("needs root (runs under CI=true)")
}

// RequireTool returns the path of the first of names found (in PATH, or
// as given when absolute). Without any it skips the test, saying which
// Debian package to install, except under CI=true, where it fails: CI
// installs every tool a test needs (.ci/run).
func RequireTool(tb testing.TB, pkg string, names ...string) string {
	tb.Helper()
	for _, n := range names {
		if filepath.IsAbs(n) {
			if _, err := os.Stat(n); err == nil {
				return n
			}
			continue
		}
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	msg := fmt.Sprintf("needs %s (Debian: apt-get install %s)", strings.Join(names, " or "), pkg)
	if os.Getenv("CI") == "true" {
		tb.Fatal(msg + "; .ci/run installs it")
	}
	tb.Skip(msg + " (runs under CI=true)")
	return ""
}

// Link is one end of the pair.
type Link struct {
	Name   string
	Index  int
	queues int
	MAC    net.HardwareAddr
	// Addr is A's IPv4 address; for B, the source address its frames
	// carry, assigned to nothing (a local source would be a martian).
	Addr netip.Addr
}

// Queues returns the link's rx (and tx) queue count.
func (l Link) Queues() int { return l.queues }

// Pair is a veth pair in its own network namespace. Frames B transmits on
// its tx queue k arrive on A's rx queue k (native XDP on A). IPv6 is off in
// the namespace, so no stray neighbour discovery frames appear.
type Pair struct {
	NS ns.NetNS
	A  Link
	B  Link
	// PodAddr is an address on A's subnet that no interface holds: the
	// own address of a queue pool's pod, whose traffic arrives on A. A's
	// own address is the node's, which a pod's flows may not take.
	PodAddr netip.Addr
}

// NSPath returns the path of the pair's network namespace.
func (p *Pair) NSPath() string { return p.NS.Path() }

// NewPair creates a pair (see Create) that is removed when the test ends.
func NewPair(tb testing.TB, queues int) *Pair {
	tb.Helper()
	RequireRoot(tb)
	p, err := Create(queues)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Error(err) // a namespace left mounted outlives the test
		}
	})
	return p
}

// Recreate deletes the veth pair and makes it again in the namespace, as
// a driver reload or an SR-IOV reset re-creates a netdev: the same names,
// MACs, queues and A's address, new ifindexes (A and B say them).
func (p *Pair) Recreate() error {
	return p.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(p.A.Name)
		if err != nil {
			return err
		}
		if err := netlink.LinkDel(l); err != nil {
			return fmt.Errorf("delete %s: %w", p.A.Name, err)
		}
		if err := p.addVeth(p.A.queues); err != nil {
			return fmt.Errorf("veth pair: %w", err)
		}
		return nil
	})
}

// addVeth makes the pair in the current namespace: xa and xb with queues
// rx and tx queues each, both up, 10.99.0.1/24 on xa.
func (p *Pair) addVeth(queues int) error {
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: "xa", NumTxQueues: queues, NumRxQueues: queues,
			HardwareAddr: net.HardwareAddr{0x02, 0x58, 0x44, 0x50, 0x51, 0x01}},
		PeerName: "xb", PeerNumTxQueues: uint32(queues), PeerNumRxQueues: uint32(queues),
		PeerHardwareAddr: net.HardwareAddr{0x02, 0x58, 0x44, 0x50, 0x51, 0x02},
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth: %w", err)
	}
	for i, l := range []*Link{&p.A, &p.B} {
		name := []string{"xa", "xb"}[i]
		link, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		addr := netip.AddrFrom4([4]byte{10, 99, 0, byte(i + 1)})
		if i == 0 {
			nlAddr, _ := netlink.ParseAddr(addr.String() + "/24")
			if err := netlink.AddrAdd(link, nlAddr); err != nil {
				return fmt.Errorf("address %s: %w", name, err)
			}
		}
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("up %s: %w", name, err)
		}
		*l = Link{Name: name, Index: link.Attrs().Index, MAC: link.Attrs().HardwareAddr, Addr: addr, queues: queues}
	}
	return nil
}

// Create makes a network namespace holding veth A and B with queues rx
// and tx queues each, both up, with 10.99.0.1/24 on A (B has no address).
// Close removes it.
func Create(queues int) (*Pair, error) {
	netns, err := testutils.NewNS()
	if err != nil {
		return nil, fmt.Errorf("new netns: %w", err)
	}
	p := &Pair{NS: netns, PodAddr: netip.AddrFrom4([4]byte{10, 99, 0, 7})}
	err = netns.Do(func(ns.NetNS) error {
		for _, k := range []string{"all", "default"} {
			if err := os.WriteFile(filepath.Join("/proc/sys/net/ipv6/conf", k, "disable_ipv6"), []byte("1"), 0o644); err != nil {
				return err
			}
		}
		return p.addVeth(queues)
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("veth pair: %w", err), p.Close())
	}
	return p, nil
}

// SetMTU sets the MTU of both ends (9000 for jumbo frames).
func (p *Pair) SetMTU(mtu int) error {
	return p.NS.Do(func(ns.NetNS) error {
		for _, name := range []string{p.A.Name, p.B.Name} {
			link, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetMTU(link, mtu); err != nil {
				return fmt.Errorf("mtu %d on %s: %w", mtu, name, err)
			}
		}
		return nil
	})
}

// Close removes the namespace and with it the veth pair.
func (p *Pair) Close() error {
	// Closing our handle only drops a reference; the unmount is what
	// removes the namespace.
	_ = p.NS.Close()
	if err := testutils.UnmountNS(p.NS); err != nil {
		return fmt.Errorf("remove netns %s: %w", p.NS.Path(), err)
	}
	return nil
}

// LinkListeners returns the descriptors of this process that are route
// netlink sockets in the pair's namespace subscribed to link
// notifications (RTNLGRP_LINK), as "fd -> socket:[inode]": what an
// agent's event loop holds while it follows the pair's links.
func (p *Pair) LinkListeners() ([]string, error) {
	var table []byte
	err := p.NS.Do(func(ns.NetNS) (err error) {
		// The netlink sockets of the reading thread's namespace.
		table, err = os.ReadFile("/proc/thread-self/net/netlink")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netlink sockets of %s: %w", p.NSPath(), err)
	}
	subscribed := map[string]bool{}
	// sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode; Groups is the
	// hex mask of the first 32 groups, RTNLGRP_LINK (1) its lowest bit.
	for _, line := range strings.Split(string(table), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 || f[1] != strconv.Itoa(unix.NETLINK_ROUTE) {
			continue
		}
		if groups, err := strconv.ParseUint(f[3], 16, 32); err == nil && groups&(1<<(unix.RTNLGRP_LINK-1)) != 0 {
			subscribed["socket:["+f[9]+"]"] = true
		}
	}
	var out []string
	for fd, target := range OpenFDs() {
		if subscribed[target] {
			out = append(out, fd+" -> "+target)
		}
	}
	sort.Strings(out)
	return out, nil
}

// BenchDir is a directory for a benchmark's files: a new one under
// $XDPQ_BENCH_DIR when it is set (a tmpfs, as /run is on a node, where a
// sync costs nothing and the system calls are the cost), else the test's
// own; it is removed when the benchmark ends.
func BenchDir(tb testing.TB, prefix string) string {
	tb.Helper()
	d := os.Getenv("XDPQ_BENCH_DIR")
	if d == "" {
		return tb.TempDir()
	}
	dir, err := os.MkdirTemp(d, prefix)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			tb.Error(err)
		}
	})
	return dir
}

// OpenFDs returns this process's open descriptors with what they point to.
func OpenFDs() map[string]string {
	out := map[string]string{}
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil {
			continue // the directory's own fd, closed by now
		}
		out[e.Name()] = target
	}
	return out
}

// FDsLeftOpen returns the descriptors open now that were not open (or
// were something else) in before, as "fd -> target". Background work of
// the code under test (an agent's event loop opens a namespace and a
// netlink socket for a moment) is not a leak: it looks again for up to
// two seconds, until nothing new stays open.
func FDsLeftOpen(before map[string]string) []string {
	var left []string
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) { // another goroutine's descriptors: nothing to wait on
		left = left[:0]
		for fd, target := range OpenFDs() {
			if before[fd] != target {
				left = append(left, fd+" -> "+target)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			sort.Strings(left)
			return left
		}
	}
}

// runFinalizers runs a garbage collection and waits until the finalizers
// it queued have run, twice (a finalizer may free more).
func runFinalizers() {
	for range 2 {
		done := make(chan struct{})
		sentinel := new([16]byte)
		runtime.SetFinalizer(sentinel, func(*[16]byte) { close(done) })
		sentinel = nil
		runtime.GC()
		select {
		case <-done:
		case <-time.After(time.Second):
		}
	}
}

// MainWithLeakCheck runs the tests and fails the package when it ends
// with descriptors open that were not open before, naming them. Use it as
// `func TestMain(m *testing.M) { os.Exit(testnet.MainWithLeakCheck(m)) }`.
func MainWithLeakCheck(m *testing.M) int {
	// Open the runtime's poller first, so its descriptors are in the baseline.
	if r, w, err := os.Pipe(); err == nil {
		// Only opened to start the poller: closing them loses nothing.
		_ = r.Close()
		_ = w.Close()
	}
	before := OpenFDs()
	code := m.Run()
	// An *os.File nobody references is closed by its finalizer (some
	// libraries' test helpers leave pipes that way); a raw descriptor is
	// not, and is what this check is for.
	runFinalizers()
	var leaked []string
	for fd, target := range OpenFDs() {
		if before[fd] != target {
			leaked = append(leaked, fd+" -> "+target)
		}
	}
	if len(leaked) > 0 {
		sort.Strings(leaked)
		fmt.Fprintf(os.Stderr, "FAIL: tests leaked %d file descriptors:\n  %s\n", len(leaked), strings.Join(leaked, "\n  "))
		if code == 0 {
			code = 1
		}
	}
	return code
}
