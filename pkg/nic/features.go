package nic

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
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

func queryXDPFeatures(netns string, ifindex int) (Features, error) {
	var f Features
	query := func(ns.NetNS) error {
		fam, err := netlink.GenlFamilyGet(netdevFamilyName)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrNoFeatures, err)
		}
		// Execute needs the ack to end a non-dump exchange.
		req := nl.NewNetlinkRequest(int(fam.ID), unix.NLM_F_ACK)
		req.AddData(&nl.Genlmsg{Command: netdevCmdDevGet, Version: netdevFamilyVersion})
		b := make([]byte, 4)
		binary.NativeEndian.PutUint32(b, uint32(ifindex))
		req.AddData(nl.NewRtAttr(netdevAttrIfindex, b))
		msgs, err := req.Execute(unix.NETLINK_GENERIC, 0)
		if err != nil {
			return fmt.Errorf("netdev dev-get ifindex %d: %w", ifindex, err)
		}
		for _, m := range msgs {
			if len(m) < nl.SizeofGenlmsg {
				continue
			}
			attrs, err := nl.ParseRouteAttr(m[nl.SizeofGenlmsg:])
			if err != nil {
				return err
			}
			for _, a := range attrs {
				if a.Attr.Type == netdevAttrXDPFeatures && len(a.Value) >= 8 {
					f = Features(binary.NativeEndian.Uint64(a.Value)) | featuresQueried
				}
			}
		}
		return nil
	}
	var err error
	if netns == "" {
		err = query(nil)
	} else {
		err = ns.WithNetNSPath(netns, query)
	}
	return f, err
}
