package nri

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/nic"
)

// A netdev-mode pool served by DRA moves its netdev into the pod when
// the runtime runs the pod's sandbox (the network namespace exists, the
// containers do not yet) and back when the sandbox stops, as DRANET
// does: no CNI attachment, so no Multus and no network configuration to
// write. The move is a netdev attachment like the CNI plugin's, named by
// the sandbox (SandboxPrefix + its id, the interface name): the same
// records, undo, restarts and collection of a pod whose namespace went,
// all the allocation core's. Sandboxes is that face: the Handler of the
// runtime's events, over the core.

// SandboxPrefix begins the container id of the attachments the
// runtime's sandbox events make.
const SandboxPrefix = "sandbox-"

// IsSandbox says whether containerID names a sandbox's attachment.
func IsSandbox(containerID string) bool { return strings.HasPrefix(containerID, SandboxPrefix) }

// Claim is a netdev-mode claim's allocation that a pod holds, as the
// core gives it: where its netdev goes in the pod, and what it steers.
type Claim struct {
	Allocation string // its id
	Name       string // the claim's namespace/name
	Netdev     string // the node's name of its netdev
	// Interface is the netdev's name in the pod ("": Netdev's), MTU (0:
	// as it is) and addresses, from the claim's configuration.
	Interface string
	MTU       int
	Prefixes  []netip.Prefix
	// Flows are the claim's flows resolved on the interface's addresses.
	Flows []api.CNIFlow
	// Err, if set, is why the claim's configuration cannot be used: the
	// claim's move fails with it.
	Err error
}

// Core is the allocation core as the face uses it.
type Core interface {
	// NetdevClaims are the active allocations of netdev-mode claims that
	// pod uid holds.
	NetdevClaims(uid string) []Claim
	// Add moves a netdev into a pod as the attachment req (a CNI ADD of
	// the daemon's own); again for the same attachment it is done.
	Add(ctx context.Context, req api.CNIAddRequest) error
	// Del ends an attachment, the netdev back on the node.
	Del(ctx context.Context, ref api.AttachmentRef) error
	// Sandboxes are the attachments made for sandboxes (IsSandbox).
	Sandboxes() []api.AttachmentRef
	// Moved says claims' netdevs moved in or out (their networkData
	// changes).
	Moved()
}

// Sandboxes moves the netdevs of the pods' netdev-mode claims in and out
// with their sandboxes: the Handler of the runtime's events.
type Sandboxes struct {
	core Core
	// setAddresses puts the prefixes on interface name in the network
	// namespace at path, and sets it up (SetAddresses; a fake in tests).
	setAddresses func(path, name string, prefixes []netip.Prefix) error
}

// NewSandboxes returns the face over core.
func NewSandboxes(core Core) *Sandboxes {
	return &Sandboxes{core: core, setAddresses: SetAddresses}
}

var _ Handler = (*Sandboxes)(nil)

// RunPod moves the netdevs of the pod's netdev-mode claims into it.
func (s *Sandboxes) RunPod(ctx context.Context, p Pod) error {
	claims := s.core.NetdevClaims(p.UID)
	if len(claims) == 0 {
		return nil
	}
	if p.Netns == "" {
		return api.Errorf(api.ErrInvalid, "the pod runs in the node's network namespace (hostNetwork): the netdev of claim %s cannot move into it; "+
			"a pod with a claim of a netdev-mode pool needs a network namespace of its own", claims[0].Name)
	}
	p.Netns = reachableNetns(p)
	var errs []error
	for _, c := range claims {
		if err := s.moveIn(ctx, p, c); err != nil {
			errs = append(errs, fmt.Errorf("claim %s: %w", c.Name, err))
		}
	}
	s.core.Moved()
	return errors.Join(errs...)
}

// reachableNetns is a path of the pod's network namespace that this
// process can open: the runtime's, or else (a daemon in a pod that does
// not see where the runtime mounts namespaces: containerd's
// netns_mounts_under_state_dir) its sandbox process's, in the host's
// /proc (the DaemonSet's hostPID).
func reachableNetns(p Pod) string {
	if _, err := os.Stat(p.Netns); err != nil && p.Pid > 0 {
		return fmt.Sprintf("/proc/%d/ns/net", p.Pid)
	}
	return p.Netns
}

// moveIn moves claim c's netdev into pod p, named and addressed as the
// claim says; again for the same sandbox it is done.
func (s *Sandboxes) moveIn(ctx context.Context, p Pod, c Claim) error {
	if c.Err != nil {
		return c.Err
	}
	name := c.Interface
	if name == "" {
		name = c.Netdev
	}
	var addrs []netip.Addr
	for _, pf := range c.Prefixes {
		addrs = append(addrs, pf.Addr())
	}
	req := api.CNIAddRequest{ContainerID: SandboxPrefix + p.Sandbox, IfName: name, Allocation: c.Allocation, PodUID: p.UID,
		PodNamespace: p.Namespace, PodName: p.Name, Netns: p.Netns, MTU: c.MTU, Flows: c.Flows, Addresses: addrs}
	if err := s.core.Add(ctx, req); err != nil {
		return err
	}
	if err := s.setAddresses(p.Netns, name, c.Prefixes); err != nil {
		if derr := s.core.Del(ctx, api.AttachmentRef{ContainerID: req.ContainerID, IfName: name}); derr != nil {
			return fmt.Errorf("%w; and moving it back: %v", err, derr)
		}
		return err
	}
	return nil
}

// StopPod brings back the netdevs moved into the pod's sandbox.
func (s *Sandboxes) StopPod(ctx context.Context, p Pod) error {
	var errs []error
	for _, ref := range s.core.Sandboxes() {
		if ref.ContainerID != SandboxPrefix+p.Sandbox {
			continue
		}
		if err := s.core.Del(ctx, ref); err != nil {
			errs = append(errs, err)
		}
	}
	s.core.Moved()
	return errors.Join(errs...)
}

// Synchronize moves in what pods that ran while the plugin was not
// connected should have, and brings back what sandboxes no longer
// running had.
func (s *Sandboxes) Synchronize(ctx context.Context, pods []Pod) error {
	running := map[string]bool{}
	var errs []error
	for _, p := range pods {
		running[SandboxPrefix+p.Sandbox] = true
		if p.Netns == "" {
			continue
		}
		if err := s.RunPod(ctx, p); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", p, err))
		}
	}
	for _, ref := range s.core.Sandboxes() {
		if running[ref.ContainerID] {
			continue
		}
		if err := s.core.Del(ctx, ref); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// SetAddresses puts the prefixes on interface name in the network
// namespace at path, and sets it up.
func SetAddresses(path, name string, prefixes []netip.Prefix) error {
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

// prefixNet is p as netlink writes an address: the address itself with
// its prefix's mask.
func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
