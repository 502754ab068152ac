package dra

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"strconv"
	"strings"
)

// DriverName is the DRA driver's name: the domain of its attributes, its
// DeviceClasses' selectors and its opaque configuration.
const DriverName = "xdpq.io"

// PoolName is the ResourceSlice pool of an xdpq pool on a node. Pool
// names are one namespace per driver across the cluster, so the node
// is part of it: "<node>/<pool>", the node's name shortened when the
// whole would be longer than the API's 253 (nodePart).
func PoolName(node, pool string) string { return nodePart(node) + "/" + pool }

// maxNodePart is the longest node part of a pool name: an xdpq pool's
// name has at most 63 characters (a DNS label), and the API's limit
// of a pool name is 253.
const maxNodePart = 253 - 1 - 63

// nodePart is the node's name in its pools' names: the name itself, or
// for a name longer than maxNodePart its first characters and a label
// of its hash, so that two long names alike in their first 179
// characters still differ.
func nodePart(node string) string {
	if len(node) <= maxNodePart {
		return node
	}
	h := sha256.Sum256([]byte(node))
	tail := ".h" + hex.EncodeToString(h[:4])
	head := strings.TrimRight(node[:maxNodePart-len(tail)], ".-")
	return head + tail
}

// xdpqPool is the xdpq pool of a ResourceSlice pool of node, or false
// when the pool is another node's.
func xdpqPool(node, poolName string) (string, bool) {
	p, ok := strings.CutPrefix(poolName, nodePart(node)+"/")
	return p, ok && p != "" && !strings.Contains(p, "/")
}

// maxLabel is the length of a DNS label.
const maxLabel = 63

// maxNetdev is the longest netdev name, in bytes (IFNAMSIZ-1).
const maxNetdev = 15

// b32 spells a netdev's name in a device name: lower case letters and
// digits 2-7, no '-'.
var b32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// hashLen is the length of the b32 of a name too long to be a netdev's:
// longer than that of any name of maxNetdev bytes, so that the two never
// meet.
const hashLen = 26

// DeviceName is the name of a ledger device in its ResourceSlice: a DNS
// label (lower case letters, digits and '-', at most 63, starting and
// ending with a letter or digit), whatever its netdev is called, and
// never the same for two netdevs. A netdev name that is already one
// (eth1, ens1f0np0) and has no "--" is kept, so that "eth1-q3" reads as
// eth1's queue 3; any other (ens1f0.100, eth_1, Eth1) is lower-cased
// with every run of other characters made one '-', then "--" and the
// real name in base32 (eth_1 is "eth-1--mv2gqxzr"): the part after the
// "--" gives the name back, so that two netdevs never share a name (a
// name longer than a netdev's has a hash of it there instead). queue < 0
// names the whole netdev (netdev pools); a queue's name ends in
// "-q<queue>".
func DeviceName(netdev string, queue int) string {
	suffix := ""
	if queue >= 0 {
		suffix = "-q" + strconv.Itoa(queue)
	}
	if isLabel(netdev) && !strings.Contains(netdev, "--") && len(netdev)+len(suffix) <= maxLabel {
		return netdev + suffix
	}
	var tail string
	if n := len(netdev); n > 0 && n <= maxNetdev {
		tail = b32.EncodeToString([]byte(netdev))
	} else {
		h := sha256.Sum256([]byte(netdev))
		tail = b32.EncodeToString(h[:])[:hashLen]
	}
	// What reads as the netdev: its letters and digits, each run of
	// anything else one '-', so that it holds no "--".
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(netdev) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			b.WriteRune(r)
			dash = false
		} else {
			dash = true
		}
	}
	base := b.String()
	if n := maxLabel - len("--") - len(tail) - len(suffix); len(base) > n {
		base = strings.TrimRight(base[:max(n, 0)], "-")
	}
	if base == "" {
		base = "x"
	}
	return base + "--" + tail + suffix
}

// isLabel says whether s is a DNS label.
func isLabel(s string) bool {
	if s == "" || len(s) > maxLabel {
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
