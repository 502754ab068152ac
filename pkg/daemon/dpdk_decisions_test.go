package daemon

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
)

// TestDPDKAllocateDecisions: what kubelet's Allocate gives a container
// of a netdev-mode pool with dpdk set, so that DPDK's af_xdp driver
// finds the allocation without dp_path: the allocation's directory at
// /run/xdpq and at /tmp/afxdp_dp/<iface> (its socket there as
// afxdp.sock), the socket by a name outside the directory at
// /tmp/afxdp.sock (DPDK before 23.11.2), and with pinnedMap the netdev's
// pinned XSKMAP, read-only; the broker serves the socket under those
// names. A pool without dpdk gets /run/xdpq alone and no other name. A
// decision of the device plugin face and the core on a fake node;
// TestKubernetesDPDKPaths checks the same paths on veth with a pod.
func TestDPDKAllocateDecisions(t *testing.T) {
	for _, c := range []struct {
		name   string
		dpdk   string // the pool's dpdk, YAML; "" none
		mounts func(d *Daemon, id string) map[string]string
		links  func(d *Daemon, id string) []string
	}{
		{name: "dpdk with the pinned map", dpdk: "{iface: net1, pinnedMap: true}",
			mounts: func(d *Daemon, id string) map[string]string {
				return map[string]string{
					"/run/xdpq":                   d.core.allocDir(id),
					"/tmp/afxdp_dp/net1":          d.core.allocDir(id),
					"/tmp/afxdp.sock":             filepath.Join(d.opts.AllocDir, ".dpdk", id+".sock"),
					"/tmp/afxdp_dp/net1/xsks_map": filepath.Join(d.core.pinRoot(), "dpdk", "xa", "xsks_map") + " (read-only)",
				}
			},
			links: func(d *Daemon, id string) []string {
				return []string{filepath.Join(d.core.allocDir(id), "afxdp.sock"), filepath.Join(d.opts.AllocDir, ".dpdk", id+".sock")}
			}},
		{name: "dpdk", dpdk: "{iface: eth7}",
			mounts: func(d *Daemon, id string) map[string]string {
				return map[string]string{
					"/run/xdpq":          d.core.allocDir(id),
					"/tmp/afxdp_dp/eth7": d.core.allocDir(id),
					"/tmp/afxdp.sock":    filepath.Join(d.opts.AllocDir, ".dpdk", id+".sock"),
				}
			},
			links: func(d *Daemon, id string) []string {
				return []string{filepath.Join(d.core.allocDir(id), "afxdp.sock"), filepath.Join(d.opts.AllocDir, ".dpdk", id+".sock")}
			}},
		{name: "no dpdk",
			mounts: func(d *Daemon, id string) map[string]string {
				return map[string]string{"/run/xdpq": d.core.allocDir(id)}
			},
			links: func(*Daemon, string) []string { return nil }},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newFakeNode(t, fakeNetdev("xa", 2))
			n.kubelet = fakeKubelet{err: errors.New("not asked")}
			cfg := "pools: [{name: vf, mode: netdev, devices: {netdevs: [xa]}"
			if c.dpdk != "" {
				cfg += ", dpdk: " + c.dpdk
			}
			d := n.started(cfg + "}]\n")
			ctx := context.Background()
			resp, err := d.plugins.Allocate(ctx, "vf", []string{"xa"})
			if err != nil {
				t.Fatal(err)
			}
			id := resp.Envs["XDPQ_ALLOCATION"]
			got := map[string]string{}
			for _, m := range resp.Mounts {
				got[m.ContainerPath] = m.HostPath
				if m.ReadOnly {
					got[m.ContainerPath] += " (read-only)"
				}
			}
			if want := c.mounts(d, id); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("mounts\n%v\nwant\n%v", got, want)
			}
			n.broker.mu.Lock()
			served := n.broker.served[id]
			n.broker.mu.Unlock()
			if want := c.links(d, id); !slices.Equal(served.Links, want) {
				t.Errorf("the broker serves the socket also as %v, want %v", served.Links, want)
			}
		})
	}
}
