package nri

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/flow"
)

// The NRI face's decisions against a fake core and a fake netlink, as
// kubelet's managers are tested; pkg/daemon's TestDRANetdevClaim and
// nri_test.go show the same paths with a real runtime side, netns and
// veth.

// fakeCore holds the pods' claims and the sandboxes' attachments, and
// records each call.
type fakeCore struct {
	claims    map[string][]Claim
	sandboxes []api.AttachmentRef
	addErr    error
	delErr    error
	calls     []string
}

func (c *fakeCore) NetdevClaims(uid string) []Claim { return c.claims[uid] }

func (c *fakeCore) Add(_ context.Context, req api.CNIAddRequest) error {
	fs := make([]string, len(req.Flows))
	for i, f := range req.Flows {
		fs[i] = flow.Format(f)
	}
	c.calls = append(c.calls, fmt.Sprintf("add %s/%s %s pod %s/%s %s mtu %d addrs %v flows %s", req.ContainerID, req.IfName,
		req.Allocation, req.PodNamespace, req.PodName, req.Netns, req.MTU, req.Addresses, strings.Join(fs, ",")))
	if c.addErr != nil {
		return c.addErr
	}
	c.sandboxes = append(c.sandboxes, api.AttachmentRef{ContainerID: req.ContainerID, IfName: req.IfName})
	return nil
}

func (c *fakeCore) Del(_ context.Context, ref api.AttachmentRef) error {
	c.calls = append(c.calls, "del "+ref.ContainerID+"/"+ref.IfName)
	if c.delErr != nil {
		return c.delErr
	}
	c.sandboxes = slices.DeleteFunc(c.sandboxes, func(r api.AttachmentRef) bool { return r == ref })
	return nil
}

func (c *fakeCore) Sandboxes() []api.AttachmentRef { return slices.Clone(c.sandboxes) }
func (c *fakeCore) Moved()                         { c.calls = append(c.calls, "moved") }

func (c *fakeCore) take() []string {
	out := c.calls
	c.calls = nil
	return out
}

func newSandboxes(core *fakeCore, addrErr error) (*Sandboxes, *[]string) {
	var set []string
	s := NewSandboxes(core)
	s.setAddresses = func(path, name string, prefixes []netip.Prefix) error {
		set = append(set, fmt.Sprintf("%s %s %v", path, name, prefixes))
		return addrErr
	}
	return s, &set
}

func check(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n got %q\nwant %q", what, got, want)
	}
}

var pod = Pod{UID: "u1", Namespace: "telco", Name: "upf-0", Sandbox: "s1", Netns: "/var/run/netns/cni-1"}

var upfClaim = Claim{Allocation: "v-1", Name: "telco/upf", Netdev: "eth1", Interface: "net1", MTU: 9000,
	Prefixes: []netip.Prefix{netip.MustParsePrefix("10.77.0.2/24")},
	Flows:    []api.CNIFlow{{Protocol: "udp", Dst: netip.MustParsePrefix("10.77.0.2/32"), DstPort: 2152}}}

// TestRunPod: a pod's claims' netdevs move in named, addressed and
// steered as their claims say, each claim on its own; the DRA driver
// hears of it once; a pod without claims is left alone.
func TestRunPod(t *testing.T) {
	ctx := context.Background()
	bare := Claim{Allocation: "v-2", Name: "telco/bare", Netdev: "eth2"}
	broken := Claim{Allocation: "v-3", Name: "telco/broken", Netdev: "eth3", Err: errors.New("interface: not JSON")}
	core := &fakeCore{claims: map[string][]Claim{pod.UID: {upfClaim, broken, bare}}}
	s, set := newSandboxes(core, nil)

	if err := s.RunPod(ctx, Pod{UID: "other", Sandbox: "s9", Netns: "/x"}); err != nil {
		t.Fatal(err)
	}
	check(t, "a pod without claims", core.take())

	err := s.RunPod(ctx, pod)
	if err == nil || !strings.Contains(err.Error(), "claim telco/broken: interface: not JSON") {
		t.Errorf("a claim whose configuration cannot be used: %v", err)
	}
	check(t, "moved in", core.take(),
		"add sandbox-s1/net1 v-1 pod telco/upf-0 /var/run/netns/cni-1 mtu 9000 addrs [10.77.0.2] flows udp 10.77.0.2:2152",
		"add sandbox-s1/eth2 v-2 pod telco/upf-0 /var/run/netns/cni-1 mtu 0 addrs [] flows ",
		"moved")
	check(t, "addressed", *set, "/var/run/netns/cni-1 net1 [10.77.0.2/24]", "/var/run/netns/cni-1 eth2 []")
}

