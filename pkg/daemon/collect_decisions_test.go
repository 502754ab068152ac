package daemon

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/xdpq/xdpq/pkg/api"
)

// TestCollectGoneDecisions: the collector ends the attachments of pods
// whose network namespace is gone (containerd never calls CNI GC): the
// path no longer there, or naming another namespace than the one ADD
// saw. An attachment whose pod lives stays, and so does one whose netns
// ADD could not tell (none given); the allocation stays for its next
// pod. On a fake node as any user: the pods' namespaces are named by
// paths of processes the test starts and ends (/proc/<pid>/ns/net) and
// by a symlink it points elsewhere; TestCollectGonePods deletes real
// namespaces, as root.
func TestCollectGoneDecisions(t *testing.T) {
	n := newFakeNode(t, fakeNetdev("xa", 4))
	d := n.started("pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-3']}}]\n")
	ctx := context.Background()
	a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 2, UID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	// process starts a process of the test's own and returns the path
	// of its network namespace, and how to end it.
	process := func() (string, func()) {
		cmd := exec.Command("sleep", "600")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		end := func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait() // killed: its status says so
		}
		t.Cleanup(end)
		return fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid), end
	}
	livePath, _ := process()
	gonePath, endGone := process()
	link := filepath.Join(t.TempDir(), "pod-netns")
	if err := os.Symlink("/proc/self/ns/net", link); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct{ id, netns string }{{"live", livePath}, {"gone", gonePath}, {"replaced", link}, {"unknown", ""}} {
		addr := netip.AddrFrom4([4]byte{10, 77, 0, byte(10 + i)})
		if _, err := d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: c.id, IfName: "net1", Allocation: a.ID, Netns: c.netns,
			Addresses: []netip.Addr{addr}, Flows: []api.CNIFlow{{Protocol: "udp", Dst: netip.PrefixFrom(addr, 32), DstPort: 53}}}); err != nil {
			t.Fatalf("ADD %s: %v", c.id, err)
		}
	}
	if atts, _ := d.collect(ctx, time.Hour); len(atts) != 0 {
		t.Fatalf("collected %v while every pod lives", atts)
	}
	endGone()
	// Another namespace at the path ADD saw: the mount namespace's
	// inode is not the network namespace's.
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/proc/self/ns/mnt", link); err != nil {
		t.Fatal(err)
	}
	atts, _ := d.collect(ctx, time.Hour)
	slices.Sort(atts)
	if want := []string{"gone/net1", "replaced/net1"}; !slices.Equal(atts, want) {
		t.Errorf("collected %v, want %v", atts, want)
	}
	for _, id := range []string{"gone", "replaced"} {
		if _, err := d.local.CNICheck(ctx, api.AttachmentRef{ContainerID: id, IfName: "net1"}); err == nil {
			t.Errorf("CHECK of %s after the collection: still there", id)
		}
	}
	for _, id := range []string{"live", "unknown"} {
		if _, err := d.local.CNICheck(ctx, api.AttachmentRef{ContainerID: id, IfName: "net1"}); err != nil {
			t.Errorf("CHECK of %s after the collection: %v", id, err)
		}
	}
	n.agent.mu.Lock()
	owners := slices.Sorted(maps.Keys(n.agent.flows["xa"]))
	n.agent.mu.Unlock()
	if want := []string{"live/net1", "unknown/net1"}; !slices.Equal(owners, want) {
		t.Errorf("flows on xa of %v, want %v", owners, want)
	}
	if _, ok := d.core.ledger.Get(a.ID); !ok {
		t.Error("the allocation went with its attachments")
	}
}
