package mover

// goldens are the records of testdata/: each file is what a caller of a
// mover of that record version persisted, and every later mover must read
// it as this record. The files of version 1 are json.Marshal of the
// Record at commit 8f7147d, before the record had types of its own; they
// are never regenerated: a new version adds files of its own next to them.
var goldens = []struct {
	file string
	rec  Record
}{
	{
		// A VF with its driver: its hardware identity finds it.
		file: "v1-device.json",
		rec: Record{
			Name: "ens1f0v3", Index: 12, Temp: "xdpq12", Kind: "device",
			Parent: "pci/0000:3b:02.3", PermAddr: "3c:fd:fe:00:00:03",
			Node: State{MTU: 1500, MAC: "3c:fd:fe:00:00:03", Alias: "uplink vf3", AltNames: []string{"enp59s0f0v3"},
				TxQLen: 1000, Up: true, Promisc: true, AllMulti: true, Multicast: true},
			IfName: "eth1", MTU: 9000,
		},
	},
	{
		// A veth, down and with ARP off on the node, its MTU kept.
		file: "v1-veth.json",
		rec: Record{
			Name: "xa", Index: 3, Temp: "xdpq3", Kind: "veth",
			Node:   State{MTU: 1400, MAC: "02:58:44:50:51:01", TxQLen: 0, NoARP: true},
			IfName: "net1",
		},
	},
}
