module github.com/xdpq/xdpq

go 1.26.8

require (
	github.com/cilium/ebpf v0.22.0
	github.com/containernetworking/plugins v1.10.0
	github.com/vishvananda/netlink v1.3.1
	github.com/vishvananda/netns v0.0.5
	golang.org/x/sys v0.49.0
)

require github.com/containernetworking/cni v1.3.1 // indirect

tool github.com/cilium/ebpf/cmd/bpf2go
