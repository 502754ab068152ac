package dra

import (
	"fmt"
	"hash/fnv"
	"strings"
)

// DriverName is the DRA driver's name: the domain of its attributes, its
// DeviceClasses' selectors and its opaque configuration.
const DriverName = "xdpq.io"

// PoolName is the ResourceSlice pool of an xdpq pool on a node. Pool
// names are one namespace per driver across the cluster, so the node
// is part of it.
func PoolName(node, pool string) string { return node + "/" + pool }

// xdpqPool is the xdpq pool of a ResourceSlice pool of node, or false
// when the pool is another node's.
func xdpqPool(node, poolName string) (string, bool) {
	p, ok := strings.CutPrefix(poolName, node+"/")
	return p, ok && p != "" && !strings.Contains(p, "/")
}

// maxLabel is the length of a DNS label.
const maxLabel = 63

// DeviceName is the name of a ledger device in its ResourceSlice: a DNS
// label (lower case letters, digits and '-', at most 63, starting and
// ending with a letter or digit), whatever its netdev is called. A
// netdev name that is already one (eth1, ens1f0np0) is kept, so that
// "eth1-q3" reads as eth1's queue 3; any other (ens1f0.100, eth_1,
// Eth1) is lower-cased with every other character made '-', and a hash
// of the real name appended so that two netdevs never share a name.
// queue < 0 names the whole netdev (netdev pools).
func DeviceName(netdev string, queue int) string {
	suffix := ""
	if queue >= 0 {
		suffix = fmt.Sprintf("-q%d", queue)
	}
	base := netdev
	if !isLabel(netdev) {
		var b strings.Builder
		for _, r := range strings.ToLower(netdev) {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
				b.WriteRune(r)
			} else {
				b.WriteByte('-')
			}
		}
		h := fnv.New32a()
		_, _ = h.Write([]byte(netdev)) // a hash never fails
		tag := fmt.Sprintf("-%08x", h.Sum32())
		base = strings.Trim(b.String(), "-")
		if len(base)+len(tag)+len(suffix) > maxLabel {
			base = base[:maxLabel-len(tag)-len(suffix)]
		}
		base = strings.TrimRight(base, "-") + tag
		if base[0] == '-' {
			base = "x" + base
		}
	}
	return base + suffix
}

// isLabel says whether s is a DNS label short enough to take a queue
// suffix ("-q" and up to 5 digits).
func isLabel(s string) bool {
	if s == "" || len(s) > maxLabel-7 {
		return false
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
		case r == '-' && i > 0 && i < len(s)-1:
		default:
			return false
		}
	}
	return true
}
