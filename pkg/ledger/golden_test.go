package ledger

import (
	"net/netip"
	"time"

	"github.com/xdpq/xdpq/pkg/api"
)

// goldens are the allocations of the record files in testdata/: each
// file is what a daemon of that record version wrote of its allocation,
// and every later daemon must read it as this allocation. The files of
// version 1 were written by store.write at commit 8f7147d, before the
// record had types of its own; they are never regenerated: a new
// version adds files of its own next to them.
var goldens = []struct {
	file  string
	alloc Allocation
}{
	{
		// Standalone: a user's allocation, by uid.
		file: "v1-uid.json",
		alloc: Allocation{
			ID: "upf-0123456789ab", Pool: "upf", Resource: "xdpq.io/upf", Netdev: "eth1",
			Queues: []uint32{2, 3}, Devices: []string{"eth1-q2", "eth1-q3"},
			Owner: Owner{UID: ptr(uint32(1000))}, Created: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC), State: Active,
		},
	},
	{
		// Kubelet's Allocate for a restarted container: any pod may use
		// it until its CNI ADD names the pod; it succeeds an allocation
		// of the same devices. Written at a local time east of UTC.
		file: "v1-kubelet-replaces.json",
		alloc: Allocation{
			ID: "upf-00000000cafe", Pool: "upf", Resource: "xdpq.io/upf", Netdev: "eth1",
			Queues: []uint32{4}, Devices: []string{"eth1-q4"},
			Owner:   Owner{AnyPod: true},
			Created: time.Date(2026, 12, 3, 13, 0, 1, 500, time.FixedZone("CET", 3600)), State: Active,
			Replaces: []string{"upf-0000000beef0"},
		},
	},
	{
		// A pod's allocation with a queue-mode attachment steering flows:
		// udp and tcp, IPv4 and IPv6, ports, a source, a vlan.
		file: "v1-pod-queue.json",
		alloc: Allocation{
			ID: "upf-a1b2c3d4e5f6", Pool: "upf", Resource: "xdpq.io/upf", Netdev: "ens1f0",
			Queues: []uint32{8, 9}, Devices: []string{"ens1f0-q8", "ens1f0-q9"},
			Owner:   Owner{PodUID: "8d1c7a0e-5d0b-4b8e-9b7e-1f2a3b4c5d6e"},
			Created: time.Date(2026, 12, 3, 12, 30, 15, 123456789, time.UTC), State: Active,
			Attachments: []Attachment{{
				Attachment: api.Attachment{
					CNIAddRequest: api.CNIAddRequest{
						ContainerID: "4f1e2d3c4b5a", IfName: "net1",
						Resource: "xdpq.io/upf", DeviceID: "ens1f0-q8",
						PodUID: "8d1c7a0e-5d0b-4b8e-9b7e-1f2a3b4c5d6e", PodNamespace: "core", PodName: "upf-0",
						Flows: []api.CNIFlow{
							{Protocol: "udp", Dst: netip.MustParsePrefix("10.0.0.5/32"), DstPort: 2152},
							{Protocol: "tcp", Dst: netip.MustParsePrefix("10.0.0.0/24"), DstPort: 8805,
								Src: netip.MustParsePrefix("192.168.7.0/24"), SrcPort: 40000, VLAN: 100},
							{Protocol: "udp", Dst: netip.MustParsePrefix("2001:db8::5/128"), DstPort: 2152, VLAN: 4094},
						},
						Netns:   "/var/run/netns/cni-5e6f7a8b",
						Chained: true,
					},
					AllocationID: "upf-a1b2c3d4e5f6", Netdev: "ens1f0", Queues: []uint32{8, 9},
					Mode: api.ModeQueue, NetnsInode: 4026532801,
				},
				State: Active,
			}},
		},
	},
	{
		// A netdev-mode pool's netdev moved into a pod, its XSKMAP handed
		// out; the standalone API named the allocation.
		file: "v1-netdev.json",
		alloc: Allocation{
			ID: "vf-0a0b0c0d0e0f", Pool: "vf", Resource: "xdpq.io/vf", Netdev: "ens1f0v3",
			Queues: []uint32{0, 1}, Devices: []string{"ens1f0v3"},
			Owner:   Owner{PodUID: "0e9d8c7b-6a59-4837-a625-140f0e0d0c0b"},
			Created: time.Date(2026, 12, 4, 8, 15, 0, 0, time.UTC), State: Active,
			Attachments: []Attachment{{
				Attachment: api.Attachment{
					CNIAddRequest: api.CNIAddRequest{
						ContainerID: "9a8b7c6d5e4f", IfName: "eth1", Allocation: "vf-0a0b0c0d0e0f",
						PodUID: "0e9d8c7b-6a59-4837-a625-140f0e0d0c0b", PodNamespace: "ran", PodName: "du-0",
						Netns: "/var/run/netns/cni-1a2b3c4d", MTU: 9000,
					},
					AllocationID: "vf-0a0b0c0d0e0f", Netdev: "ens1f0v3", Queues: []uint32{0, 1},
					Mode: api.ModeNetdev, Mac: "02:00:00:aa:bb:03", NetnsInode: 4026532950,
				},
				State:  Active,
				Moved:  []byte(`{"mover":{"name":"ens1f0v3","index":12,"temp":"xdpq12","kind":"device","node":{"mtu":1500,"txQLen":1000,"up":true,"promisc":false,"allMulti":false,"noARP":false,"multicast":true},"ifName":"eth1","mtu":9000},"netns":"/var/run/netns/cni-1a2b3c4d"}`),
				MapOut: true,
			}},
		},
	},
	{
		// An allocation being freed while a client of the broker holds
		// its lease.
		file: "v1-ending-lease.json",
		alloc: Allocation{
			ID: "upf-ffeeddccbbaa", Pool: "upf", Resource: "xdpq.io/upf", Netdev: "eth1",
			Queues: []uint32{0, 1}, Devices: []string{"eth1-q0", "eth1-q1"},
			Owner:   Owner{UID: ptr(uint32(0))},
			Created: time.Date(2026, 12, 3, 11, 59, 59, 999000000, time.UTC), State: Ending,
			Lease: []LeaseSocket{{Queue: 0, Inode: 81234}, {Queue: 1, Inode: 81235}},
		},
	},
	{
		// An attachment being made (its ADD in progress, found by the
		// pod's namespace and name) and another being undone.
		file: "v1-pending-attachment.json",
		alloc: Allocation{
			ID: "upf-123456abcdef", Pool: "upf", Netdev: "eth2",
			Queues: []uint32{5}, Devices: []string{"eth2-q5"},
			Owner:   Owner{PodUID: "11111111-2222-3333-4444-555555555555"},
			Created: time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC), State: Active,
			Attachments: []Attachment{
				{
					Attachment: api.Attachment{
						CNIAddRequest: api.CNIAddRequest{
							ContainerID: "c0ffee", IfName: "net1", PodNamespace: "core", PodName: "smf-1",
							Flows: []api.CNIFlow{{Protocol: "udp", Dst: netip.MustParsePrefix("10.1.0.7/32"), DstPort: 8805}},
							Netns: "/var/run/netns/cni-77",
						},
						AllocationID: "upf-123456abcdef", Netdev: "eth2", Queues: []uint32{5}, Mode: api.ModeQueue,
					},
					State: Pending,
				},
				{
					Attachment: api.Attachment{
						CNIAddRequest: api.CNIAddRequest{ContainerID: "decaf0", IfName: "net2"},
						AllocationID:  "upf-123456abcdef", Netdev: "eth2", Queues: []uint32{5}, Mode: api.ModeQueue,
					},
					State: Ending,
				},
			},
		},
	},
}

func ptr[T any](v T) *T { return &v }
