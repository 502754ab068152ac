package agent_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/ethtool"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// The decisions of hardware steering (which rule goes where, what is
// refused, what a failure undoes, what a restarted agent adopts) on the
// fake NIC, without an agent and so without root. The tests through an
// agent on veth (steering_test.go) show the same rules reaching a NIC's
// table with the programs attached.

func udpFlow(dst string, port uint16, queues ...uint32) agent.Flow {
	return agent.Flow{Protocol: xdp.UDP, Dst: host(dst), DstPort: port, Queues: queues}
}

// ruleAt is the rule the fake NIC has at loc, as "type dst:port -> queue
// q" or "... -> context c".
func ruleAt(f *fakeNtupleNIC, loc uint32) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.rules[loc]
	if !ok {
		return ""
	}
	if r.RSSContext != 0 {
		return fmt.Sprintf("%v %v:%d -> context %d", r.Type, r.Dst.Addr(), r.DstPort, r.RSSContext)
	}
	return fmt.Sprintf("%v %v:%d -> queue %d", r.Type, r.Dst.Addr(), r.DstPort, r.Queue)
}

// TestHardwareSteeringAdd: an owner's flows take the first free
// locations of the policy's rule range, one rule each, a flow over
// several queues through an RSS context of its own; what cannot be
// steered is refused before the NIC is touched, a flow that overlaps
// another owner's is a conflict naming it, a full range and a NIC that
// fails midway undo the whole request and leave the owners' earlier
// flows in place.
func TestHardwareSteeringAdd(t *testing.T) {
	nic := newFakeNtupleNIC(4)
	s := agent.NewHardwareSteering(nic, "eth1", agent.RuleRange{First: 100, Count: 4}, 4)
	if err := s.Add("pod-a", []agent.Flow{udpFlow("10.0.0.1", 53, 1), {Protocol: xdp.TCP, Dst: host("fd00::1"), DstPort: 80, Queues: []uint32{2}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Add("pod-b", []agent.Flow{udpFlow("10.0.0.2", 2152, 2, 3)}); err != nil {
		t.Fatal(err)
	}
	for loc, want := range map[uint32]string{100: "udp4 10.0.0.1:53 -> queue 1", 101: "tcp6 fd00::1:80 -> queue 2", 102: "udp4 10.0.0.2:2152 -> context 1"} {
		if got := ruleAt(nic, loc); got != want {
			t.Errorf("location %d: %q, want %q", loc, got, want)
		}
	}
	nic.mu.Lock()
	contexts := maps.Clone(nic.contexts)
	nic.mu.Unlock()
	if len(contexts) != 1 || !slices.Equal(contexts[1], []uint32{2, 3}) {
		t.Errorf("rss contexts %v, want context 1 over queues 2 and 3", contexts)
	}

	for _, c := range []struct {
		name  string
		flows []agent.Flow
		kind  error
		says  string
	}{
		{"no protocol", []agent.Flow{{Dst: host("10.0.0.9"), Queues: []uint32{0}}}, agent.ErrFlowInvalid, "protocol must be tcp or udp"},
		{"no destination", []agent.Flow{{Protocol: xdp.UDP, Queues: []uint32{0}}}, agent.ErrFlowInvalid, "no destination address"},
		{"vlan out of range", []agent.Flow{{Protocol: xdp.UDP, Dst: host("10.0.0.9"), VLAN: 4095, Queues: []uint32{0}}}, agent.ErrFlowInvalid, "vlan out of range"},
		{"a queue the netdev lacks", []agent.Flow{udpFlow("10.0.0.9", 1, 4)}, agent.ErrFlowInvalid, "the netdev has 4 queues"},
		{"a queue twice", []agent.Flow{udpFlow("10.0.0.9", 1, 1, 1)}, agent.ErrFlowInvalid, "queue 1 given twice"},
		{"its own flows overlapping on other queues", []agent.Flow{udpFlow("10.0.0.9", 0, 0), udpFlow("10.0.0.9", 7, 1)},
			agent.ErrFlowInvalid, "overlap on different queues"},
		{"another owner's flow", []agent.Flow{udpFlow("10.0.0.1", 0, 0)}, agent.ErrFlowConflict, "overlaps flow udp 10.0.0.1/32 port 53 -> queues [1] of pod-a"},
		{"more than the range holds", []agent.Flow{udpFlow("10.0.0.9", 1, 0), udpFlow("10.0.0.9", 2, 0)}, agent.ErrFlowsFull,
			"all 4 rule locations from 100 are in use"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := s.Add("pod-c", c.flows)
			if !errors.Is(err, c.kind) || !strings.Contains(fmt.Sprint(err), c.says) {
				t.Fatalf("steer: %v; want %v saying %q", err, c.kind, c.says)
			}
			if got := nic.locs(); !slices.Equal(got, []uint32{100, 101, 102}) {
				t.Errorf("rules at %v after the refusal, want the earlier three alone", got)
			}
			if err := s.Verify("pod-c"); err == nil {
				t.Error("the refused owner holds flows")
			}
		})
	}

	// The NIC fails the second rule of a request: the first goes again.
	s2 := agent.NewHardwareSteering(nic, "eth1", agent.RuleRange{First: 200, Count: 8}, 4)
	nic.mu.Lock()
	nic.failNext = 2
	nic.mu.Unlock()
	err := s2.Add("pod-d", []agent.Flow{udpFlow("10.0.1.1", 1, 0), udpFlow("10.0.1.1", 2, 0)})
	if err == nil || !strings.Contains(err.Error(), "out of filter resources") {
		t.Fatalf("steer with the NIC failing: %v", err)
	}
	if got := nic.locs(); !slices.Equal(got, []uint32{100, 101, 102}) {
		t.Errorf("rules at %v after the NIC failed, want the earlier three alone", got)
	}
	for _, owner := range []string{"pod-a", "pod-b"} {
		if err := s.Verify(owner); err != nil {
			t.Errorf("%s: %v", owner, err)
		}
	}

	// An owner removed frees its locations (and its RSS context) for the next.
	if err := s.RemoveOwner("pod-b"); err != nil {
		t.Fatal(err)
	}
	nic.mu.Lock()
	left := len(nic.contexts)
	nic.mu.Unlock()
	if left != 0 {
		t.Errorf("%d rss contexts left after their flow went", left)
	}
	if err := s.Add("pod-c", []agent.Flow{udpFlow("10.0.0.9", 1, 0), udpFlow("10.0.0.9", 2, 0)}); err != nil {
		t.Fatalf("steer once pod-b's location is free: %v", err)
	}
	if got := nic.locs(); !slices.Equal(got, []uint32{100, 101, 102, 103}) {
		t.Errorf("rules at %v, want 100-103", got)
	}
}

// TestHardwareSteeringRepair: verify reads the NIC, not the agent's
// record: a rule deleted or replaced behind xdpq's back fails it, naming
// the location; repair puts the owner's rule back where it was
// (replacing a stranger's in xdpq's range) and says how many of each
// owner's flows it put back; then verify passes again.
func TestHardwareSteeringRepair(t *testing.T) {
	nic := newFakeNtupleNIC(4)
	s := agent.NewHardwareSteering(nic, "eth1", agent.RuleRange{First: 10, Count: 8}, 4)
	if err := s.Add("pod-a", []agent.Flow{udpFlow("10.0.0.1", 53, 1), udpFlow("10.0.0.1", 54, 1)}); err != nil {
		t.Fatal(err)
	}
	if err := s.Add("pod-b", []agent.Flow{udpFlow("10.0.0.2", 53, 2)}); err != nil {
		t.Fatal(err)
	}
	// An operator's ethtool: pod-a's second rule deleted, pod-b's
	// replaced by a rule of theirs.
	if err := nic.DeleteRule("eth1", 11); err != nil {
		t.Fatal(err)
	}
	nic.mu.Lock()
	nic.rules[12] = ethtool.Rule{Location: 12, Type: ethtool.TCP4, Dst: host("192.0.2.1"), DstPort: 22, Queue: 0}
	nic.mu.Unlock()
	for owner, loc := range map[string]int{"pod-a": 11, "pod-b": 12} {
		if err := s.Verify(owner); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("at location %d is missing or changed", loc)) {
			t.Errorf("verify %s: %v; want its rule at %d missing", owner, err, loc)
		}
	}
	back, err := s.Repair()
	if err != nil {
		t.Fatal(err)
	}
	if back["pod-a"] != 1 || back["pod-b"] != 1 || len(back) != 2 {
		t.Errorf("repair put back %v, want one flow of each", back)
	}
	for loc, want := range map[uint32]string{10: "udp4 10.0.0.1:53 -> queue 1", 11: "udp4 10.0.0.1:54 -> queue 1", 12: "udp4 10.0.0.2:53 -> queue 2"} {
		if got := ruleAt(nic, loc); got != want {
			t.Errorf("location %d after repair: %q, want %q", loc, got, want)
		}
	}
	for _, owner := range []string{"pod-a", "pod-b"} {
		if err := s.Verify(owner); err != nil {
			t.Errorf("verify %s after repair: %v", owner, err)
		}
	}
	if back, err := s.Repair(); err != nil || len(back) != 0 {
		t.Errorf("a second repair: %v, %v; want nothing to do", back, err)
	}
}

// TestHardwareSteeringSync: a restarted agent finds the rules the
// previous one installed. Sync gives the owners it is told of the rules
// of their flows, and removes the other rules in xdpq's range (or, with
// keepUnknown, keeps them as unknown: their flows are then refused to
// anyone until a sync without it settles them); rules outside the range
// are never touched.
func TestHardwareSteeringSync(t *testing.T) {
	nic := newFakeNtupleNIC(4)
	rules := agent.RuleRange{First: 10, Count: 8}
	before := agent.NewHardwareSteering(nic, "eth1", rules, 4)
	kept := []agent.Flow{udpFlow("10.0.0.1", 53, 1), udpFlow("10.0.0.1", 2152, 2, 3)}
	gone := []agent.Flow{udpFlow("10.0.0.2", 53, 2)}
	if err := before.Add("pod-a", kept); err != nil {
		t.Fatal(err)
	}
	if err := before.Add("pod-gone", gone); err != nil {
		t.Fatal(err)
	}
	outside := ethtool.Rule{Location: 2, Type: ethtool.TCP4, Dst: host("192.0.2.1"), DstPort: 22, Queue: 0}
	if err := nic.AddRule("eth1", outside); err != nil {
		t.Fatal(err)
	}

	// Keeping the unknown: pod-gone's rule stays, its flow refused.
	after := agent.NewHardwareSteering(nic, "eth1", rules, 4)
	if n, err := after.Sync(map[string][]agent.Flow{"pod-a": kept}, true); err != nil || n != 0 {
		t.Fatalf("sync keeping the unknown: %d removed, %v", n, err)
	}
	if err := after.Verify("pod-a"); err != nil {
		t.Errorf("pod-a after the sync: %v", err)
	}
	if got := nic.locs(); !slices.Equal(got, []uint32{2, 10, 11, 12}) {
		t.Errorf("rules at %v, want all kept", got)
	}
	if err := after.Add("pod-new", gone); !errors.Is(err, agent.ErrFlowConflict) || !strings.Contains(err.Error(), "installed by a previous agent") {
		t.Errorf("a flow of the unknown rule: %v; want a conflict", err)
	}

	// Settled: the unknown rule goes, the one outside the range stays.
	after = agent.NewHardwareSteering(nic, "eth1", rules, 4)
	if n, err := after.Sync(map[string][]agent.Flow{"pod-a": kept}, false); err != nil || n != 1 {
		t.Fatalf("sync: %d removed, %v; want pod-gone's rule", n, err)
	}
	if got := nic.locs(); !slices.Equal(got, []uint32{2, 10, 11}) {
		t.Errorf("rules at %v, want 2 (not xdpq's), 10 and 11 (pod-a's)", got)
	}
	if err := after.Verify("pod-a"); err != nil {
		t.Errorf("pod-a after the sync: %v", err)
	}
	if err := after.Add("pod-new", gone); err != nil {
		t.Errorf("pod-gone's flow once its rule went: %v", err)
	}
}

// TestHardwareSteeringSetRange: a new rule range moves the rules outside
// it into it (added at the new location first, then removed from the
// old), keeps those inside where they are, and refuses a range without
// room for every flow with nothing moved.
func TestHardwareSteeringSetRange(t *testing.T) {
	nic := newFakeNtupleNIC(4)
	s := agent.NewHardwareSteering(nic, "eth1", agent.RuleRange{First: 10, Count: 4}, 4)
	if err := s.Add("pod-a", []agent.Flow{udpFlow("10.0.0.1", 1, 0), udpFlow("10.0.0.1", 2, 0), udpFlow("10.0.0.1", 3, 0)}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetRange(agent.RuleRange{First: 11, Count: 2}); err == nil || !strings.Contains(err.Error(), "has no room for the 3 flows") {
		t.Fatalf("a range too small: %v", err)
	}
	if got := nic.locs(); !slices.Equal(got, []uint32{10, 11, 12}) {
		t.Errorf("rules at %v after a refused range, want them where they were", got)
	}
	if err := s.SetRange(agent.RuleRange{First: 11, Count: 8}); err != nil {
		t.Fatal(err)
	}
	if got := nic.locs(); !slices.Equal(got, []uint32{11, 12, 13}) {
		t.Errorf("rules at %v, want 11 and 12 kept and 10's moved to 13", got)
	}
	if got := ruleAt(nic, 13); got != "udp4 10.0.0.1:1 -> queue 0" {
		t.Errorf("the moved rule: %q", got)
	}
	if err := s.Verify("pod-a"); err != nil {
		t.Errorf("after the move: %v", err)
	}
}
