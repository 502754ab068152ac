package agent

import (
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/xdpq/xdpq/pkg/xdp"
)

// Hook is the netdevs' XDP hook as the agent acts on it: package xdp's
// functions (the kernel) unless Config.Hook says otherwise. A benchmark
// wraps them to make a NIC whose attach reconfigures its rings, which
// takes hundreds of milliseconds on i40e, ice or mlx5 and cannot be had
// on veth.
type Hook interface {
	Query(netns string, ifindex int) (*xdp.Attached, error)
	Attach(netns string, ifindex int, prog *ebpf.Program, mode xdp.Mode) (xdp.Mode, error)
	AttachLink(netns string, ifindex int, prog *ebpf.Program, mode xdp.Mode) (link.Link, xdp.Mode, error)
	Detach(netns string, ifindex int, mode xdp.Mode, expected *ebpf.Program) error
	Replace(netns string, ifindex int, mode xdp.Mode, prog, expected *ebpf.Program) error
}

// KernelHook is the kernel's XDP hook, through package xdp.
type KernelHook struct{}

var _ Hook = KernelHook{}

// Query is xdp.Query.
func (KernelHook) Query(netns string, ifindex int) (*xdp.Attached, error) {
	return xdp.Query(netns, ifindex)
}

// Attach is xdp.Attach.
func (KernelHook) Attach(netns string, ifindex int, prog *ebpf.Program, mode xdp.Mode) (xdp.Mode, error) {
	return xdp.Attach(netns, ifindex, prog, mode)
}

// AttachLink is xdp.AttachLink.
func (KernelHook) AttachLink(netns string, ifindex int, prog *ebpf.Program, mode xdp.Mode) (link.Link, xdp.Mode, error) {
	return xdp.AttachLink(netns, ifindex, prog, mode)
}

// Detach is xdp.Detach.
func (KernelHook) Detach(netns string, ifindex int, mode xdp.Mode, expected *ebpf.Program) error {
	return xdp.Detach(netns, ifindex, mode, expected)
}

// Replace is xdp.Replace.
func (KernelHook) Replace(netns string, ifindex int, mode xdp.Mode, prog, expected *ebpf.Program) error {
	return xdp.Replace(netns, ifindex, mode, prog, expected)
}
