package main

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/xdpq/xdpq/pkg/api"
)

// TestStatusTable: every field status's table shows, in its column.
func TestStatusTable(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	uid := uint32(1000)
	s := &api.Status{
		Pools: []api.PoolStatus{
			{Name: "upf", Resource: "xdpq.io/upf", Queues: 8, Free: 2, Allocations: 3},
			{Name: "cp", Resource: "xdpq.io/cp", Queues: 0, Free: 0, Reason: "netdev eth9 not found"},
		},
		Allocations: 3,
		Attachments: 1,
		Netdevs: []api.NetdevStatus{
			{Netdev: "eth1", State: "Direct", Mode: "native", Steering: "ntuple", Flows: 2, UnknownFlows: 1, Sockets: []uint32{0, 1, 2, 3, 5, 6}, LinkUp: true},
			{Netdev: "eth2", State: "Overridden", Mode: "generic", Steering: "software", Reason: "a foreign program (prog 7 \"fw\")", PolicyError: "busy poll: EPERM"},
		},
		ConfigError: "pool cp: netdev eth9 not found",
		StateErrors: []string{"allocation upf-z: unexpected end of JSON input"},
	}
	l := &api.AllocationList{
		Allocations: []api.Allocation{
			{ID: "upf-a", Pool: "upf", Netdev: "eth1", Queues: []uint32{0, 1, 2, 3, 6}, UID: &uid, Lease: []uint32{0, 1, 2, 3, 6}, Holder: &api.Holder{PID: 4242, UID: 1000}, Created: now.Add(-90 * time.Second)},
			{ID: "upf-b", Pool: "upf", Netdev: "eth1", Queues: []uint32{4}, PodUID: "8d1c-uid", Created: now.Add(-3 * time.Hour)},
			{ID: "upf-c", Pool: "upf", Netdev: "eth1", Queues: []uint32{5}, PodUID: "77aa-uid", Pod: "ran/cu-0", Lease: []uint32{5}, Created: now.Add(-50 * time.Hour)},
		},
		Attachments: []api.AttachmentStatus{{Attachment: api.Attachment{
			CNIAddRequest: api.CNIAddRequest{ContainerID: "c0ffee0123456789c0ffee", IfName: "net1", PodNamespace: "ran", PodName: "cu-0",
				Netns: "/var/run/netns/cni-1", Flows: []api.CNIFlow{
					{Protocol: "udp", Dst: netip.MustParsePrefix("10.0.0.2/32"), DstPort: 2152},
					{Protocol: "tcp", Dst: netip.MustParsePrefix("10.0.0.0/24"), Src: netip.MustParsePrefix("10.9.0.0/16"), SrcPort: 80, VLAN: 5},
				}},
			AllocationID: "upf-c"}, State: "ending"}},
	}
	var b bytes.Buffer
	if err := printTable(&b, statusView{s, l}, now); err != nil {
		t.Fatal(err)
	}
	want := `POOL  RESOURCE     QUEUES  FREE  ALLOCATIONS  REASON
upf   xdpq.io/upf  8       2     3            -
cp    xdpq.io/cp   0       0     0            netdev eth9 not found

ALLOCATION  POOL  NETDEV  QUEUES  UID   POD       LEASE  HOLDER             AGE
upf-a       upf   eth1    0-3,6   1000  -         0-3,6  pid 4242 uid 1000  90s
upf-b       upf   eth1    4       -     8d1c-uid  -      -                  3h
upf-c       upf   eth1    5       -     ran/cu-0  5      -                  2d

CONTAINER     INTERFACE  NETNS                 ALLOCATION  POD       STATE   FLOWS
c0ffee012345  net1       /var/run/netns/cni-1  upf-c       ran/cu-0  ending  udp 10.0.0.2/32:2152, tcp 10.0.0.0/24 from 10.9.0.0/16:80 vlan 5

NETDEV  STATE       MODE     STEERING  FLOWS           SOCKETS  LINK  REASON
eth1    Direct      native   ntuple    2 (+1 unknown)  0-3,5-6  up    -
eth2    Overridden  generic  software  0               -        down  a foreign program (prog 7 "fw"); busy poll: EPERM

config: pool cp: netdev eth9 not found

record: allocation upf-z: unexpected end of JSON input
`
	if d := cmp.Diff(want, b.String()); d != "" {
		t.Errorf("table (-want +got):\n%s", d)
	}

	// The allocations command: the middle of status's.
	b.Reset()
	if err := printTable(&b, l, now); err != nil {
		t.Fatal(err)
	}
	if want := want[strings.Index(want, "ALLOCATION "):strings.Index(want, "\nNETDEV ")]; b.String() != want {
		t.Errorf("allocations (-want +got):\n%s", cmp.Diff(want, b.String()))
	}

	b.Reset()
	if err := printTable(&b, statusView{&api.Status{}, &api.AllocationList{}}, now); err != nil {
		t.Fatal(err)
	}
	if want := "no pools\n\nno allocations\n\nno CNI attachments\n\nno netdevs\n"; b.String() != want {
		t.Errorf("empty status: %q, want %q", b.String(), want)
	}
	b.Reset()
	if err := printTable(&b, &api.AllocationList{}, now); err != nil {
		t.Fatal(err)
	}
	if want := "no allocations\n\nno CNI attachments\n"; b.String() != want {
		t.Errorf("no allocations: %q, want %q", b.String(), want)
	}
}

func TestAge(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		ago  time.Duration
		want string
	}{{-time.Second, "0s"}, {0, "0s"}, {119 * time.Second, "119s"}, {2 * time.Minute, "2m"}, {119 * time.Minute, "119m"}, {2 * time.Hour, "2h"}, {47 * time.Hour, "47h"}, {48 * time.Hour, "2d"}} {
		if got := age(now, now.Add(-tt.ago)); got != tt.want {
			t.Errorf("age of %v: %q, want %q", tt.ago, got, tt.want)
		}
	}
	if got := age(now, time.Time{}); got != "-" {
		t.Errorf("age of zero time: %q", got)
	}
}
