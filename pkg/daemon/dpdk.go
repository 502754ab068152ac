package daemon

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/xdpq/xdpq/pkg/config"
)

// Where DPDK's af_xdp driver looks when it is given no dp_path: the
// socket at /tmp/afxdp_dp/<iface>/afxdp.sock (DPDK 23.11.2 and 24.07 on),
// /tmp/afxdp.sock before (23.03 to 23.11.1), and with use_pinned_map the
// XSKMAP at /tmp/afxdp_dp/<iface>/xsks_map (24.07 on).
const (
	dpdkSocket  = "afxdp.sock"
	dpdkDir     = "/tmp/afxdp_dp"
	dpdkOldPath = "/tmp/afxdp.sock"
	dpdkMapName = "xsks_map"
)

// dpdkLinks are the other paths of an allocation's socket for DPDK: its
// name afxdp.sock in the allocation's directory, and a path in a
// directory no container sees, the source of the /tmp/afxdp.sock mount
// (the allocation's directory is the container's to change: a mount's
// source there could be swapped for a symlink to any file of the node).
func (c *core) dpdkLinks(id string) []string {
	return []string{filepath.Join(c.allocDir(id), dpdkSocket), filepath.Join(c.opts.AllocDir, dpdkLinkDir, id+".sock")}
}

// dpdkLinkDir, in the allocation directory's parent, holds the second of
// dpdkLinks; only root may enter it.
const dpdkLinkDir = ".dpdk"

// pinsDPDKMap says whether pool p pins its netdevs' XSKMAPs for DPDK.
func pinsDPDKMap(p config.Pool) bool { return p.DPDK != nil && p.DPDK.PinnedMap }

// dpdkMapPin is where the XSKMAP of a netdev in its pod is pinned for
// DPDK's use_pinned_map; the pod's container sees it at
// /tmp/afxdp_dp/<iface>/xsks_map.
func dpdkMapPin(pinRoot, netdev string) string {
	return filepath.Join(pinRoot, "dpdk", netdev, dpdkMapName)
}

// pinDPDKMap pins the XSKMAP of a netdev in its pod for DPDK, if its pool
// asks for it (its attachment records the map as out, so the program
// stays attached: see podDatapath.XSKMapFD). A pin of the same map is
// kept: the pod's container may have it mounted already.
func (c *core) pinDPDKMap(pn *podNetdev, alloc string) error {
	a, ok := c.ledger.Get(alloc)
	if !ok {
		return nil
	}
	p, ok := c.ledger.Meta(a.Pool)
	if !ok || !pinsDPDKMap(p.Config) {
		return nil
	}
	fd, err := pn.agent.XSKMapFD(pn.rec.ifName())
	if err != nil {
		return err
	}
	m, err := ebpf.NewMapFromFD(fd)
	if err != nil {
		return err
	}
	defer func() { _ = m.Close() }() // a reference: the pin and the agent hold the map
	path := dpdkMapPin(c.pinRoot(), pn.rec.netdev())
	if old, err := ebpf.LoadPinnedMap(path, nil); err == nil {
		same := sameMap(old, m)
		_ = old.Close() // a reference only read
		if same {
			return nil
		}
		// Another map's pin (a previous netdev of that name): replaced.
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("replace the pin %s: %w", path, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	if err := m.Pin(path); err != nil {
		return fmt.Errorf("pin the XSKMAP of %s for DPDK: %w", pn.rec.netdev(), err)
	}
	return os.Chmod(path, 0o600)
}

func sameMap(a, b *ebpf.Map) bool {
	ia, err := a.Info()
	if err != nil {
		return false
	}
	ib, err := b.Info()
	if err != nil {
		return false
	}
	ida, ok := ia.ID()
	idb, ok2 := ib.ID()
	return ok && ok2 && ida == idb
}
