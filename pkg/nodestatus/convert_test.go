package nodestatus_test

import (
	"net/netip"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xdpq/xdpq"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
	"github.com/xdpq/xdpq/pkg/nodestatus"
)

func TestConvert(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &api.Status{
		Pools: []api.PoolStatus{{Name: "rx", Resource: "xdpq.io/rx", Queues: 8, Free: 6}, {Name: "dpdk", Resource: "xdpq.io/dpdk", Queues: 2, Free: 2}},
		Netdevs: []api.NetdevStatus{
			{Netdev: "eth2", State: "Overridden", Mode: "native", Program: 77, Foreign: "fw", LinkUp: true, RXQueues: 4, Driver: "ice", PCI: "0000:3b:00.0", NUMANode: 1, ZeroCopy: true},
			{Netdev: "eth1", State: "Filter", Mode: "generic", Program: 12, Steering: "software", Flows: 2, LinkUp: true, RXQueues: 8, Reserved: []uint32{6, 7}, NUMANode: -1},
		},
		Allocations: 1,
		Attachments: 1,
		Config:      api.ConfigStatus{Hash: "deadbeefcafe0123456789", Loaded: t0.Add(1500 * time.Millisecond)},
	}
	l := &api.AllocationList{
		Allocations: []api.Allocation{{ID: "a1", Pool: "rx", Netdev: "eth1", Queues: []uint32{6, 7}, PodUID: "u1", Pod: "ns/p", Lease: []uint32{6, 7}}},
		Attachments: []api.AttachmentStatus{{Attachment: api.Attachment{AllocationID: "a1", CNIAddRequest: api.CNIAddRequest{Flows: []api.CNIFlow{
			{Protocol: "udp", Dst: netip.MustParsePrefix("10.0.0.2/32"), DstPort: 4789},
			{Protocol: "tcp", Dst: netip.MustParsePrefix("10.0.0.0/24"), Src: netip.MustParsePrefix("10.1.0.1/32"), SrcPort: 80, VLAN: 7},
		}}}}},
	}
	st := nodestatus.Convert(s, l, true, nil, t0)
	if got, want := st.Summary, (v1alpha1.Summary{Netdevs: 2, Overridden: 1, QueuesAllocated: 2, QueuesTotal: 10, Queues: "2/10", Allocations: 1, Config: "deadbeefcafe",
		Version: xdpq.Version()}); got != want {
		t.Errorf("summary %+v, want %+v", got, want)
	}
	if st.Netdevs[0].Name != "eth1" || st.Netdevs[1].Name != "eth2" {
		t.Errorf("netdevs not by name: %s, %s", st.Netdevs[0].Name, st.Netdevs[1].Name)
	}
	e1, e2 := st.Netdevs[0], st.Netdevs[1]
	if e1.State != v1alpha1.StateFilter || e1.ProgramName != "xdpq_filter" || e1.XDPMode != "generic" || len(e1.ReservedQueues) != 2 || e1.NUMANode != -1 {
		t.Errorf("eth1 %+v", e1)
	}
	if e2.State != v1alpha1.StateOverridden || e2.ForeignProgram != "fw" || e2.ProgramID != 77 || e2.Driver != "ice" || e2.PCIAddress != "0000:3b:00.0" || !e2.ZeroCopy || e2.NUMANode != 1 {
		t.Errorf("eth2 %+v", e2)
	}
	a := st.Allocations[0]
	if a.Pod == nil || *a.Pod != (v1alpha1.PodRef{Namespace: "ns", Name: "p", UID: "u1"}) || !a.LeaseConnected {
		t.Errorf("allocation %+v", a)
	}
	if len(a.Flows) != 2 || a.Flows[0] != "udp 10.0.0.2:4789" || a.Flows[1] != "tcp 10.0.0.0/24 from 10.1.0.1:80 vlan 7" {
		t.Errorf("flows %q", a.Flows)
	}
	if !st.Config.LastGoodReload.Equal(&metav1.Time{Time: t0.Add(time.Second)}) {
		t.Errorf("last good reload %v", st.Config.LastGoodReload)
	}
	cond := func(st v1alpha1.XdpqNodeStatus, typ string) metav1.Condition {
		c := meta.FindStatusCondition(st.Conditions, typ)
		if c == nil {
			t.Fatalf("no condition %s", typ)
		}
		return *c
	}
	if c := cond(st, v1alpha1.ConditionReady); c.Status != metav1.ConditionTrue {
		t.Errorf("Ready %+v", c)
	}
	if c := cond(st, v1alpha1.ConditionConfigValid); c.Status != metav1.ConditionTrue {
		t.Errorf("ConfigValid %+v", c)
	}
	if c := cond(st, v1alpha1.ConditionDegraded); c.Status != metav1.ConditionTrue || c.Reason != nodestatus.ReasonOverridden {
		t.Errorf("Degraded %+v", c)
	}

	// A condition keeps its transition time while its status stays.
	s.Netdevs[0].State, s.ConfigError = "None", "config.yaml: pools[0]: bad" // eth2
	t1 := t0.Add(time.Minute)
	st2 := nodestatus.Convert(s, l, true, st.Conditions, t1)
	if c := cond(st2, v1alpha1.ConditionReady); !c.LastTransitionTime.Time.Equal(t0) {
		t.Errorf("Ready moved to %v", c.LastTransitionTime)
	}
	if c := cond(st2, v1alpha1.ConditionDegraded); c.Status != metav1.ConditionFalse || !c.LastTransitionTime.Time.Equal(t1) {
		t.Errorf("Degraded %+v", c)
	}
	if c := cond(st2, v1alpha1.ConditionConfigValid); c.Status != metav1.ConditionFalse || c.Message != s.ConfigError {
		t.Errorf("ConfigValid %+v", c)
	}
	if st2.Netdevs[1].State != v1alpha1.StateIdle || st2.Summary.Config != "deadbeefcafe (refused newer)" {
		t.Errorf("eth2 %s, config %q", st2.Netdevs[1].State, st2.Summary.Config)
	}
}

