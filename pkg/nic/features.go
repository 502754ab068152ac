package nic

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"
)

// Features are the XDP features a driver reports (NETDEV_A_DEV_XDP_FEATURES).
type Features uint64

// Feature bits (enum netdev_xdp_act).
const (
	XDPBasic        Features = 1 << 0 // native XDP: pass, drop, abort, tx
	XDPRedirect     Features = 1 << 1 // native XDP_REDIRECT, hence AF_XDP in native mode
	XDPNdoXmit      Features = 1 << 2
	XSKZeroCopy     Features = 1 << 3 // AF_XDP zero-copy
	XDPHWOffload    Features = 1 << 4
	XDPRXSG         Features = 1 << 5
	XDPNdoXmitSG    Features = 1 << 6
	featuresQueried Features = 1 << 63 // set when the kernel answered
)

var featureNames = []struct {
	f    Features
	name string
}{{XDPBasic, "basic"}, {XDPRedirect, "redirect"}, {XDPNdoXmit, "ndo-xmit"}, {XSKZeroCopy, "xsk-zerocopy"},
	{XDPHWOffload, "hw-offload"}, {XDPRXSG, "rx-sg"}, {XDPNdoXmitSG, "ndo-xmit-sg"}}

// Known reports whether the kernel reported features at all.
func (f Features) Known() bool { return f&featuresQueried != 0 }

// Has reports whether every feature in g is there.
func (f Features) Has(g Features) bool { return f&g == g }

func (f Features) String() string {
	if !f.Known() {
		return "unknown"
	}
	var s []string
	for _, n := range featureNames {
		if f.Has(n.f) {
			s = append(s, n.name)
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ",")
}

// netdev genetlink family (include/uapi/linux/netdev.h).
const (
	netdevCmdDevGet       = 1
	netdevAttrIfindex     = 1
	netdevAttrXDPFeatures = 3
	netdevFamilyName      = "netdev"
	netdevFamilyVersion   = 1
)

// ErrNoFeatures is returned when the kernel has no netdev genl family.
var ErrNoFeatures = errors.New("the kernel does not report XDP features (Linux 6.3 or later does)")

// XDPFeatures asks the kernel what XDP the driver of ifindex supports, in
// the network namespace at netnsPath ("" for the caller's).
func XDPFeatures(netnsPath string, ifindex int) (Features, error) {
	cfg := &netlink.Config{}
	if netnsPath != "" {
		f, err := os.Open(netnsPath)
		if err != nil {
			return 0, fmt.Errorf("xdp features: %w", err)
		}
		defer func() { _ = f.Close() }() // a namespace handle only read
		cfg.NetNS = int(f.Fd())
	}
	c, err := genetlink.Dial(cfg)
	if err != nil {
		return 0, fmt.Errorf("xdp features: %w", err)
	}
	defer func() { _ = c.Close() }() // a netlink socket whose every request was answered or failed
	fam, err := c.GetFamily(netdevFamilyName)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrNoFeatures, err)
	}
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(netdevAttrIfindex, uint32(ifindex))
	data, err := ae.Encode()
	if err != nil {
		return 0, err
	}
	msgs, err := c.Execute(genetlink.Message{Header: genetlink.Header{Command: netdevCmdDevGet, Version: fam.Version}, Data: data},
		fam.ID, netlink.Request)
	if err != nil {
		return 0, fmt.Errorf("netdev dev-get ifindex %d: %w", ifindex, err)
	}
	for _, m := range msgs {
		ad, err := netlink.NewAttributeDecoder(m.Data)
		if err != nil {
			return 0, err
		}
		for ad.Next() {
			if ad.Type() == netdevAttrXDPFeatures {
				return Features(ad.Uint64()) | featuresQueried, nil
			}
		}
		if err := ad.Err(); err != nil {
			return 0, err
		}
	}
	return 0, fmt.Errorf("netdev dev-get ifindex %d: no xdp-features in the reply", ifindex)
}
