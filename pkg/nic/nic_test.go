package nic

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/testing/testnet"
)

// fakeSysfs builds the part of a sysfs tree discovery reads: a PCI NIC
// (ice, two functions' worth of queues) and a veth.
func fakeSysfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	write := func(path, content string) {
		t.Helper()
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, path string) {
		t.Helper()
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	pci := "devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"
	write(pci+"/vendor", "0x8086\n")
	write(pci+"/device", "0x1592\n")
	write(pci+"/numa_node", "1\n")
	if err := os.MkdirAll(filepath.Join(root, "bus/pci/drivers/ice"), 0o755); err != nil {
		t.Fatal(err)
	}
	link("../../../../bus/pci/drivers/ice", pci+"/driver")
	link("../../../../bus/pci", pci+"/subsystem")
	write("class/net/eth1/ifindex", "7\n")
	write("class/net/eth1/address", "b4:96:91:00:00:01\n")
	write("class/net/eth1/operstate", "up\n")
	link("../../../"+pci, "class/net/eth1/device")
	for i := range 8 {
		if err := os.MkdirAll(filepath.Join(root, "class/net/eth1/queues", "rx-"+string(rune('0'+i))), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(root, "class/net/eth1/queues", "tx-"+string(rune('0'+i))), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("class/net/veth0/ifindex", "9\n")
	write("class/net/veth0/operstate", "down\n")
	if err := os.MkdirAll(filepath.Join(root, "class/net/veth0/queues/rx-0"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "class/net/veth0/queues/tx-0"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A netdev without ifindex is broken, not skipped.
	return root
}

func TestDiscoverFakeSysfs(t *testing.T) {
	d := Discoverer{SysRoot: fakeSysfs(t)}
	got, err := d.List()
	if err != nil {
		t.Fatal(err)
	}
	// The fake ifindexes name no real netdev, so the kernel reports no
	// XDP features for them.
	for i := range got {
		got[i].XDP = 0
	}
	want := []Netdev{
		{Name: "eth1", Ifindex: 7, Driver: "ice", PCI: "0000:3b:00.0", Vendor: "8086", Device: "1592",
			NUMANode: 1, RXQueues: 8, TXQueues: 8, MAC: "b4:96:91:00:00:01", OperUp: true},
		{Name: "veth0", Ifindex: 9, Virtual: true, NUMANode: -1, RXQueues: 1, TXQueues: 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	for _, bad := range []string{"", "..", "a/b"} {
		if _, err := d.Get(bad); err == nil {
			t.Errorf("Get(%q) accepted", bad)
		}
	}
	if _, err := d.Get("eth9"); err == nil {
		t.Error("a missing netdev was found")
	}
	if _, err := (Discoverer{SysRoot: t.TempDir()}).List(); err == nil {
		t.Error("a tree without class/net listed")
	}
}

// TestDiscoverVeth reads a real sysfs mounted from inside a network
// namespace, and the kernel's XDP features of veth.
func TestDiscoverVeth(t *testing.T) {
	p := testnet.NewPair(t, 4)
	sys := t.TempDir()
	if err := p.NS.Do(func(ns.NetNS) error { return unix.Mount("sysfs", sys, "sysfs", 0, "") }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(sys, unix.MNT_DETACH) })
	d := Discoverer{SysRoot: sys, NetNS: p.NSPath()}
	all, err := d.List()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, n := range all {
		names = append(names, n.Name)
	}
	if !reflect.DeepEqual(names, []string{"lo", "xa", "xb"}) {
		t.Fatalf("netdevs %v, want lo xa xb", names)
	}
	xa, err := d.Get("xa")
	if err != nil {
		t.Fatal(err)
	}
	if xa.Ifindex != p.A.Index || !xa.Virtual || xa.RXQueues != 4 || xa.TXQueues != 4 || xa.MAC != p.A.MAC.String() || !xa.OperUp {
		t.Errorf("xa: %+v", xa)
	}
	if !xa.XDP.Known() || !xa.XDP.Has(XDPBasic|XDPRedirect) || xa.XDP.Has(XSKZeroCopy) {
		t.Errorf("veth XDP features %v: want basic and redirect, no zero-copy", xa.XDP)
	}
}
