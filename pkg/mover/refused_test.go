package mover

import (
	"strings"
	"testing"

	"github.com/vishvananda/netns"
)

// TestRefusedBeforeTheKernel: what Prepare and MoveIn refuse before they
// ask the kernel anything, so as any user: a pod interface name the
// kernel would not take and a negative MTU (Prepare); a Record that is
// not one Prepare made, no pod namespace, and the node's own namespace
// as the pod's (MoveIn). Unprivileged, anything asked of the kernel
// fails with EPERM: each refusal must name its own reason. TestRefused
// has the refusals that need the kernel (a netdev not there, a bridge
// port, the temporary name taken, a stale Record), as root.
func TestRefusedBeforeTheKernel(t *testing.T) {
	m, err := New(Config{Node: "/proc/self/ns/net", Init: "/proc/self/ns/net"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	for _, tc := range []struct {
		ifname string
		mtu    int
		want   string
	}{
		{"a/b", 0, "prepare xa: pod interface name \"a/b\": has '/'"},
		{"sixteen-bytes-xx", 0, "longer than 15"},
		{"", 0, "empty interface name"},
		{"net1", -1, "prepare xa: mtu -1: negative"},
	} {
		if _, err := m.Prepare("xa", tc.ifname, tc.mtu); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Prepare(xa, %q, %d): %v; want %q", tc.ifname, tc.mtu, err, tc.want)
		}
	}

	self, err := netns.GetFromPath("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { self.Close() })
	r := validRecord()
	bad := r
	bad.Temp = "eth0"
	for _, tc := range []struct {
		name string
		r    Record
		pod  netns.NsHandle
		want string
	}{
		{"a Record whose temporary name is not its own", bad, self, `want "xdpq`},
		{"no pod namespace", r, netns.None(), "no pod network namespace"},
		{"the node's namespace as the pod's", r, self, "shares the node's network namespace"},
	} {
		if _, err := m.MoveIn(tc.r, tc.pod); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("MoveIn with %s: %v; want %q", tc.name, err, tc.want)
		}
	}
}
