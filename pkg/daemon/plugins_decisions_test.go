package daemon

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/deviceplugin"
)

// TestDevicePluginFace: kubelet's Allocate and ListAndWatch as the
// device plugin face answers them over a core with fake kernel parts (no
// root): the container's environment and mount name its allocation, a
// PCI netdev's devices get device-info files for CNI meta-plugins, and
// those files go when the core frees the allocation (a change the face
// hears by subscription, not a call from the core); a netdev whose link
// is down makes its devices unhealthy; an uninstall refuses Allocate.
func TestDevicePluginFace(t *testing.T) {
	xa := fakeNetdev("xa", 4)
	xa.PCI = "0000:3b:00.0"
	n := newFakeNode(t, xa)
	n.kubelet = fakeKubelet{err: errors.New("not asked")}
	d, _ := n.daemon("pools: [{name: upf-v4, steering: software, devices: {netdevs: ['xa#0-3']}}]\n")
	if err := d.core.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	resp, err := d.plugins.Allocate(ctx, "upf-v4", []string{"xa-q1", "xa-q2"})
	if err != nil {
		t.Fatal(err)
	}
	a, ok := d.core.ledger.Get(d.core.ledger.Holder("upf-v4", "xa-q1"))
	if !ok || !slices.Equal(a.Queues, []uint32{1, 2}) {
		t.Fatalf("allocation %+v; want queues 1 and 2 of xa", a)
	}
	want := map[string]string{"XDPQ_SOCKET": "/run/xdpq/xdpq.sock", "XDPQ_ALLOCATION": a.ID,
		"XDPQ_QUEUES_UPF_V4": "xa:1,xa:2", "XDPQ_NETDEV_UPF_V4": "xa"}
	for k, v := range want {
		if resp.Envs[k] != v {
			t.Errorf("env %s=%q; want %q (all: %v)", k, resp.Envs[k], v, resp.Envs)
		}
	}
	if len(resp.Mounts) != 1 || resp.Mounts[0].ContainerPath != "/run/xdpq" || resp.Mounts[0].HostPath != d.core.allocDir(a.ID) {
		t.Errorf("mounts %+v; want the allocation's directory at /run/xdpq alone", resp.Mounts)
	}
	infos := func() []string {
		var out []string
		for _, dev := range []string{"xa-q0", "xa-q1", "xa-q2", "xa-q3"} {
			b, err := os.ReadFile(deviceplugin.DeviceInfoPath(d.opts.DeviceInfoDir, "xdpq.io/upf-v4", dev))
			if err == nil && strings.Contains(string(b), xa.PCI) {
				out = append(out, dev)
			}
		}
		return out
	}
	if got := infos(); !slices.Equal(got, []string{"xa-q1", "xa-q2"}) {
		t.Errorf("device-info files of %v; want the allocated devices'", got)
	}
	if err := d.core.free(ctx, a.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if got := infos(); len(got) > 0 {
		t.Errorf("freed, and the device-info files of %v remain", got)
	}
	// A resource renamed (resourcePrefix) while an allocation holds its
	// devices: its files, made under the old name, go with it.
	if _, err := d.plugins.Allocate(ctx, "upf-v4", []string{"xa-q0"}); err != nil {
		t.Fatal(err)
	}
	n.reload(d, "resourcePrefix: example.com\npools: [{name: upf-v4, steering: software, devices: {netdevs: ['xa#0-3']}}]\n")
	a, _ = d.core.ledger.Get(d.core.ledger.Holder("upf-v4", "xa-q0"))
	if err := d.core.free(ctx, a.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(deviceplugin.DeviceInfoPath(d.opts.DeviceInfoDir, "xdpq.io/upf-v4", "xa-q0")); err == nil {
		t.Error("freed after its resource was renamed, and its device-info file remains")
	}

	healthy := func() map[string]bool {
		out := map[string]bool{}
		for _, dv := range (pluginsCore{d.core}).Devices("upf-v4") {
			out[dv.ID] = dv.Healthy
		}
		return out
	}
	if h := healthy(); len(h) != 4 || !h["xa-q0"] || !h["xa-q3"] {
		t.Errorf("devices %v; want the pool's four, healthy", h)
	}
	n.agent.mu.Lock()
	n.agent.down = map[string]bool{"xa": true}
	n.agent.mu.Unlock()
	if h := healthy(); len(h) != 4 || h["xa-q0"] || h["xa-q3"] {
		t.Errorf("devices with xa's link down: %v; want every one unhealthy", h)
	}

	d.core.refuseNew()
	if _, err := d.plugins.Allocate(ctx, "upf-v4", []string{"xa-q0"}); !errors.Is(err, api.ErrUnavailable) {
		t.Errorf("allocate while uninstalling: %v; want it refused as unavailable", err)
	}
}

// TestDeviceInfoOfAPoolGone: an allocation whose pool left the config
// before a restart keeps its devices, and its device-info files go when
// it is freed, by the resource its record keeps (the restarted daemon's
// ledger knows the pool by its records alone, without a resource).
func TestDeviceInfoOfAPoolGone(t *testing.T) {
	xa := fakeNetdev("xa", 4)
	xa.PCI = "0000:3b:00.0"
	n := newFakeNode(t, xa)
	n.kubelet = fakeKubelet{err: errors.New("not asked")} // restores every allocation
	ctx := context.Background()
	d, stop := n.daemon("pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-3']}}]\n")
	if err := d.core.start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.plugins.Allocate(ctx, "upf", []string{"xa-q1"}); err != nil {
		t.Fatal(err)
	}
	id := d.core.ledger.Holder("upf", "xa-q1")
	file := deviceplugin.DeviceInfoPath(d.opts.DeviceInfoDir, "xdpq.io/upf", "xa-q1")
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("the device-info file: %v", err)
	}
	stop()
	d, _ = n.daemon("pools: []\n")
	if err := d.core.start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.core.free(ctx, id, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); err == nil {
		t.Error("the allocation of a pool gone is freed, and its device-info file remains")
	}
}
