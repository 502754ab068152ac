package agent_test

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/syncbuf"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// linkUpdates subscribes to the link notifications of the pair's
// namespace until the test ends.
func linkUpdates(t *testing.T, p *testnet.Pair) <-chan netlink.LinkUpdate {
	t.Helper()
	h, err := netns.GetFromPath(p.NSPath())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	ch := make(chan netlink.LinkUpdate, 256)
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	if err := netlink.LinkSubscribeWithOptions(ch, done, netlink.LinkSubscribeOptions{Namespace: &h}); err != nil {
		t.Fatal(err)
	}
	return ch
}

// nextXDP waits for a notification of ifindex's XDP program that pred
// accepts (program id 0: none) and returns when it came. Notifications
// that pred refuses are given to seen, if set.
func nextXDP(t *testing.T, ch <-chan netlink.LinkUpdate, ifindex int, within time.Duration, pred func(id uint32) bool, seen func(id uint32)) time.Time {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case u := <-ch:
			if u.Attrs().Index != ifindex || u.Attrs().Xdp == nil {
				continue
			}
			id := u.Attrs().Xdp.ProgId
			if !u.Attrs().Xdp.Attached {
				id = 0
			}
			if pred(id) {
				return time.Now()
			}
			if seen != nil {
				seen(id)
			}
		case <-timeout:
			t.Fatalf("no notification of the expected program on ifindex %d within %v", ifindex, within)
		}
	}
}

// TestLingerPerPolicy: the program goes the policy's linger after the
// last socket, not the agent's default (5 s), as the kernel's link
// notifications time it; a Set that changes the linger applies to the
// next empty period. The margin allows for a loaded 2-core machine and
// still fails the default.
func TestLingerPerPolicy(t *testing.T) {
	p := testnet.NewPair(t, 4)
	a := startWith(t, agent.Config{NetNS: p.NSPath(), PinDir: pinDir(t), StateDir: t.TempDir()})
	const margin = 1500 * time.Millisecond
	policy := agent.Policy{Steering: agent.SteerHardware, Linger: 300 * time.Millisecond}
	if err := a.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	if got := status(a, "xa").Policy.Linger; got != policy.Linger {
		t.Fatalf("linger in force %v, want %v", got, policy.Linger)
	}
	updates := linkUpdates(t, p)
	s0, _ := socket(t, p, 0)
	measure := func(linger time.Duration) {
		t.Helper()
		if err := a.AddSocket("xa", 0, s0.FD()); err != nil {
			t.Fatal(err)
		}
		nextXDP(t, updates, p.A.Index, 5*time.Second, func(id uint32) bool { return id != 0 }, nil)
		removed := time.Now()
		if err := a.RemoveSocket("xa", 0, 0); err != nil {
			t.Fatal(err)
		}
		gone := nextXDP(t, updates, p.A.Index, linger+margin, func(id uint32) bool { return id == 0 }, nil)
		d := gone.Sub(removed)
		t.Logf("linger %v: detached after %v", linger, d)
		if d < linger {
			t.Errorf("detached after %v, before the %v linger", d, linger)
		}
	}
	measure(policy.Linger)
	policy.Linger = time.Second // a reload
	if err := a.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	measure(policy.Linger)
}

