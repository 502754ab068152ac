package daemon

import (
	"time"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/mover"
	"github.com/xdpq/xdpq/pkg/nic"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// movedGoldens are the records of testdata/moved-*.json: each file is
// what a daemon of that record version kept of a netdev it moved into a
// pod (an attachment's Moved), and every later daemon must read it as
// this record. The files of version 1 are json.Marshal of the
// movedRecord at commit 9d073c3, before the record had types of its own
// (so they have no version); they are never regenerated: a new version
// adds files of its own next to them.
var movedGoldens = []struct {
	file string
	rec  movedRecord
}{
	{
		// A VF with its driver in a hardware-steered pool: the direct
		// program in native mode through an exclusive link, RSS kept off
		// its reserved queues, busy polling, and the kernel's XDP
		// features (the top bit: the kernel answered).
		file: "moved-v1-vf.json",
		rec: movedRecord{
			Mover: mover.Record{
				Name: "ens1f0v3", Index: 12, Temp: "xdpq12", Kind: "device",
				Parent: "pci/0000:3b:02.3", PermAddr: "3c:fd:fe:00:00:03",
				Node: mover.State{MTU: 1500, MAC: "3c:fd:fe:00:00:03", AltNames: []string{"enp59s0f0v3"},
					TxQLen: 1000, Up: true, Multicast: true},
				IfName: "net1", MTU: 9000,
			},
			Netns: "/var/run/netns/cni-1a2b3c4d",
			Device: nic.Netdev{
				Name: "ens1f0v3", Ifindex: 12, Driver: "iavf", PCI: "0000:3b:02.3", Vendor: "8086", Device: "1889",
				NUMANode: 1, RXQueues: 4, TXQueues: 4, MAC: "3c:fd:fe:00:00:03", OperUp: true,
				XDP: nic.Features(1<<63) | nic.XDPBasic | nic.XDPRedirect | nic.XDPNdoXmit | nic.XSKZeroCopy | nic.XDPRXSG,
			},
			Policy: agent.Policy{
				Steering: agent.SteerHardware, Rules: agent.RuleRange{First: 1024, Count: 128},
				Reserved: []uint32{0, 1, 2, 3}, Mode: xdp.ModeNative,
				AttachAlways: true, Exclusive: true, Linger: 2 * time.Second, BusyPoll: true,
			},
		},
	},
	{
		// A veth in a software-steered pool with flows: the filter
		// program in generic mode, no reserved queues (nil), a linger of
		// its own; the kernel reported no XDP features.
		file: "moved-v1-veth.json",
		rec: movedRecord{
			Mover: mover.Record{
				Name: "xa", Index: 3, Temp: "xdpq3", Kind: "veth",
				Node:   mover.State{MTU: 1500, MAC: "02:58:44:50:51:01", TxQLen: 1000, Up: true},
				IfName: "net1",
			},
			Netns: "/var/run/netns/cni-77",
			Device: nic.Netdev{
				Name: "xa", Ifindex: 3, Virtual: true, NUMANode: -1, RXQueues: 2, TXQueues: 2,
				MAC: "02:58:44:50:51:01", OperUp: true,
			},
			Policy: agent.Policy{Steering: agent.SteerSoftware, Mode: xdp.ModeGeneric, Linger: 1500 * time.Millisecond},
		},
	},
	{
		// A pool that left everything to the agent: auto steering and
		// mode, the default rule range (zero), an empty list of reserved
		// queues (not nil).
		file: "moved-v1-auto.json",
		rec: movedRecord{
			Mover: mover.Record{
				Name: "eth3", Index: 7, Temp: "xdpq7", Kind: "device", Parent: "pci/0000:5e:00.1",
				Node:   mover.State{MTU: 1500, MAC: "b8:ce:f6:00:00:01", TxQLen: 1000},
				IfName: "eth1",
			},
			Netns: "/proc/4242/ns/net",
			Device: nic.Netdev{
				Name: "eth3", Ifindex: 7, Driver: "mlx5_core", PCI: "0000:5e:00.1", Vendor: "15b3", Device: "1017",
				RXQueues: 8, TXQueues: 8, MAC: "b8:ce:f6:00:00:01",
				XDP: nic.Features(1<<63) | nic.XDPBasic | nic.XDPRedirect,
			},
			Policy: agent.Policy{Steering: agent.SteerAuto, Reserved: []uint32{}, Mode: xdp.ModeAuto},
		},
	},
}