// TestRunPodRefused: a pod in the node's network namespace is refused
// by name before anything moves; a move whose addresses cannot be set
// is undone, and an undo that fails is said with it.
func TestRunPodRefused(t *testing.T) {
	ctx := context.Background()
	core := &fakeCore{claims: map[string][]Claim{pod.UID: {upfClaim}}}
	s, _ := newSandboxes(core, errors.New("address 10.77.0.2/24 on net1 in the pod: file exists"))

	host := pod
	host.Netns = ""
	if err := s.RunPod(ctx, host); !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "claim telco/upf cannot move") ||
		!strings.Contains(err.Error(), "needs a network namespace of its own") {
		t.Errorf("a pod of the host's netns: %v", err)
	}
	check(t, "nothing moved for a pod of the host's netns", core.take())

	err := s.RunPod(ctx, pod)
	if err == nil || !strings.Contains(err.Error(), "file exists") || strings.Contains(err.Error(), "moving it back") {
		t.Errorf("addresses refused: %v", err)
	}
	check(t, "undone", core.take(),
		"add sandbox-s1/net1 v-1 pod telco/upf-0 /var/run/netns/cni-1 mtu 9000 addrs [10.77.0.2] flows udp 10.77.0.2:2152",
		"del sandbox-s1/net1", "moved")

	core.delErr = errors.New("netns gone")
	err = s.RunPod(ctx, pod)
	if err == nil || !strings.Contains(err.Error(), "file exists; and moving it back: netns gone") {
		t.Errorf("undo refused: %v", err)
	}
}

// TestStopPodAndSynchronize: a stopped sandbox's netdevs come back, not
// another's; at a (re)connection the running pods' claims move in and
// the netdevs of sandboxes no longer running come back.
func TestStopPodAndSynchronize(t *testing.T) {
	ctx := context.Background()
	core := &fakeCore{claims: map[string][]Claim{pod.UID: {upfClaim}},
		sandboxes: []api.AttachmentRef{{ContainerID: "sandbox-s0", IfName: "net1"}, {ContainerID: "sandbox-s7", IfName: "eth5"}}}
	s, _ := newSandboxes(core, nil)

	if err := s.StopPod(ctx, Pod{UID: "u0", Sandbox: "s0"}); err != nil {
		t.Fatal(err)
	}
	check(t, "stopped", core.take(), "del sandbox-s0/net1", "moved")

	hostPod := Pod{UID: "u8", Sandbox: "s8"} // the node's netns: nothing of it to move
	if err := s.Synchronize(ctx, []Pod{pod, hostPod}); err != nil {
		t.Fatal(err)
	}
	check(t, "synchronized", core.take(),
		"add sandbox-s1/net1 v-1 pod telco/upf-0 /var/run/netns/cni-1 mtu 9000 addrs [10.77.0.2] flows udp 10.77.0.2:2152",
		"moved", "del sandbox-s7/eth5")
	check(t, "left", refs(core.Sandboxes()), "sandbox-s1/net1")

	core.delErr = errors.New("busy")
	if err := s.Synchronize(ctx, nil); err == nil || !strings.Contains(err.Error(), "busy") {
		t.Errorf("a netdev that cannot come back: %v", err)
	}
}

func refs(rs []api.AttachmentRef) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.ContainerID + "/" + r.IfName
	}
	return out
}

// TestReachableNetns: a runtime's netns path the daemon cannot see is
// reached through the sandbox's process.
func TestReachableNetns(t *testing.T) {
	if got := reachableNetns(Pod{Netns: "/nonexistent/netns", Pid: 42}); got != "/proc/42/ns/net" {
		t.Errorf("unseen path: %s", got)
	}
	if got := reachableNetns(Pod{Netns: "/nonexistent/netns"}); got != "/nonexistent/netns" {
		t.Errorf("unseen path, no pid: %s", got)
	}
	if got := reachableNetns(Pod{Netns: "/proc/self/ns/net", Pid: 42}); got != "/proc/self/ns/net" {
		t.Errorf("seen path: %s", got)
	}
}