// TestSetSteeringInPlace: on a veth, hardware steering (the direct
// program) becomes software steering (the filter program) and back while a
// socket receives: the program is replaced in one step (no notification
// shows the hook empty), on the same XSKMAP and counters, without adding
// the socket again. A change the NIC cannot do is refused, and nothing
// changes.
func TestSetSteeringInPlace(t *testing.T) {
	p := testnet.NewPair(t, 4)
	pins := pinDir(t)
	a := startWith(t, agent.Config{NetNS: p.NSPath(), PinDir: pins, StateDir: t.TempDir(), Linger: time.Second})
	if err := a.Set("xa", agent.Policy{Steering: agent.SteerHardware}); err != nil {
		t.Fatal(err)
	}
	s0, r0 := socket(t, p, 0)
	if err := a.AddSocket("xa", 0, s0.FD()); err != nil {
		t.Fatal(err)
	}
	direct := waitState(t, a, "xa", agent.StateDirect).Program
	send := sender(t, p, 0)
	if err := r0.Expect(send.UDP(20), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	xsks := pinnedMapID(t, filepath.Join(pins, "xa", "xsks"))
	counters := pinnedMapID(t, filepath.Join(pins, "xa", "counters"))
	updates := linkUpdates(t, p)
	noGap := func(id uint32) {
		if id == 0 {
			t.Error("the netdev was without a program while its steering changed")
		}
	}

	if err := a.Set("xa", agent.Policy{Steering: agent.SteerSoftware}); err != nil {
		t.Fatal(err)
	}
	st := status(a, "xa")
	if st.State != agent.StateFilter || st.Steering != agent.SteerSoftware || st.Policy.Steering != agent.SteerSoftware || st.Program == direct {
		t.Fatalf("after the change to software: %+v", st)
	}
	nextXDP(t, updates, p.A.Index, 5*time.Second, func(id uint32) bool { return id == uint32(st.Program) }, noGap)
	if got := pinnedMapID(t, filepath.Join(pins, "xa", "xsks")); got != xsks {
		t.Fatalf("xskmap %d pinned after the change, want %d", got, xsks)
	}
	if got := pinnedMapID(t, filepath.Join(pins, "xa", "counters")); got != counters {
		t.Fatalf("counters %d pinned after the change, want the direct program's %d", got, counters)
	}
	flow := agent.Flow{Protocol: xdp.UDP, Dst: host(p.A.Addr.String()), DstPort: 5000, Queues: []uint32{0}}
	if err := a.Steer("xa", "pod-a", []agent.Flow{flow}); err != nil {
		t.Fatal(err)
	}
	if err := r0.Expect(send.UDP(20), time.Now().Add(5*time.Second)); err != nil {
		t.Fatalf("the socket, never added again, under the filter program: %v", err)
	}

	// veth has no ntuple filters: pod-a's flow cannot become a rule.
	err := a.Set("xa", agent.Policy{Steering: agent.SteerHardware})
	if err == nil || !strings.Contains(err.Error(), "no ntuple filters") || !strings.Contains(err.Error(), "keeps software steering") {
		t.Fatalf("hardware steering with a flow on veth: %v", err)
	}
	st = status(a, "xa")
	if st.State != agent.StateFilter || st.Policy.Steering != agent.SteerSoftware || st.Flows != 1 || !strings.Contains(st.PolicyError, "no ntuple filters") {
		t.Fatalf("after the refused change: %+v", st)
	}
	if err := r0.Expect(send.UDP(20), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}

	if err := a.Unsteer("xa", "pod-a"); err != nil {
		t.Fatal(err)
	}
	filter := st.Program
	if err := a.Set("xa", agent.Policy{Steering: agent.SteerHardware}); err != nil {
		t.Fatal(err)
	}
	st = status(a, "xa")
	// Applied, and what veth lacks for it is said.
	if st.State != agent.StateDirect || st.Steering != agent.SteerHardware || st.Program == filter ||
		!strings.Contains(st.PolicyError, "steering hardware: xa has no ntuple filters") {
		t.Fatalf("back to hardware: %+v", st)
	}
	nextXDP(t, updates, p.A.Index, 5*time.Second, func(id uint32) bool { return id == uint32(st.Program) }, noGap)
	if _, err := os.Stat(filepath.Join(pins, "xa", "flows")); !os.IsNotExist(err) {
		t.Errorf("the filter's flows are still pinned: %v", err)
	}
	if got := pinnedMapID(t, filepath.Join(pins, "xa", "counters")); got != counters {
		t.Errorf("counters %d pinned back in hardware steering, want %d", got, counters)
	}
	if err := r0.Expect(send.UDP(20), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	// Queue 0's count went on through both programs: 20 frames each
	// time the socket received (the filter's had pod-a's flow).
	prog, err := a.Program("xa")
	if err != nil {
		t.Fatal(err)
	}
	if c, err := prog.Counters(0); err != nil || c.Redirected != 80 {
		t.Errorf("queue 0 counters %+v (%v), want 80 redirected", c, err)
	}
}

func pinnedMapID(t *testing.T, path string) ebpf.MapID {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// TestSetSteeringOnFakeNtupleNIC: with a NIC that has ntuple filters
// (faked: no device here has them), the owners' flows move between the
// filter's flow map and ntuple rules as the steering changes, the RSS
// reservation comes and goes with hardware steering, and a flow software
// steering cannot express refuses the change.
func TestSetSteeringOnFakeNtupleNIC(t *testing.T) {
	p := testnet.NewPair(t, 4)
	nic := newFakeNtupleNIC(4)
	origIndir := slices.Clone(nic.indir)
	a := newAgentWithNIC(t, p, nic, pinDir(t), t.TempDir())
	soft := agent.Policy{Steering: agent.SteerSoftware, Rules: agent.RuleRange{First: 100, Count: 4}, Reserved: []uint32{2, 3}}
	if err := a.Set("xa", soft); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(nic.indir, origIndir) {
		t.Fatal("software steering rewrote the rss table")
	}
	s2, r2 := socket(t, p, 2)
	if err := a.AddSocket("xa", 2, s2.FD()); err != nil {
		t.Fatal(err)
	}
	podA := []agent.Flow{{Protocol: xdp.UDP, Dst: host(p.A.Addr.String()), DstPort: 5000, Queues: []uint32{2}}}
	if err := a.Steer("xa", "pod-a", podA); err != nil {
		t.Fatal(err)
	}
	send := sender(t, p, 2)
	if err := r2.Expect(send.UDP(10), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}

	hard := soft
	hard.Steering = agent.SteerHardware
	if err := a.Set("xa", hard); err != nil {
		t.Fatal(err)
	}
	st := status(a, "xa")
	if st.State != agent.StateDirect || st.Flows != 1 || st.Policy.Steering != agent.SteerHardware {
		t.Fatalf("after the change to hardware: %+v", st)
	}
	if got := nic.locs(); !slices.Equal(got, []uint32{100}) || nic.rules[100].Queue != 2 {
		t.Fatalf("rules %v after the change to hardware", nic.rules)
	}
	for i, q := range nic.indir {
		if q == 2 || q == 3 {
			t.Fatalf("rss bucket %d on reserved queue %d", i, q)
		}
	}
	if err := a.VerifySteering("xa", "pod-a"); err != nil {
		t.Error(err)
	}
	if err := r2.Expect(send.UDP(10), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}

	// A prefix is a rule, not a flow map entry.
	podB := []agent.Flow{{Protocol: xdp.TCP, Dst: netip.MustParsePrefix("10.0.0.0/24"), DstPort: 443, Queues: []uint32{3}}}
	if err := a.Steer("xa", "pod-b", podB); err != nil {
		t.Fatal(err)
	}
	err := a.Set("xa", soft)
	if err == nil || !strings.Contains(err.Error(), "not a prefix") || !strings.Contains(err.Error(), "pod-b") {
		t.Fatalf("software steering with a prefix flow: %v", err)
	}
	if got := nic.locs(); !slices.Equal(got, []uint32{100, 101}) || status(a, "xa").Policy.Steering != agent.SteerHardware {
		t.Fatalf("after the refused change: rules at %v, %+v", got, status(a, "xa"))
	}

	if err := a.Unsteer("xa", "pod-b"); err != nil {
		t.Fatal(err)
	}
	if err := a.Set("xa", soft); err != nil {
		t.Fatal(err)
	}
	if got := nic.locs(); len(got) != 0 {
		t.Fatalf("rules %v left under software steering", got)
	}
	if !slices.Equal(nic.indir, origIndir) {
		t.Error("rss table not put back under software steering")
	}
	if st := status(a, "xa"); st.State != agent.StateFilter || st.Flows != 1 {
		t.Fatalf("back to software: %+v", st)
	}
	if err := a.VerifySteering("xa", "pod-a"); err != nil {
		t.Error(err)
	}
	if err := r2.Expect(send.UDP(10), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestSetRulesAndReserved: a new rule range moves the rules outside it;
// one too small for them is refused; the RSS table is computed again from
// the NIC's own for a new reserved set, and put back for none.
func TestSetRulesAndReserved(t *testing.T) {
	p := testnet.NewPair(t, 4)
	nic := newFakeNtupleNIC(4)
	origIndir := slices.Clone(nic.indir)
	state := t.TempDir()
	a := newAgentWithNIC(t, p, nic, pinDir(t), state)
	policy := agent.Policy{Steering: agent.SteerHardware, Rules: agent.RuleRange{First: 100, Count: 4}, Reserved: []uint32{2, 3}}
	if err := a.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	flows := []agent.Flow{
		{Protocol: xdp.UDP, Dst: host("10.0.0.1"), DstPort: 5000, Queues: []uint32{2}},
		{Protocol: xdp.UDP, Dst: host("10.0.0.2"), DstPort: 5000, Queues: []uint32{2, 3}},
	}
	if err := a.Steer("xa", "pod-a", flows); err != nil {
		t.Fatal(err)
	}
	policy.Rules = agent.RuleRange{First: 200, Count: 8}
	if err := a.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	if got := nic.locs(); !slices.Equal(got, []uint32{200, 201}) {
		t.Fatalf("rules at %v, want 200, 201", got)
	}
	if err := a.VerifySteering("xa", "pod-a"); err != nil {
		t.Error(err)
	}
	if st := status(a, "xa"); st.Policy.Rules != policy.Rules {
		t.Errorf("rules in force %+v", st.Policy.Rules)
	}
	small := policy
	small.Rules = agent.RuleRange{First: 300, Count: 1}
	if err := a.Set("xa", small); err == nil || !strings.Contains(err.Error(), "no room") {
		t.Fatalf("a range too small: %v", err)
	}
	if got := nic.locs(); !slices.Equal(got, []uint32{200, 201}) {
		t.Fatalf("after the refused range, rules at %v", got)
	}
	if st := status(a, "xa"); st.Policy.Rules != policy.Rules || !strings.Contains(st.PolicyError, "no room") {
		t.Errorf("after the refused range: %+v", st)
	}

	policy.Reserved = []uint32{3}
	if err := a.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	for i, q := range nic.indir {
		if q == 3 || origIndir[i] == 2 && q != 2 {
			t.Fatalf("bucket %d on queue %d (the NIC's own: %d), reserved 3", i, q, origIndir[i])
		}
	}
	policy.Reserved = nil
	if err := a.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(nic.indir, origIndir) {
		t.Error("rss table not put back with no queue reserved")
	}
	if _, err := os.Stat(filepath.Join(state, "xa.rss.json")); !os.IsNotExist(err) {
		t.Errorf("saved rss table kept: %v", err)
	}
}

// TestSetModeAndExclusive: native becomes generic, netlink an exclusive
// link and back, each by attaching again; the socket receives after each.
func TestSetModeAndExclusive(t *testing.T) {
	p := testnet.NewPair(t, 4)
	pins := pinDir(t)
	a := startWith(t, agent.Config{NetNS: p.NSPath(), PinDir: pins, StateDir: t.TempDir(), Linger: time.Second})
	policy := agent.Policy{Steering: agent.SteerHardware, Mode: xdp.ModeNative}
	if err := a.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	s0, r0 := socket(t, p, 0)
	if err := a.AddSocket("xa", 0, s0.FD()); err != nil {
		t.Fatal(err)
	}
	send := sender(t, p, 0)
	check := func(what string, mode xdp.Mode) {
		t.Helper()
		st := status(a, "xa")
		att, err := xdp.Query(p.NSPath(), p.A.Index)
		if err != nil || att == nil || !att.Ours || att.Mode != mode || st.State != agent.StateDirect || st.Mode != mode {
			t.Fatalf("%s: %+v, attached %+v, %v", what, st, att, err)
		}
		if err := r0.Expect(send.UDP(10), time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	check("native", xdp.ModeNative)
	policy.Mode = xdp.ModeGeneric
	if err := a.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	check("generic", xdp.ModeGeneric)
	if st := status(a, "xa"); st.Policy.Mode != xdp.ModeGeneric || st.ModeReason != "set by the pool" {
		t.Errorf("generic: %+v", st)
	}

	policy.Mode, policy.Exclusive = xdp.ModeNative, true
	if err := a.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	check("exclusive", xdp.ModeNative)
	if _, err := os.Stat(filepath.Join(pins, "xa", "link")); err != nil {
		t.Fatalf("exclusive: no pinned link: %v", err)
	}
	out, err := exec.Command("ip", "-n", filepath.Base(p.NSPath()), "-force", "link", "set", "dev", "xa",
		"xdpdrv", "obj", operatorObj, "sec", "xdp").CombinedOutput()
	if err == nil {
		t.Fatalf("the kernel took a foreign program over the exclusive link:\n%s", out)
	}

	// The steering changes through the link's update.
	policy.Steering = agent.SteerSoftware
	if err := a.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	if st := status(a, "xa"); st.State != agent.StateFilter {
		t.Fatalf("exclusive, software steering: %+v", st)
	}
	if att, err := xdp.Query(p.NSPath(), p.A.Index); err != nil || att == nil || att.Kind != xdp.Filter {
		t.Fatalf("exclusive, software steering: attached %+v, %v", att, err)
	}
	if out, err := exec.Command("ip", "-n", filepath.Base(p.NSPath()), "-force", "link", "set", "dev", "xa",
		"xdpdrv", "obj", operatorObj, "sec", "xdp").CombinedOutput(); err == nil {
		t.Fatalf("the link let a foreign program in after the update:\n%s", out)
	}
	policy.Steering = agent.SteerHardware
	if err := a.Set("xa", policy); err != nil {
		t.Fatal(err)
	}

	policy.Exclusive = false
	if err := a.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	check("not exclusive", xdp.ModeNative)
	if _, err := os.Stat(filepath.Join(pins, "xa", "link")); !os.IsNotExist(err) {
		t.Fatalf("not exclusive: the link is still pinned: %v", err)
	}
	// Attached through netlink again: an operator's program has precedence.
	ip(t, p, "-force", "link", "set", "dev", "xa", "xdpdrv", "obj", operatorObj, "sec", "xdp")
	waitState(t, a, "xa", agent.StateOverridden)
	ip(t, p, "link", "set", "dev", "xa", "xdpdrv", "off")
	waitState(t, a, "xa", agent.StateDirect)
}

// sysfsOf mounts a sysfs inside the pair's namespace (the classic way, at
// a path) for the test's own view of its netdevs' attributes.
func sysfsOf(t *testing.T, p *testnet.Pair) string {
	t.Helper()
	dir := t.TempDir()
	if err := p.NS.Do(func(ns.NetNS) error { return unix.Mount("sysfs", dir, "sysfs", 0, "") }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

type napi struct{ defer_, gro string }

func readNAPI(t *testing.T, sys, netdev string) napi {
	t.Helper()
	read := func(attr string) string {
		b, err := os.ReadFile(filepath.Join(sys, "class/net", netdev, attr))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	return napi{read("napi_defer_hard_irqs"), read("gro_flush_timeout")}
}

// TestBusyPoll: a policy with busy polling gives the netdev the kernel's
// example NAPI settings (read back through a sysfs of the netdev's
// namespace, not the agent's), having saved the netdev's own; they come
// back when the policy stops asking or the netdev is unmanaged, and a
// restarted agent neither loses them nor takes its predecessor's settings
// for the netdev's own.
func TestBusyPoll(t *testing.T) {
	p := testnet.NewPair(t, 2)
	sys := sysfsOf(t, p)
	for attr, v := range map[string]string{"napi_defer_hard_irqs": "1", "gro_flush_timeout": "5000"} {
		if err := os.WriteFile(filepath.Join(sys, "class/net/xa", attr), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	own, busy := napi{"1", "5000"}, napi{"2", "200000"}
	pins, state := pinDir(t), t.TempDir()
	saved := filepath.Join(state, "xa.napi.json")
	newAgent := func(sysRoot string) *agent.Agent {
		a, err := agent.New(agent.Config{NetNS: p.NSPath(), PinDir: pins, StateDir: state, SysRoot: sysRoot,
			Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	expect := func(what string, want napi, fileThere bool) {
		t.Helper()
		if got := readNAPI(t, sys, "xa"); got != want {
			t.Errorf("%s: xa has %+v, want %+v", what, got, want)
		}
		if _, err := os.Stat(saved); (err == nil) != fileThere {
			t.Errorf("%s: saved settings there: %v, want %v", what, err == nil, fileThere)
		}
	}

	a1 := newAgent("")
	if err := a1.Set("xa", agent.Policy{Steering: agent.SteerSoftware, BusyPoll: true}); err != nil {
		t.Fatal(err)
	}
	expect("busy poll", busy, true)
	if st := status(a1, "xa"); !st.Policy.BusyPoll || st.PolicyError != "" {
		t.Errorf("busy poll: %+v", st)
	}
	if got := readNAPI(t, sys, "xb"); got != (napi{"0", "0"}) {
		t.Errorf("xb touched: %+v", got)
	}
	if err := a1.Set("xa", agent.Policy{Steering: agent.SteerSoftware}); err != nil {
		t.Fatal(err)
	}
	expect("policy no longer asks", own, false)
	if err := a1.Set("xa", agent.Policy{Steering: agent.SteerSoftware, BusyPoll: true}); err != nil {
		t.Fatal(err)
	}
	a1.Close()

	// A restarted agent that asks again keeps the netdev's own settings
	// saved, and puts them back when the netdev is unmanaged.
	a2 := newAgent("")
	if err := a2.Set("xa", agent.Policy{Steering: agent.SteerSoftware, BusyPoll: true}); err != nil {
		t.Fatal(err)
	}
	expect("restarted", busy, true)
	var got struct {
		Defer uint32 `json:"napi_defer_hard_irqs"`
		GRO   uint64 `json:"gro_flush_timeout"`
	}
	if b, err := os.ReadFile(saved); err != nil || json.Unmarshal(b, &got) != nil || got.Defer != 1 || got.GRO != 5000 {
		t.Fatalf("saved after the restart: %+v, %v", got, err)
	}
	if err := a2.Unmanage("xa"); err != nil {
		t.Fatal(err)
	}
	expect("unmanaged", own, false)
	a2.Close()

	// Through a sysfs the caller mounted (Config.SysRoot); a restarted
	// agent whose policy no longer asks puts the settings back.
	a3 := newAgent(sys)
	if err := a3.Set("xa", agent.Policy{Steering: agent.SteerSoftware, BusyPoll: true}); err != nil {
		t.Fatal(err)
	}
	expect("sys root", busy, true)
	a3.Close()
	a4 := newAgent(sys)
	if err := a4.Set("xa", agent.Policy{Steering: agent.SteerSoftware}); err != nil {
		t.Fatal(err)
	}
	expect("restarted without busy poll", own, false)
}

// TestTakeBackWithoutPins: an agent attaches its program and goes; its
// pins and state go too (bpffs not persisted, the pin dir changed). A
// fresh agent on another pin dir recognises the attached program as
// xdpq's, takes it back with its maps, pinned again where its own pins
// belong, and says so: the netdev is Direct or Filter (not Overridden),
// the socket still open keeps receiving, and the filter's flows are found.
func TestTakeBackWithoutPins(t *testing.T) {
	for _, steer := range []agent.Steering{agent.SteerHardware, agent.SteerSoftware} {
		t.Run(string(steer), func(t *testing.T) {
			p := testnet.NewPair(t, 4)
			policy := agent.Policy{Steering: steer}
			want := map[agent.Steering]agent.State{agent.SteerHardware: agent.StateDirect, agent.SteerSoftware: agent.StateFilter}[steer]
			oldPins, oldState := pinDir(t), t.TempDir()
			a1, err := agent.New(agent.Config{NetNS: p.NSPath(), PinDir: oldPins, StateDir: oldState,
				Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
			if err != nil {
				t.Fatal(err)
			}
			if err := a1.Set("xa", policy); err != nil {
				t.Fatal(err)
			}
			s0, r0 := socket(t, p, 0)
			if err := a1.AddSocket("xa", 0, s0.FD()); err != nil {
				t.Fatal(err)
			}
			flow := agent.Flow{Protocol: xdp.UDP, Dst: host(p.A.Addr.String()), DstPort: 5000, Queues: []uint32{0}}
			if steer == agent.SteerSoftware {
				if err := a1.Steer("xa", "pod-a", []agent.Flow{flow}); err != nil {
					t.Fatal(err)
				}
			}
			before := status(a1, "xa")
			if before.State != want {
				t.Fatalf("first agent: %+v", before)
			}
			send := sender(t, p, 0)
			if err := r0.Expect(send.UDP(20), time.Now().Add(5*time.Second)); err != nil {
				t.Fatal(err)
			}
			a1.Close()
			if err := errors.Join(os.RemoveAll(oldPins), os.RemoveAll(oldState)); err != nil {
				t.Fatal(err)
			}

			logs := &syncbuf.Buffer{}
			newPins := pinDir(t)
			a2 := startWith(t, agent.Config{NetNS: p.NSPath(), PinDir: newPins, StateDir: t.TempDir(),
				Logger: slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), logs), nil))})
			if err := a2.Set("xa", policy); err != nil {
				t.Fatal(err)
			}
			after := status(a2, "xa")
			if after.State != want || after.Program != before.Program {
				t.Fatalf("fresh agent: %+v, want %s with program %d", after, want, before.Program)
			}
			if !strings.Contains(logs.String(), "took back the attached xdpq program") {
				t.Errorf("the fresh agent did not say it took the program back:\n%s", logs)
			}
			prog, err := ebpf.NewProgramFromID(after.Program)
			if err != nil {
				t.Fatal(err)
			}
			defer prog.Close()
			xsks, err := ebpf.LoadPinnedMap(filepath.Join(newPins, "xa", "xsks"), nil)
			if err != nil {
				t.Fatalf("no new pins: %v", err)
			}
			defer xsks.Close()
			if uses, err := xdp.UsesMap(prog, xsks); err != nil || !uses {
				t.Fatalf("the xskmap pinned is not the attached program's: %v, %v", uses, err)
			}
			if err := r0.Expect(send.UDP(20), time.Now().Add(5*time.Second)); err != nil {
				t.Fatalf("the open socket after the take-back: %v", err)
			}
			if steer == agent.SteerSoftware {
				if n, err := a2.SyncSteering("xa", map[string][]agent.Flow{"pod-a": {flow}}); err != nil || n != 0 {
					t.Fatalf("sync: removed %d, %v", n, err)
				}
				if err := a2.VerifySteering("xa", "pod-a"); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// TestAdoptSteeringKeepsUnknown: a daemon that cannot read one of its
// state files adopts the flows it knows and leaves the others in place,
// counted as unknown: their rule locations stay taken, a flow that
// overlaps one is refused, the steering keeps its kind; a SyncSteering
// that knows the owners removes them.
func TestAdoptSteeringKeepsUnknown(t *testing.T) {
	p := testnet.NewPair(t, 4)
	nic := newFakeNtupleNIC(4)
	pins, state := pinDir(t), t.TempDir()
	policy := agent.Policy{Steering: agent.SteerHardware, Rules: agent.RuleRange{First: 100, Count: 8}}
	podA := []agent.Flow{{Protocol: xdp.UDP, Dst: host("10.0.0.1"), DstPort: 5000, Queues: []uint32{1}}}
	podB := []agent.Flow{{Protocol: xdp.UDP, Dst: host("10.0.0.2"), DstPort: 5000, Queues: []uint32{2}}}
	a1 := newAgentWithNIC(t, p, nic, pins, state)
	if err := a1.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	if err := a1.Steer("xa", "pod-a", podA); err != nil { // at 100
		t.Fatal(err)
	}
	if err := a1.Steer("xa", "pod-b", podB); err != nil { // at 101
		t.Fatal(err)
	}
	a1.Close()

	a2 := newAgentWithNIC(t, p, nic, pins, state)
	if err := a2.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	unknown, err := a2.AdoptSteering("xa", map[string][]agent.Flow{"pod-a": podA})
	if err != nil || unknown != 1 {
		t.Fatalf("adopt: %d unknown, %v; want pod-b's one", unknown, err)
	}
	if st := status(a2, "xa"); st.Flows != 1 || st.UnknownFlows != 1 {
		t.Fatalf("after adopt: %+v", st)
	}
	if got := nic.locs(); !slices.Equal(got, []uint32{100, 101}) {
		t.Fatalf("after adopt, rules at %v", got)
	}
	err = a2.Steer("xa", "pod-c", []agent.Flow{{Protocol: xdp.UDP, Dst: netip.MustParsePrefix("10.0.0.2/31"), Queues: []uint32{3}}})
	if err == nil || !strings.Contains(err.Error(), "owner not known") {
		t.Fatalf("a flow over an unknown one: %v", err)
	}
	podC := []agent.Flow{{Protocol: xdp.TCP, Dst: host("10.0.0.2"), DstPort: 80, Queues: []uint32{3}}}
	if err := a2.Steer("xa", "pod-c", podC); err != nil {
		t.Fatal(err)
	}
	if got := nic.locs(); !slices.Equal(got, []uint32{100, 101, 102}) {
		t.Fatalf("pod-c's rule took an unknown flow's place: rules at %v", got)
	}
	if err := a2.Set("xa", agent.Policy{Steering: agent.SteerSoftware, Rules: policy.Rules}); err == nil || !strings.Contains(err.Error(), "no known owner") {
		t.Fatalf("a steering change with unknown flows: %v", err)
	}
	removed, err := a2.SyncSteering("xa", map[string][]agent.Flow{"pod-a": podA, "pod-c": podC})
	if err != nil || removed != 1 {
		t.Fatalf("sync: removed %d, %v; want pod-b's one", removed, err)
	}
	if got := nic.locs(); !slices.Equal(got, []uint32{100, 102}) || status(a2, "xa").UnknownFlows != 0 {
		t.Fatalf("after sync, rules at %v, %+v", got, status(a2, "xa"))
	}
	a2.Close()

	// Software steering: the flow map entries stay the same way.
	soft := agent.Policy{Steering: agent.SteerSoftware}
	spins := pinDir(t)
	s1 := newAgentWithNIC(t, p, nil, spins, t.TempDir())
	if err := s1.Set("xb", soft); err != nil {
		t.Fatal(err)
	}
	for owner, flows := range map[string][]agent.Flow{"pod-a": podA, "pod-b": podB} {
		if err := s1.Steer("xb", owner, flows); err != nil {
			t.Fatal(err)
		}
	}
	s1.Close()
	s2 := newAgentWithNIC(t, p, nil, spins, t.TempDir())
	if err := s2.Set("xb", soft); err != nil {
		t.Fatal(err)
	}
	if n, err := s2.AdoptSteering("xb", map[string][]agent.Flow{"pod-a": podA}); err != nil || n != 1 {
		t.Fatalf("adopt in software: %d unknown, %v", n, err)
	}
	prog, _ := s2.Program("xb")
	if fl, err := prog.Flows(); err != nil || len(fl) != 2 {
		t.Fatalf("flow map after adopt: %v, %v", fl, err)
	}
	if n, err := s2.SyncSteering("xb", map[string][]agent.Flow{"pod-a": podA}); err != nil || n != 1 {
		t.Fatalf("sync in software: removed %d, %v", n, err)
	}
}

// TestSetRefusesBadPolicy: a policy that cannot be is refused before
// anything is done, and a netdev that is not there is not managed.
func TestSetRefusesBadPolicy(t *testing.T) {
	p := testnet.NewPair(t, 2)
	a := newAgentWithNIC(t, p, nil, pinDir(t), t.TempDir())
	for _, c := range []struct {
		p    agent.Policy
		want string
	}{
		{agent.Policy{Steering: "magic"}, `steering "magic"`},
		{agent.Policy{Mode: xdp.ModeOffload}, "mode offload"},
		{agent.Policy{Linger: -time.Second}, "negative"},
		{agent.Policy{Rules: agent.RuleRange{First: 1<<32 - 2, Count: 4}}, "past the last location"},
	} {
		if err := a.Set("xa", c.p); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.p, err, c.want)
		}
	}
	if err := a.Set("nosuch", agent.Policy{}); err == nil || !strings.Contains(err.Error(), "manage nosuch") {
		t.Errorf("a netdev that is not there: %v", err)
	}
	if all := a.Status(); len(all) != 0 {
		t.Errorf("managed after refusals: %+v", all)
	}
	if err := a.Manage("xa", agent.Policy{}); err != nil {
		t.Fatal(err)
	}
	if err := a.Manage("xa", agent.Policy{}); err == nil || err.Error() != "manage xa: it is managed already" {
		t.Errorf("manage twice: %v", err)
	}
}

// TestSetConcurrently: Sets that change the steering and the attach
// policy race the socket calls, the steering calls, Status and the event
// loop; the race detector watches, and the netdev ends as the last Set
// and socket calls say.
func TestSetConcurrently(t *testing.T) {
	p := testnet.NewPair(t, 4)
	a := start(t, p, 10*time.Millisecond)
	if err := a.Set("xa", agent.Policy{Steering: agent.SteerSoftware}); err != nil {
		t.Fatal(err)
	}
	s1, _ := socket(t, p, 1)
	var wg sync.WaitGroup
	run := func(f func(i int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				f(i)
			}
		}()
	}
	run(func(i int) {
		steer := []agent.Steering{agent.SteerSoftware, agent.SteerHardware}[i%2]
		if err := a.Set("xa", agent.Policy{Steering: steer, AttachAlways: i%3 == 0}); err != nil && !strings.Contains(err.Error(), "no ntuple filters") {
			t.Error(err)
		}
	})
	run(func(i int) {
		if err := a.AddSocket("xa", 1, s1.FD()); err != nil {
			t.Error(err)
		}
		if err := a.RemoveSocket("xa", 1, 0); err != nil {
			t.Error(err)
		}
	})
	run(func(i int) {
		flow := agent.Flow{Protocol: xdp.UDP, Dst: host("10.99.0.1"), DstPort: uint16(1000 + i), Queues: []uint32{1}}
		// Under hardware steering on veth the flow is refused: fine.
		a.Steer("xa", "pod", []agent.Flow{flow})
		a.Unsteer("xa", "pod")
	})
	run(func(int) { a.Status(); a.Kick() })
	wg.Wait()
	if err := a.Set("xa", agent.Policy{Steering: agent.SteerSoftware, AttachAlways: true}); err != nil {
		t.Fatal(err)
	}
	if err := a.AddSocket("xa", 1, s1.FD()); err != nil {
		t.Fatal(err)
	}
	st := status(a, "xa")
	if st.State != agent.StateFilter || st.Flows != 0 || !slices.Equal(st.Sockets, []uint32{1}) || st.PolicyError != "" {
		t.Fatalf("after the race: %+v", st)
	}
}
