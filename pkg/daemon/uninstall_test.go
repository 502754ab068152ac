package daemon

import (
	"context"
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
)

// uninstallAnswer is an Options.Uninstalling that answers yes (an
// uninstall) or no (a restart), counting its calls.
func uninstallAnswer(yes bool, calls *int) func(context.Context) (bool, string) {
	return func(context.Context) (bool, string) {
		*calls++
		if yes {
			return true, "DaemonSet xdpq/xdpq was deleted (test)"
		}
		return false, "DaemonSet xdpq/xdpq remains (test)"
	}
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestUninstall: told as it stops that xdpq is being uninstalled (its
// DaemonSet deleted), the daemon removes what it put on the node: the
// pod's lease ends, the flow and the program go, and the pins, records
// and sockets with them; a daemon installed again afterwards starts from
// nothing. Told it is a restart, all of it stays.
func TestUninstall(t *testing.T) {
	const config = "pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}}]\n"
	t.Run("restart", func(t *testing.T) {
		pair := testnet.NewPair(t, 2)
		o := standaloneOpts(t, pair, t.TempDir(), testPins(t), config)
		var calls int
		o.Uninstalling = uninstallAnswer(false, &calls)
		d, stop := runDaemon(t, o)
		a := allocWithFlow(t, d, pair, "upf")
		p := connectPod(t, a.Socket)
		stop()
		if calls != 1 {
			t.Errorf("Uninstalling asked %d times, want once", calls)
		}
		if attached(t, pair) == nil || !exists(o.PinDir) || !exists(o.StateDir) {
			t.Error("a daemon stopped for a restart removed its datapath")
		}
		p.expect(t, pair, "after a stop that is not an uninstall")
	})
	t.Run("uninstall", func(t *testing.T) {
		pair := testnet.NewPair(t, 2)
		o := standaloneOpts(t, pair, t.TempDir(), testPins(t), config)
		var calls int
		o.Uninstalling = uninstallAnswer(true, &calls)
		d, stop := runDaemon(t, o)
		a := allocWithFlow(t, d, pair, "upf")
		p := connectPod(t, a.Socket)
		p.expect(t, pair, "before the uninstall")
		if attached(t, pair) == nil {
			t.Fatal("no program on xa while a pod holds its lease")
		}
		stop()
		if calls != 1 {
			t.Errorf("Uninstalling asked %d times, want once", calls)
		}
		if attached(t, pair) != nil {
			t.Error("the program stays on xa after the uninstall")
		}
		for _, dir := range []string{o.PinDir, o.StateDir, o.AllocDir} {
			if exists(dir) {
				ents, _ := os.ReadDir(dir)
				t.Errorf("%s stays after the uninstall (%d entries)", dir, len(ents))
			}
		}
		// Installed again: nothing of the first install is there.
		o.Uninstalling = nil
		d, _ = runDaemon(t, o)
		if n := netdevOf(t, d, "xa"); n.Mode != "" && len(n.Sockets) != 0 {
			t.Errorf("xa after a new install: %+v", n)
		}
		s, err := d.core.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if s.Allocations != 0 {
			t.Errorf("%d allocations after a new install", s.Allocations)
		}
		if l, err := d.core.Allocations(context.Background(), ""); err != nil || len(l.Allocations) != 0 {
			t.Errorf("allocations after a new install: %+v %v", l, err)
		}
		if _, err := d.local.Alloc(context.Background(), api.AllocRequest{Pool: "upf", Count: 2}); err != nil {
			t.Errorf("the queues after a new install: %v", err)
		}
	})
	// A netdev-mode pool's netdev in a pod comes back to the node.
	t.Run("netdev in a pod", func(t *testing.T) {
		pair := testnet.NewPair(t, 2)
		o := standaloneOpts(t, pair, t.TempDir(), testPins(t), "pools: [{name: vf, mode: netdev, devices: {netdevs: [xa]}}]\n")
		var calls int
		o.Uninstalling = uninstallAnswer(true, &calls)
		d, stop := runDaemon(t, o)
		ctx := context.Background()
		a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "vf", Count: 1})
		if err != nil {
			t.Fatal(err)
		}
		pod, err := testutils.NewNS()
		if err != nil {
			t.Fatal(err)
		}
		defer testutils.UnmountNS(pod)
		defer pod.Close()
		if _, err := d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Netns: pod.Path(), Allocation: a.ID}); err != nil {
			t.Fatal(err)
		}
		if err := pod.Do(func(ns.NetNS) error { _, err := netlink.LinkByName("net1"); return err }); err != nil {
			t.Fatalf("xa is not in the pod as net1: %v", err)
		}
		stop()
		if err := pod.Do(func(ns.NetNS) error { _, err := netlink.LinkByName("net1"); return err }); err == nil {
			t.Error("net1 stays in the pod after the uninstall")
		}
		if attached(t, pair) != nil {
			t.Error("xa came back with a program attached")
		}
		for _, dir := range []string{o.PinDir, o.StateDir, o.AllocDir} {
			if exists(dir) {
				t.Errorf("%s stays after the uninstall", dir)
			}
		}
	})
}

// TestSysfsNotInMountTable: the sysfs the daemon mounts to see the NICs'
// namespace is attached to no directory, so the mount table is the same
// while it runs, and a daemon killed without its cleanup leaves none
// behind holding the namespace. (Mounted on a temporary directory, one
// stayed for every killed daemon: 14,363 on this machine.)
func TestSysfsNotInMountTable(t *testing.T) {
	pair := testnet.NewPair(t, 2)
	mounts := func() string {
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	before := mounts()
	d, _ := runDaemon(t, standaloneOpts(t, pair, t.TempDir(), testPins(t), "pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}}]\n"))
	if n := netdevOf(t, d, "xa"); n.RXQueues != 2 {
		t.Fatalf("xa not found through the daemon's sysfs: %+v", n)
	}
	if after := mounts(); after != before {
		t.Errorf("the mount table changed while the daemon runs:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}
