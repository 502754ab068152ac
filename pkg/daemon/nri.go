package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/dra"
	"github.com/xdpq/xdpq/pkg/flow"
	"github.com/xdpq/xdpq/pkg/ledger"
	"github.com/xdpq/xdpq/pkg/nic"
	"github.com/xdpq/xdpq/pkg/nri"
)

// A netdev-mode pool served by DRA moves its netdev into the pod when
// the runtime runs the pod's sandbox (NRI's RunPodSandbox: the network
// namespace exists, the containers do not yet) and back when the
// sandbox stops, as DRANET does: no CNI attachment, so no Multus and no
// network configuration to write. The move is a netdev attachment like
// the CNI plugin's, named by the sandbox (sandboxPrefix + its id, the
// interface name): the same records, undo, restarts and collection of
// a pod whose namespace went.

// sandboxPrefix begins the container id of the attachments the runtime's
// NRI events make.
const sandboxPrefix = "sandbox-"

func isSandbox(containerID string) bool { return strings.HasPrefix(containerID, sandboxPrefix) }

// nriRetry is how long the NRI plugin waits before it connects again.
const nriRetry = 2 * time.Second

// nriLoop runs the daemon's NRI plugin.
func (d *Daemon) nriLoop(ctx context.Context) error {
	return nri.Run(ctx, d.opts.DRA.NRISocket, nriHandler{d}, d.log, nriRetry, nil)
}

// nriHandler is the daemon as the NRI plugin sees it.
type nriHandler struct{ d *Daemon }

// netdevClaims are the allocations of netdev-mode claims of pod uid.
func (d *Daemon) netdevClaims(uid string) []ledger.Allocation {
	var out []ledger.Allocation
	for _, a := range d.ledger.Allocations() {
		if a.Claim == nil || a.Owner.PodUID != uid || a.State != ledger.Active {
			continue
		}
		if p, ok := d.ledger.Meta(a.Pool); ok && p.Mode() == api.ModeNetdev {
			out = append(out, a)
		}
	}
	return out
}

// RunPod moves the netdevs of the pod's netdev-mode claims into it.
func (h nriHandler) RunPod(ctx context.Context, p nri.Pod) error {
	d := h.d
	allocs := d.netdevClaims(p.UID)
	if len(allocs) == 0 {
		return nil
	}
	if p.Netns == "" {
		return api.Errorf(api.ErrInvalid, "the pod runs in the node's network namespace: the netdev of claim %s/%s cannot move into it",
			allocs[0].Claim.Namespace, allocs[0].Claim.Name)
	}
	p.Netns = reachableNetns(p)
	var errs []error
	for _, a := range allocs {
		if err := d.moveClaimNetdev(ctx, p, a); err != nil {
			errs = append(errs, fmt.Errorf("claim %s/%s: %w", a.Claim.Namespace, a.Claim.Name, err))
		}
	}
	d.signalDRA() // the claims' networkData
	return errors.Join(errs...)
}

// reachableNetns is a path of the pod's network namespace that this
// process can open: the runtime's, or else (a daemon in a pod that does
// not see where the runtime mounts namespaces: containerd's
// netns_mounts_under_state_dir) its sandbox process's, in the host's
// /proc (the DaemonSet's hostPID).
func reachableNetns(p nri.Pod) string {
	if _, err := os.Stat(p.Netns); err != nil && p.Pid > 0 {
		return fmt.Sprintf("/proc/%d/ns/net", p.Pid)
	}
	return p.Netns
}

// claimInterface is the interface configuration of a claim's allocation.
func claimInterface(a ledger.Allocation) (dra.InterfaceConfig, error) {
	var ic dra.InterfaceConfig
	if a.Claim == nil || len(a.Claim.Interface) == 0 {
		return ic, nil
	}
	err := json.Unmarshal(a.Claim.Interface, &ic)
	return ic, err
}

// claimNetdevFlows are the flows a netdev-mode claim steers: its
// configured flows, an empty destination being each of the interface's
// addresses.
func claimNetdevFlows(a ledger.Allocation, ic dra.InterfaceConfig) ([]api.CNIFlow, []netip.Addr, error) {
	var addrs []netip.Addr
	for _, p := range ic.Prefixes() {
		addrs = append(addrs, p.Addr())
	}
	if a.Claim == nil || a.Claim.Flows == nil {
		return nil, addrs, nil
	}
	parsed, err := flow.ParseList(a.Claim.Flows, "flows")
	if err != nil {
		return nil, nil, err
	}
	flows, err := flow.Resolve(parsed, addrs)
	if err != nil {
		return nil, nil, fmt.Errorf("%w (a netdev-mode claim's own addresses are its interface.addresses)", err)
	}
	return flows, addrs, nil
}

