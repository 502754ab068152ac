package agent_test

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/ethtool"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// fakeNtupleNIC stands in for a NIC with ntuple filters and RSS, which no
// device on this machine has. It keeps rules and the indirection table in
// memory and checks what a driver checks.
type fakeNtupleNIC struct {
	mu       sync.Mutex
	rules    map[uint32]ethtool.Rule
	indir    []uint32
	contexts map[uint32][]uint32
	failNext int // fail the insert after this many more succeed (0: never)
}

func newFakeNtupleNIC(queues int) *fakeNtupleNIC {
	f := &fakeNtupleNIC{rules: map[uint32]ethtool.Rule{}, contexts: map[uint32][]uint32{}}
	for i := range 128 {
		f.indir = append(f.indir, uint32(i%queues))
	}
	return f
}

func (f *fakeNtupleNIC) RuleTable(string) (uint32, bool, error) { return 1024, false, nil }

func (f *fakeNtupleNIC) AddRule(_ string, r ethtool.Rule) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failNext > 0 {
		if f.failNext--; f.failNext == 0 {
			return errors.New("fake: out of filter resources")
		}
	}
	if _, ok := f.rules[r.Location]; ok {
		return fmt.Errorf("fake: location %d in use", r.Location)
	}
	f.rules[r.Location] = r
	return nil
}

func (f *fakeNtupleNIC) DeleteRule(_ string, loc uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.rules[loc]; !ok {
		return fmt.Errorf("fake: no rule at %d", loc)
	}
	delete(f.rules, loc)
	return nil
}

func (f *fakeNtupleNIC) Rules(string) ([]ethtool.Rule, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []ethtool.Rule
	for _, r := range f.rules {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b ethtool.Rule) int { return int(a.Location) - int(b.Location) })
	return out, nil
}

func (f *fakeNtupleNIC) locs() []uint32 {
	rs, _ := f.Rules("")
	var out []uint32
	for _, r := range rs {
		out = append(out, r.Location)
	}
	return out
}

func (f *fakeNtupleNIC) Indirection(string) ([]uint32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.indir), nil
}

func (f *fakeNtupleNIC) CreateRSSContext(_ string, queues []uint32) (uint32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id := uint32(1); ; id++ {
		if _, ok := f.contexts[id]; !ok {
			f.contexts[id] = slices.Clone(queues)
			return id, nil
		}
	}
}

func (f *fakeNtupleNIC) DeleteRSSContext(_ string, ctx uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.contexts[ctx]; !ok {
		return fmt.Errorf("fake: no rss context %d", ctx)
	}
	for _, r := range f.rules {
		if r.RSSContext == ctx {
			return fmt.Errorf("fake: rss context %d in use by rule %d", ctx, r.Location)
		}
	}
	delete(f.contexts, ctx)
	return nil
}

func (f *fakeNtupleNIC) Channels(string) (ethtool.Channels, error) {
	return ethtool.Channels{MaxRX: 4, MaxTX: 4, RX: 4, TX: 4}, nil
}

func (f *fakeNtupleNIC) SetIndirection(_ string, t []uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(t) != len(f.indir) {
		return fmt.Errorf("fake: table of %d entries, want %d", len(t), len(f.indir))
	}
	f.indir = slices.Clone(t)
	return nil
}