// What pod churn changes waits for MinInterval; anything else is urgent.
func TestUrgent(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	base := func() *api.Status {
		return &api.Status{Pools: []api.PoolStatus{{Name: "rx", Queues: 8, Free: 8}},
			Netdevs: []api.NetdevStatus{{Netdev: "eth1", State: "Filter", LinkUp: true}}}
	}
	for _, tc := range []struct {
		name   string
		change func(*api.Status, *api.AllocationList)
		urgent bool
	}{
		{"nothing", func(*api.Status, *api.AllocationList) {}, false},
		{"allocation", func(s *api.Status, l *api.AllocationList) {
			l.Allocations = []api.Allocation{{ID: "a", Queues: []uint32{1}}}
			s.Allocations, s.Pools[0].Allocations = 1, 1
			s.Pools[0].Free--
		}, false},
		{"flows", func(s *api.Status, _ *api.AllocationList) { s.Netdevs[0].Flows = 3 }, false},
		{"state", func(s *api.Status, _ *api.AllocationList) { s.Netdevs[0].State = "Overridden" }, true},
		{"link", func(s *api.Status, _ *api.AllocationList) { s.Netdevs[0].LinkUp = false }, true},
		{"netdev gone", func(s *api.Status, _ *api.AllocationList) { s.Netdevs = nil }, true},
		{"config", func(s *api.Status, _ *api.AllocationList) { s.ConfigError = "refused" }, true},
		{"pool capacity", func(s *api.Status, _ *api.AllocationList) { s.Pools[0].Queues, s.Pools[0].Free = 4, 4 }, true},
	} {
		prev := nodestatus.Convert(base(), &api.AllocationList{}, true, nil, t0)
		s, l := base(), &api.AllocationList{}
		tc.change(s, l)
		next := nodestatus.Convert(s, l, true, prev.Conditions, t0.Add(time.Second))
		if got := nodestatus.Urgent(&prev, &next); got != tc.urgent {
			t.Errorf("%s: urgent %v, want %v", tc.name, got, tc.urgent)
		}
	}
}