// moveClaimNetdev moves allocation a's netdev into pod p, named and
// addressed as its claim says; again for the same sandbox it is done.
func (d *Daemon) moveClaimNetdev(ctx context.Context, p nri.Pod, a ledger.Allocation) error {
	ic, err := claimInterface(a)
	if err != nil {
		return err
	}
	flows, addrs, err := claimNetdevFlows(a, ic)
	if err != nil {
		return err
	}
	name := ic.Name
	if name == "" {
		name = a.Netdev
	}
	req := api.CNIAddRequest{ContainerID: sandboxPrefix + p.Sandbox, IfName: name, Allocation: a.ID, PodUID: p.UID,
		PodNamespace: p.Namespace, PodName: p.Name, Netns: p.Netns, MTU: ic.MTU, Flows: flows, Addresses: addrs}
	if _, err := d.add(ctx, req); err != nil {
		return err
	}
	if err := setAddresses(p.Netns, name, ic.Prefixes()); err != nil {
		ref := api.AttachmentRef{ContainerID: req.ContainerID, IfName: name}
		if derr := d.del(ctx, ref); derr != nil {
			return fmt.Errorf("%w; and moving it back: %v", err, derr)
		}
		return err
	}
	return nil
}

// setAddresses puts the addresses on interface name in the network
// namespace at path, and sets it up.
func setAddresses(path, name string, prefixes []netip.Prefix) error {
	if path == "" {
		return errors.New("the pod's network namespace is unknown: no addresses set") // never the node's own
	}
	h, err := nic.Handle(path)
	if err != nil {
		return err // names the netns
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("interface %s in the pod: %w", name, err)
	}
	for _, p := range prefixes {
		addr := &netlink.Addr{IPNet: prefixNet(p)}
		if err := h.AddrReplace(l, addr); err != nil {
			return fmt.Errorf("address %s on %s in the pod: %w", p, name, err)
		}
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up in the pod: %w", name, err)
	}
	return nil
}

// StopPod brings back the netdevs moved into the pod's sandbox.
func (h nriHandler) StopPod(ctx context.Context, p nri.Pod) error {
	d := h.d
	var errs []error
	for _, att := range d.ledger.Attachments() {
		if att.ContainerID != sandboxPrefix+p.Sandbox {
			continue
		}
		if err := d.del(ctx, api.AttachmentRef{ContainerID: att.ContainerID, IfName: att.IfName}); err != nil {
			errs = append(errs, err)
		}
	}
	d.signalDRA()
	return errors.Join(errs...)
}

// Synchronize moves in what pods that ran while the plugin was not
// connected should have, and brings back what sandboxes no longer
// running had.
func (h nriHandler) Synchronize(ctx context.Context, pods []nri.Pod) error {
	d := h.d
	running := map[string]bool{}
	var errs []error
	for _, p := range pods {
		running[sandboxPrefix+p.Sandbox] = true
		if p.Netns == "" {
			continue
		}
		if err := h.RunPod(ctx, p); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", p, err))
		}
	}
	for _, att := range d.ledger.Attachments() {
		if !isSandbox(att.ContainerID) || running[att.ContainerID] {
			continue
		}
		if err := d.del(ctx, api.AttachmentRef{ContainerID: att.ContainerID, IfName: att.IfName}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// claimNetwork is where a claim's netdev is in its pod, nil when it is
// not there.
func claimNetwork(a ledger.Allocation) *dra.Network {
	for _, att := range a.Attachments {
		if !isSandbox(att.ContainerID) || att.State != ledger.Active {
			continue
		}
		n := &dra.Network{InterfaceName: att.IfName, HardwareAddress: att.Mac}
		if ic, err := claimInterface(a); err == nil {
			n.IPs = ic.Addresses
		}
		return n
	}
	return nil
}

// prefixNet is p as netlink writes an address: the address itself with
// its prefix's mask.
func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