func newAgentWithNIC(t *testing.T, p *testnet.Pair, nic agent.NtupleDevice, pins, state string) *agent.Agent {
	t.Helper()
	a, err := agent.New(agent.Config{NetNS: p.NSPath(), PinDir: pins, StateDir: state, NIC: nic,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func host(s string) netip.Prefix {
	a := netip.MustParseAddr(s)
	return netip.PrefixFrom(a, a.BitLen())
}

// TestSteeringOnFakeNtupleNIC: rule ownership inside xdpq's range,
// conflicts naming the other owner, all-or-nothing inserts, RSS kept off
// the reserved queues and restored, and clean-up after a restart that
// leaves foreign rules alone.
func TestSteeringOnFakeNtupleNIC(t *testing.T) {
	p := testnet.NewPair(t, 4)
	nic := newFakeNtupleNIC(4)
	origIndir := slices.Clone(nic.indir)
	foreign := ethtool.Rule{Location: 5, Type: ethtool.UDP4, Dst: host("192.0.2.1"), Queue: 0}
	nic.AddRule("xa", foreign)
	pins, state := pinDir(t), t.TempDir()

	a := newAgentWithNIC(t, p, nic, pins, state)
	policy := agent.Policy{Rules: agent.RuleRange{First: 100, Count: 4}, Reserved: []uint32{2, 3}}
	if err := a.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	if st := status(a, "xa"); st.Steering != agent.SteerHardware {
		t.Fatalf("auto on a NIC with ntuple filters: %+v", st)
	}
	for i, q := range nic.indir {
		if q == 2 || q == 3 {
			t.Fatalf("rss bucket %d still on reserved queue %d", i, q)
		}
	}
	if _, err := os.Stat(filepath.Join(state, "xa.rss.json")); err != nil {
		t.Fatalf("original rss table not saved: %v", err)
	}

	podA := []agent.Flow{
		{Protocol: xdp.UDP, Dst: host("10.0.0.1"), DstPort: 5000, Queues: []uint32{2}},
		{Protocol: xdp.TCP, Dst: netip.MustParsePrefix("10.0.0.0/24"), DstPort: 443, Queues: []uint32{3}},
	}
	if err := a.Steer("xa", "pod-a", podA); err != nil {
		t.Fatal(err)
	}
	if got := nic.locs(); !slices.Equal(got, []uint32{5, 100, 101}) {
		t.Fatalf("rules at %v, want the foreign one at 5 and pod-a's at 100, 101", got)
	}
	if r := nic.rules[100]; r.Type != ethtool.UDP4 || r.Dst != host("10.0.0.1") || r.DstPort != 5000 || r.Queue != 2 {
		t.Errorf("rule 100 is %v", r)
	}
	if err := a.VerifySteering("xa", "pod-a"); err != nil {
		t.Errorf("verify pod-a: %v", err)
	}
	if err := a.VerifySteering("xa", "pod-z"); err == nil || !strings.Contains(err.Error(), "no flows of pod-z") {
		t.Errorf("verify an owner without flows: %v", err)
	}
	// A rule removed behind xdpq's back (ethtool -N delete): verify says
	// which; the rule is put back as it was.
	r100 := nic.rules[100]
	nic.DeleteRule("xa", 100)
	if err := a.VerifySteering("xa", "pod-a"); err == nil || !strings.Contains(err.Error(), "location 100 is missing") {
		t.Errorf("verify with rule 100 gone: %v", err)
	}
	nic.AddRule("xa", r100)

	// Overlap with pod-a: refused, naming pod-a, nothing inserted.
	err := a.Steer("xa", "pod-b", []agent.Flow{{Protocol: xdp.UDP, Dst: netip.MustParsePrefix("10.0.0.0/8"), Queues: []uint32{1}}})
	if err == nil || !strings.Contains(err.Error(), "of pod-a") {
		t.Fatalf("overlapping flow: %v", err)
	}
	// Same address, other protocol: no overlap.
	podB := []agent.Flow{{Protocol: xdp.TCP, Dst: host("10.0.0.1"), DstPort: 5000, Queues: []uint32{1}}}
	if err := a.Steer("xa", "pod-b", podB); err != nil {
		t.Fatal(err)
	}
	// Two more do not fit the range: refused with the range named, and
	// the one that fitted is rolled back.
	err = a.Steer("xa", "pod-c", []agent.Flow{
		{Protocol: xdp.UDP, Dst: host("10.9.9.9"), Queues: []uint32{0}},
		{Protocol: xdp.UDP, Dst: host("10.9.9.10"), Queues: []uint32{0}},
	})
	if err == nil || !strings.Contains(err.Error(), "all 4 rule locations from 100") {
		t.Fatalf("full range: %v", err)
	}
	if got := nic.locs(); !slices.Equal(got, []uint32{5, 100, 101, 102}) {
		t.Fatalf("after a refused steer, rules at %v", got)
	}
	// A driver failure mid-way rolls the owner's earlier rules back.
	a.Unsteer("xa", "pod-b")
	nic.failNext = 2
	err = a.Steer("xa", "pod-d", []agent.Flow{
		{Protocol: xdp.UDP, Dst: host("10.7.0.1"), Queues: []uint32{0}},
		{Protocol: xdp.UDP, Dst: host("10.7.0.2"), Queues: []uint32{0}},
	})
	if err == nil || !strings.Contains(err.Error(), "out of filter resources") {
		t.Fatalf("failing insert: %v", err)
	}
	if got := nic.locs(); !slices.Equal(got, []uint32{5, 100, 101}) {
		t.Fatalf("after a failed insert, rules at %v", got)
	}
	if err := a.Steer("xa", "pod-b", podB); err != nil {
		t.Fatal(err)
	}
	if st := status(a, "xa"); st.Flows != 3 {
		t.Errorf("status reports %d flows, want 3", st.Flows)
	}
	a.Close()

	// The daemon restarts; only pod-a is still bound. Its rules are
	// adopted, pod-b's removed, the foreign rule kept; the saved RSS
	// table is the original, not the rewritten one.
	a2 := newAgentWithNIC(t, p, nic, pins, state)
	defer a2.Close()
	if err := a2.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	removed, err := a2.SyncSteering("xa", map[string][]agent.Flow{"pod-a": podA})
	if err != nil || removed != 1 {
		t.Fatalf("sync: removed %d, %v; want pod-b's one rule", removed, err)
	}
	if got := nic.locs(); !slices.Equal(got, []uint32{5, 100, 101}) {
		t.Fatalf("after sync, rules at %v", got)
	}
	if err := a2.Unsteer("xa", "pod-a"); err != nil {
		t.Fatal(err)
	}
	if got := nic.locs(); !slices.Equal(got, []uint32{5}) {
		t.Fatalf("after pod-a went, rules at %v", got)
	}
	if err := a2.Unmanage("xa"); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(nic.indir, origIndir) {
		t.Error("rss table not restored")
	}
}

// TestSoftwareFallbackOnVeth: veth has no ntuple filters; a pool with
// steering auto gets the filter program, and a pod receives its flow and
// nothing else, while other traffic reaches the kernel.
func TestSoftwareFallbackOnVeth(t *testing.T) {
	p := testnet.NewPair(t, 4)
	pins := pinDir(t)
	a := startWith(t, agent.Config{NetNS: p.NSPath(), PinDir: pins, Linger: time.Second, StateDir: t.TempDir()})
	if err := a.Set("xa", agent.Policy{Steering: agent.SteerAuto, Mode: xdp.ModeNative}); err != nil {
		t.Fatal(err)
	}
	if st := status(a, "xa"); st.Steering != agent.SteerSoftware {
		t.Fatalf("auto on veth: %+v", st)
	}
	flow := agent.Flow{Protocol: xdp.UDP, Dst: host(p.A.Addr.String()), DstPort: 5000, Queues: []uint32{0}}
	if err := a.Steer("xa", "pod-a", []agent.Flow{flow}); err != nil {
		t.Fatal(err)
	}
	err := a.Steer("xa", "pod-b", []agent.Flow{{Protocol: xdp.UDP, Dst: host("10.99.0.7"), Src: host("10.1.1.1"), Queues: []uint32{1}}})
	if err == nil || !strings.Contains(err.Error(), "not the source") {
		t.Errorf("source match in software: %v", err)
	}
	s0, r0 := socket(t, p, 0)
	if err := a.AddSocket("xa", 0, s0.FD()); err != nil {
		t.Fatal(err)
	}
	waitState(t, a, "xa", agent.StateFilter)

	var kernel *net.UDPConn
	if err := p.NS.Do(func(ns.NetNS) (err error) {
		kernel, err = net.ListenUDP("udp4", &net.UDPAddr{IP: p.A.Addr.AsSlice(), Port: 6000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer kernel.Close()
	send := sender(t, p, 0)
	if err := r0.Expect(send.UDP(30), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	// Not the pod's flow: the kernel gets it, the socket does not.
	other, _ := frame.Spec{SrcMAC: p.B.MAC, DstMAC: p.A.MAC, Src: p.B.Addr, Dst: p.A.Addr, Protocol: 17,
		SrcPort: 1, DstPort: 6000, Payload: []byte("for the host")}.Build()
	send.Raw([][]byte{other})
	buf := make([]byte, 64)
	kernel.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := kernel.Read(buf); err != nil || string(buf[:n]) != "for the host" {
		t.Fatalf("kernel socket: %q, %v", buf[:n], err)
	}
	expectNothing(t, r0)

	// verify reads the filter's flow map: an entry deleted behind xdpq's
	// back (bpftool map delete) is reported, and put back.
	if err := a.VerifySteering("xa", "pod-a"); err != nil {
		t.Errorf("verify pod-a: %v", err)
	}
	prog, err := a.Program("xa")
	if err != nil {
		t.Fatal(err)
	}
	have, err := prog.Flows()
	if err != nil || len(have) == 0 {
		t.Fatalf("flow map: %v %v", have, err)
	}
	for f := range have {
		prog.DeleteFlow(f)
	}
	if err := a.VerifySteering("xa", "pod-a"); err == nil || !strings.Contains(err.Error(), "missing from the filter's flow map") {
		t.Errorf("verify with the map emptied: %v", err)
	}
	for f, cookie := range have {
		if err := prog.AddFlow(f, cookie); err != nil {
			t.Fatal(err)
		}
	}

	// Hardware steering on veth: a clear error.
	a2 := newAgentWithNIC(t, p, nil, pins+"-hw", t.TempDir())
	defer a2.Close()
	if err := a2.Set("xb", agent.Policy{Steering: agent.SteerHardware}); err != nil {
		t.Fatal(err)
	}
	err = a2.Steer("xb", "pod-c", []agent.Flow{{Protocol: xdp.UDP, Dst: host("10.99.0.2"), Queues: []uint32{0}}})
	if !errors.Is(err, ethtool.ErrNotSupported) || !strings.Contains(err.Error(), "no ntuple filters") {
		t.Errorf("hardware steering on veth: %v", err)
	}
	a2.Unmanage("xb")

	// A sync never takes a flow from an owner the agent knows; a restart
	// that knows no binding removes it.
	if n, err := a.SyncSteering("xa", nil); err != nil || n != 0 {
		t.Errorf("sync removed %d flows of a known owner, %v", n, err)
	}
	a.Close()
	a = startWith(t, agent.Config{NetNS: p.NSPath(), PinDir: pins, Linger: time.Second, StateDir: t.TempDir()})
	if err := a.Set("xa", agent.Policy{Steering: agent.SteerAuto, Mode: xdp.ModeNative}); err != nil {
		t.Fatal(err)
	}
	if n, err := a.SyncSteering("xa", nil); err != nil || n != 1 {
		t.Errorf("sync with no bindings removed %d, %v", n, err)
	}
}

// TestRSSContextOnFakeNtupleNIC: a flow over several queues gets an RSS
// context and a rule to it; both go with the owner, or with a restart
// that no longer needs them.
func TestRSSContextOnFakeNtupleNIC(t *testing.T) {
	p := testnet.NewPair(t, 4)
	nic := newFakeNtupleNIC(4)
	pins, state := pinDir(t), t.TempDir()
	a := newAgentWithNIC(t, p, nic, pins, state)
	if err := a.Set("xa", agent.Policy{Steering: agent.SteerHardware}); err != nil {
		t.Fatal(err)
	}
	flow := agent.Flow{Protocol: xdp.UDP, Dst: host("10.0.0.5"), DstPort: 2152, Queues: []uint32{2, 3}}
	if err := a.Steer("xa", "upf", []agent.Flow{flow}); err != nil {
		t.Fatal(err)
	}
	rules, _ := nic.Rules("xa")
	if len(rules) != 1 || rules[0].RSSContext == 0 || !slices.Equal(nic.contexts[rules[0].RSSContext], []uint32{2, 3}) {
		t.Fatalf("rules %v, contexts %v", rules, nic.contexts)
	}
	if err := a.Steer("xa", "upf", []agent.Flow{{Protocol: xdp.UDP, Dst: host("10.0.0.6"), Queues: []uint32{1, 1}}}); err == nil {
		t.Error("a queue given twice was accepted")
	}
	if err := a.Unsteer("xa", "upf"); err != nil {
		t.Fatal(err)
	}
	if len(nic.rules) != 0 || len(nic.contexts) != 0 {
		t.Fatalf("after unsteer: rules %v, contexts %v", nic.rules, nic.contexts)
	}
	// A restart that still needs the flow keeps it, one that does not removes both.
	if err := a.Steer("xa", "upf", []agent.Flow{flow}); err != nil {
		t.Fatal(err)
	}
	// A restarted agent (it knows no owner yet).
	a.Close()
	a = newAgentWithNIC(t, p, nic, pins, state)
	if err := a.Set("xa", agent.Policy{Steering: agent.SteerHardware}); err != nil {
		t.Fatal(err)
	}
	if n, err := a.SyncSteering("xa", map[string][]agent.Flow{"upf": {flow}}); n != 0 || err != nil {
		t.Fatalf("sync keeping the flow removed %d, %v", n, err)
	}
	// A sync never takes a flow from an owner the agent knows...
	if n, err := a.SyncSteering("xa", nil); n != 0 || err != nil {
		t.Fatalf("sync without bindings removed %d flows of a known owner, %v", n, err)
	}
	// ...and one after a restart that knows no binding removes it.
	a.Close()
	a = newAgentWithNIC(t, p, nic, pins, state)
	if err := a.Set("xa", agent.Policy{Steering: agent.SteerHardware}); err != nil {
		t.Fatal(err)
	}
	if n, err := a.SyncSteering("xa", nil); n != 1 || err != nil {
		t.Fatalf("sync without bindings removed %d, %v", n, err)
	}
	if len(nic.rules) != 0 || len(nic.contexts) != 0 {
		t.Fatalf("after sync: rules %v, contexts %v", nic.rules, nic.contexts)
	}
}

// TestSoftwareFlowOverQueues: without hardware, a flow over two queues is
// taken on either, wherever the sender (veth's stand-in for RSS) puts it.
func TestSoftwareFlowOverQueues(t *testing.T) {
	p := testnet.NewPair(t, 4)
	a := start(t, p, time.Second)
	if err := a.Set("xa", agent.Policy{Steering: agent.SteerSoftware, Mode: xdp.ModeNative}); err != nil {
		t.Fatal(err)
	}
	flow := agent.Flow{Protocol: xdp.UDP, Dst: host(p.A.Addr.String()), DstPort: 5000, Queues: []uint32{0, 1}}
	if err := a.Steer("xa", "pod", []agent.Flow{flow}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []uint32{0, 1} {
		s, r := socket(t, p, q)
		if err := a.AddSocket("xa", q, s.FD()); err != nil {
			t.Fatal(err)
		}
		if err := r.Expect(sender(t, p, q).UDP(10), time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("queue %d: %v", q, err)
		}
	}
	if err := a.Unsteer("xa", "pod"); err != nil {
		t.Fatal(err)
	}
	prog, _ := a.Program("xa")
	if fl, err := prog.Flows(); err != nil || len(fl) != 0 {
		t.Errorf("flows left: %v, %v", fl, err)
	}
}
