package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/kubepods"
	"github.com/xdpq/xdpq/pkg/ledger"
	"github.com/xdpq/xdpq/pkg/nic"
)

// pools is a config of queue-mode pools, each "name:netdev#queues[:steering]".
func pools(specs ...string) string {
	var b strings.Builder
	b.WriteString("pools: [")
	for i, s := range specs {
		f := strings.Split(s, ":")
		steering := "hardware"
		if len(f) > 2 {
			steering = f[2]
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("{name: " + f[0] + ", steering: " + steering + ", devices: {netdevs: ['" + f[1] + "']}}")
	}
	b.WriteString("]\n")
	return b.String()
}

// TestReloadDecisions: what a reload changes, and what it keeps, against
// a fake node agent: the calls the reconciler makes (nothing else calls
// Set or Unmanage), the pools' capacity, and the problems status reports.
// Allocations are made before the reload, through the local API.
func TestReloadDecisions(t *testing.T) {
	errNIC := errors.New("the NIC refused")
	for _, c := range []struct {
		name          string
		before, after string
		allocs        map[string]int // pool: queues allocated before the reload
		gone          string         // a netdev gone from the node at the reload
		failSet       string         // a netdev whose Set fails at the reload
		failUnmanage  string
		wantCalls     []string // the agent's calls at the reload
		wantCapacity  []string
		wantProblem   string // in status' config error
		wantAgain     []string
	}{
		{
			name:         "unchanged: nothing asked of the kernel",
			before:       pools("upf:xa#0,1"),
			after:        pools("upf:xa#0,1"),
			wantCapacity: []string{"upf=2"},
		},
		{
			name:         "a pool grows: its queues kept off RSS",
			before:       pools("upf:xa#0,1"),
			after:        pools("upf:xa#0-2"),
			wantCalls:    []string{"set xa steering=hardware reserved=[0 1 2]"},
			wantCapacity: []string{"upf=3"},
		},
		{
			name:         "a pool shrinks: a free queue goes back to RSS",
			before:       pools("upf:xa#0-2"),
			after:        pools("upf:xa#0"),
			wantCalls:    []string{"set xa steering=hardware reserved=[0]"},
			wantCapacity: []string{"upf=1"},
		},
		{
			name:         "a pool shrinks under an allocation: its queues stay off RSS",
			before:       pools("upf:xa#0,1"),
			allocs:       map[string]int{"upf": 2},
			after:        pools("upf:xa#0"),
			wantCapacity: []string{"upf=1"}, // the policy is the same: no call
		},
		{
			name:         "a pool removed: its netdev let go",
			before:       pools("upf:xa#0,1", "dns:xb#0"),
			after:        pools("dns:xb#0"),
			wantCalls:    []string{"unmanage xa"},
			wantCapacity: []string{"dns=1"},
		},
		{
			name:         "a pool removed under an allocation: the netdev keeps its policy and the pool lingers",
			before:       pools("upf:xa#0,1", "dns:xb#0"),
			allocs:       map[string]int{"upf": 1},
			after:        pools("dns:xb#0"),
			wantCapacity: []string{"dns=1", "upf=0"},
		},
		{
			name:         "a netdev gone: let go when nothing holds it",
			before:       pools("upf:xa#0,1", "dns:xb#0"),
			gone:         "xa",
			after:        pools("upf:xa#0,1", "dns:xb#0"),
			wantCalls:    []string{"unmanage xa"},
			wantCapacity: []string{"dns=1", "upf=0"},
			wantProblem:  "pool upf: netdev xa is not on this node",
		},
		{
			name:         "a netdev gone under an allocation: kept as it was",
			before:       pools("upf:xa#0,1"),
			allocs:       map[string]int{"upf": 1},
			gone:         "xa",
			after:        pools("upf:xa#0,1"),
			wantCapacity: []string{"upf=0"},
			wantProblem:  "pool upf: netdev xa is not on this node",
		},
		{
			name:         "software steering keeps RSS on every queue",
			before:       pools("upf:xa#0,1"),
			after:        pools("upf:xa#0,1:software"),
			wantCalls:    []string{"set xa steering=software reserved=[]"},
			wantCapacity: []string{"upf=2"},
		},
		{
			name:         "two pools on a netdev disagree: the first one's settings, and a problem",
			before:       pools("upf:xa#0,1"),
			after:        pools("upf:xa#0,1", "dns:xa#2:software"),
			wantCalls:    []string{"set xa steering=hardware reserved=[0 1 2]"},
			wantCapacity: []string{"dns=1", "upf=2"},
			wantProblem:  "pools upf and dns share netdev xa and disagree on steering; upf's applies",
		},
		{
			name:         "a new netdev the agent refuses: not managed, asked again at the next reconcile",
			before:       pools("upf:xa#0"),
			after:        pools("upf:xa#0", "dns:xb#0"),
			failSet:      "xb",
			wantCalls:    []string{"set xb steering=hardware reserved=[0]"},
			wantCapacity: []string{"dns=1", "upf=1"},
			wantProblem:  "the NIC refused",
			wantAgain:    []string{"set xb steering=hardware reserved=[0]"},
		},
		{
			name:         "a managed netdev's new policy refused: kept managed, asked again only when the config changes",
			before:       pools("upf:xa#0"),
			after:        pools("upf:xa#0,1"),
			failSet:      "xa",
			wantCalls:    []string{"set xa steering=hardware reserved=[0 1]"},
			wantCapacity: []string{"upf=2"},
			wantProblem:  "the NIC refused",
		},
		{
			name:         "a netdev let go that the agent cannot release: said, and no longer managed",
			before:       pools("upf:xa#0", "dns:xb#0"),
			after:        pools("dns:xb#0"),
			failUnmanage: "xa",
			wantCalls:    []string{"unmanage xa"},
			wantCapacity: []string{"dns=1"},
			wantProblem:  "the NIC refused",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newFakeNode(t, fakeNetdev("xa", 4), fakeNetdev("xb", 4))
			d := n.started(c.before)
			ctx := context.Background()
			for pool, count := range c.allocs {
				if _, err := d.local.Alloc(ctx, api.AllocRequest{Pool: pool, Count: count, UID: 1000}); err != nil {
					t.Fatal(err)
				}
			}
			if c.gone != "" {
				n.netdevs = slices.DeleteFunc(n.netdevs, func(nd nic.Netdev) bool { return nd.Name == c.gone })
			}
			n.agent.setFail("set", c.failSet, errNIC)
			n.agent.setFail("unmanage", c.failUnmanage, errNIC)
			n.agent.take()
			n.reload(d, c.after)
			if got := n.agent.take(); !slices.Equal(got, c.wantCalls) {
				t.Errorf("the reload asked the agent\n  %q\nwant\n  %q", got, c.wantCalls)
			}
			if got := capacity(d); !slices.Equal(got, c.wantCapacity) {
				t.Errorf("pools after the reload %v, want %v", got, c.wantCapacity)
			}
			s, err := d.core.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if c.wantProblem == "" && s.ConfigError != "" || !strings.Contains(s.ConfigError, c.wantProblem) {
				t.Errorf("status says %q, want %q", s.ConfigError, c.wantProblem)
			}
			// A resync with the same config asks again only what failed
			// for a netdev not yet managed.
			if err := d.core.rec.request(ctx, reconcileRequest{discover: true}); err != nil {
				t.Fatal(err)
			}
			if got := n.agent.take(); !slices.Equal(got, c.wantAgain) {
				t.Errorf("the resync after it asked the agent\n  %q\nwant\n  %q", got, c.wantAgain)
			}
			// What the allocations hold is served throughout.
			if got, want := len(n.broker.servedIDs()), len(d.core.ledger.Allocations()); got != want {
				t.Errorf("%d allocations served, %d recorded", got, want)
			}
		})
	}
}

// before is what a previous daemon did on a fake node, by label: "A" is
// the first allocation it made, "A/c1" an attachment of A by container c1.
type before struct {
	t      *testing.T
	n      *fakeNode
	d      *Daemon
	labels map[string]string // allocation id or attachment key: label
	ids    map[string]string // label: allocation id
}

func (b *before) alloc(label string, queues ...uint32) {
	b.t.Helper()
	ctx := context.Background()
	var id string
	if b.d.opts.Standalone {
		a, err := b.d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: len(queues), UID: 1000})
		if err != nil {
			b.t.Fatal(err)
		}
		id = a.ID
	} else {
		var devs []string
		for _, q := range queues {
			devs = append(devs, ledger.DeviceID("xa", q))
		}
		if _, err := b.d.plugins.Allocate(ctx, "upf", devs); err != nil {
			b.t.Fatal(err)
		}
		a, ok := b.d.core.ledger.Device("upf", devs[0])
		if !ok {
			b.t.Fatalf("device %s not in the pool", devs[0])
		}
		id = b.d.core.ledger.Holder("upf", a.ID)
	}
	b.labels[id], b.ids[label] = label, id
}

// attachReq is container's ADD for allocation label: a flow to the pod's
// address, in the test's own network namespace.
func (b *before) attachReq(label, container string) api.CNIAddRequest {
	netns := fmt.Sprintf("/proc/%d/ns/net", os.Getpid()) // a namespace that stays, for every pod
	addr := netip.MustParseAddr("10.0.0.7")
	return api.CNIAddRequest{ContainerID: container, IfName: "net1", Allocation: b.ids[label], Netns: netns,
		Addresses: []netip.Addr{addr}, Flows: []api.CNIFlow{{Protocol: "udp", Dst: netip.PrefixFrom(addr, 32), DstPort: 5000}}}
}

func (b *before) attach(label, container string) {
	b.t.Helper()
	if _, err := b.d.local.CNIAdd(context.Background(), b.attachReq(label, container)); err != nil {
		b.t.Fatal(err)
	}
	b.labels[ledger.Key(container, "net1")] = label + "/" + container
}

// outcome is what a daemon left on the fake node, in labels: allocations
// with their state and attachments, what the broker serves, the flows on
// xa by owner, the allocation directories, and status' state errors.
func (b *before) outcome(d *Daemon) []string {
	name := func(id string) string {
		if l, ok := b.labels[id]; ok {
			return l
		}
		return id
	}
	var out []string
	var allocs []string
	for _, a := range d.core.ledger.Allocations() {
		s := name(a.ID) + " " + string(a.State)
		for _, att := range a.Attachments {
			s += " " + name(att.Key()) + ":" + string(att.State)
		}
		allocs = append(allocs, s)
	}
	slices.Sort(allocs)
	out = append(out, "allocations: "+strings.Join(allocs, ", "))
	var served []string
	for _, id := range b.n.broker.servedIDs() {
		served = append(served, name(id))
	}
	slices.Sort(served)
	out = append(out, "served: "+strings.Join(served, " "))
	b.n.agent.mu.Lock()
	var flows []string
	for owner := range b.n.agent.flows["xa"] {
		flows = append(flows, name(owner))
	}
	b.n.agent.mu.Unlock()
	slices.Sort(flows)
	out = append(out, "flows: "+strings.Join(flows, " "))
	ents, _ := os.ReadDir(d.opts.AllocDir)
	var dirs []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			dirs = append(dirs, name(e.Name()))
		}
	}
	slices.Sort(dirs)
	out = append(out, "dirs: "+strings.Join(dirs, " "))
	s, err := d.core.Status(context.Background())
	if err != nil {
		b.t.Fatal(err)
	}
	var errs []string
	for _, e := range s.StateErrors {
		e = strings.ReplaceAll(e, b.n.dir, "<dir>")
		for id, l := range b.labels {
			e = strings.ReplaceAll(e, id, l)
		}
		errs = append(errs, e)
	}
	out = append(out, "state errors: "+strings.Join(errs, "; "))
	return out
}

// TestRecoveryDecisions: what a daemon does at start with what a previous
// one left, against fakes (the node agent's flows outlive the daemon as
// the kernel's do): a free or an attachment a crash left half done is
// finished, live allocations are served again with their flows, flows no
// record owns go unless a record is unreadable, kubelet decides which
// device-plugin allocations still have a container, and an undo that
// fails keeps its record for the collector.
func TestRecoveryDecisions(t *testing.T) {
	errNIC := errors.New("the NIC refused")
	for _, c := range []struct {
		name    string
		kubelet podResources // nil: standalone
		left    func(b *before)
		// at the new start
		failUnsteer bool
		want        []string
	}{
		{
			name: "allocations and attachments served again, flows kept",
			left: func(b *before) {
				b.alloc("A", 0)
				b.attach("A", "c1")
				b.alloc("B", 1)
			},
			want: []string{"allocations: A active A/c1:active, B active", "served: A B", "flows: A/c1", "dirs: A B", "state errors: "},
		},
		{
			name: "a free begun is finished: flows, record and directory go",
			left: func(b *before) {
				b.alloc("A", 0)
				b.attach("A", "c1")
				b.alloc("B", 1)
				if _, err := b.d.core.ledger.BeginFree(b.ids["A"]); err != nil {
					t.Fatal(err)
				}
			},
			want: []string{"allocations: B active", "served: B", "flows: ", "dirs: B", "state errors: "},
		},
		{
			name: "an ADD begun is rolled back: its flows go, the allocation stays",
			left: func(b *before) {
				b.alloc("A", 0)
				req := b.attachReq("A", "c1")
				a, _ := b.d.core.ledger.Get(b.ids["A"])
				att := ledger.Attachment{Attachment: api.Attachment{CNIAddRequest: req, Mode: api.ModeQueue}}
				att, _, err := b.d.core.ledger.BeginAttach(a.ID, att)
				if err != nil {
					t.Fatal(err)
				}
				b.labels[att.Key()] = "A/c1"
				flows, err := agentFlows(req.Flows, a.Queues)
				if err != nil {
					t.Fatal(err)
				}
				if err := b.n.agent.Steer("xa", att.Key(), flows); err != nil { // then the crash
					t.Fatal(err)
				}
			},
			want: []string{"allocations: A active", "served: A", "flows: ", "dirs: A", "state errors: "},
		},
		{
			name: "a DEL begun is finished",
			left: func(b *before) {
				b.alloc("A", 0)
				b.attach("A", "c1")
				if _, _, err := b.d.core.ledger.BeginDetach(ledger.Key("c1", "net1")); err != nil {
					t.Fatal(err)
				}
			},
			want: []string{"allocations: A active", "served: A", "flows: ", "dirs: A", "state errors: "},
		},
		{
			name: "a DEL begun whose flows cannot be removed: the record stays ending, and says why",
			left: func(b *before) {
				b.alloc("A", 0)
				b.attach("A", "c1")
				if _, _, err := b.d.core.ledger.BeginDetach(ledger.Key("c1", "net1")); err != nil {
					t.Fatal(err)
				}
			},
			failUnsteer: true,
			// The steering sync after it removes the flows no live
			// attachment owns: the DEL's go that way.
			want: []string{"allocations: A active A/c1:ending", "served: A", "flows: ", "dirs: A",
				"state errors: A/c1: flows on xa not removed yet: the NIC refused"},
		},
		{
			name: "a free begun whose flows cannot be removed: served until it is done",
			left: func(b *before) {
				b.alloc("A", 0)
				b.attach("A", "c1")
				if _, err := b.d.core.ledger.BeginFree(b.ids["A"]); err != nil {
					t.Fatal(err)
				}
			},
			failUnsteer: true,
			want: []string{"allocations: A ending A/c1:active", "served: A", "flows: A/c1", "dirs: A",
				"state errors: A: allocation A not freed yet (tried again every collection): attachment A/c1: the NIC refused"},
		},
		{
			name: "flows and a directory no record owns go",
			left: func(b *before) {
				b.alloc("A", 0)
				b.attach("A", "c1")
				if err := b.n.agent.Steer("xa", "stray/net1", nil); err != nil {
					t.Fatal(err)
				}
				if err := os.Mkdir(filepath.Join(b.d.opts.AllocDir, "stray"), 0o755); err != nil {
					t.Fatal(err)
				}
			},
			want: []string{"allocations: A active A/c1:active", "served: A", "flows: A/c1", "dirs: A", "state errors: "},
		},
		{
			name: "an unreadable record: nothing any record may own is removed",
			left: func(b *before) {
				b.alloc("A", 0)
				b.attach("A", "c1")
				b.alloc("B", 1)
				b.attach("B", "c2")
				if err := os.WriteFile(filepath.Join(b.d.opts.StateDir, "allocations", b.ids["B"]+".json"), []byte("{"), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			want: []string{"allocations: A active A/c1:active", "served: A", "flows: A/c1 B/c2", "dirs: A B",
				"state errors: allocation B: <dir>/state/allocations/B.json: unexpected end of JSON input"},
		},
		{
			name:    "kubelet: an allocation no running container holds is freed",
			kubelet: fakeKubelet{held: map[string]bool{"xdpq.io/upf/" + ledger.DeviceID("xa", 0): true}},
			left: func(b *before) {
				b.alloc("A", 0)
				b.attach("A", "c1")
				b.alloc("B", 1)
				b.attach("B", "c2")
			},
			want: []string{"allocations: A active A/c1:active", "served: A", "flows: A/c1", "dirs: A", "state errors: "},
		},
		{
			name:    "kubelet not answering: every allocation kept",
			kubelet: fakeKubelet{err: errors.New("connection refused")},
			left: func(b *before) {
				b.alloc("A", 0)
				b.alloc("B", 1)
			},
			want: []string{"allocations: A active, B active", "served: A B", "flows: ", "dirs: A B", "state errors: "},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newFakeNode(t, fakeNetdev("xa", 4))
			n.kubelet = c.kubelet
			cfg := pools("upf:xa#0-3")
			// The previous daemon, whose kubelet held everything.
			if c.kubelet != nil {
				n.kubelet = fakeKubelet{err: errors.New("not asked")}
			}
			d1, stop := n.daemon(cfg)
			if err := d1.core.start(context.Background()); err != nil {
				t.Fatal(err)
			}
			b := &before{t: t, n: n, d: d1, labels: map[string]string{}, ids: map[string]string{}}
			c.left(b)
			stop()
			n.broker = newFakeBroker() // the broker goes with its daemon; the agent's flows stay
			n.kubelet = c.kubelet
			if c.failUnsteer {
				n.agent.setFail("unsteer", "xa", errNIC)
			}
			d2, _ := n.daemon(cfg)
			if err := d2.core.start(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got := b.outcome(d2); !slices.Equal(got, c.want) {
				t.Errorf("after the start:\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(c.want, "\n  "))
			}
			// What failed is finished by the collector once it can be.
			if c.failUnsteer {
				n.agent.setFail("unsteer", "xa", nil)
				d2.core.retryUndone(context.Background())
				if s, _ := d2.core.Status(context.Background()); len(s.StateErrors) > 0 {
					t.Errorf("after the retry: %q", s.StateErrors)
				}
				for _, a := range d2.core.ledger.Allocations() {
					for _, att := range a.Attachments {
						if att.State != ledger.Active {
							t.Errorf("after the retry: %s %s", att.Key(), att.State)
						}
					}
				}
			}
		})
	}
}

// TestContainerRestartDecisions: what kubelet's Allocate for a restarted
// container (the same devices again) carries over of the old allocation,
// against fakes: an attachment whose pod's namespace is still the one ADD
// saw keeps its flows and its pod as the lease's owner; one whose
// namespace went, or an allocation of other devices, ends it.
func TestContainerRestartDecisions(t *testing.T) {
	for _, c := range []struct {
		name      string
		again     []uint32 // the queues of the second Allocate
		podGone   bool     // the pod's namespace went before it
		want      []string
		wantOwner bool // the new allocation is the attached pod's
	}{
		{name: "the same devices, the pod alive: carried", again: []uint32{0},
			want:      []string{"allocations: A2 active A/c1:active", "served: A2", "flows: A/c1", "dirs: A2", "state errors: "},
			wantOwner: true},
		{name: "the same devices, the pod's namespace gone: ended", again: []uint32{0}, podGone: true,
			want: []string{"allocations: A2 active", "served: A2", "flows: ", "dirs: A2", "state errors: "}},
		{name: "more devices: ended", again: []uint32{0, 1},
			want: []string{"allocations: A2 active", "served: A2", "flows: ", "dirs: A2", "state errors: "}},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newFakeNode(t, fakeNetdev("xa", 4))
			n.kubelet = fakeKubelet{err: errors.New("not asked")}
			d, _ := n.daemon(pools("upf:xa#0-3"))
			if err := d.core.start(context.Background()); err != nil {
				t.Fatal(err)
			}
			b := &before{t: t, n: n, d: d, labels: map[string]string{}, ids: map[string]string{}}
			b.alloc("A", 0)
			// The pod: a process whose namespace path goes when it exits.
			pod := exec.Command("sleep", "600")
			if err := pod.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = pod.Process.Kill(); _ = pod.Wait() })
			req := b.attachReq("A", "c1")
			req.Netns = fmt.Sprintf("/proc/%d/ns/net", pod.Process.Pid)
			req.PodUID = "pod-uid-1"
			if _, err := d.local.CNIAdd(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			b.labels[ledger.Key("c1", "net1")] = "A/c1"
			if c.podGone {
				_ = pod.Process.Kill()
				_ = pod.Wait()
			}
			b.alloc("A2", c.again...)
			if got := b.outcome(d); !slices.Equal(got, c.want) {
				t.Errorf("after the second Allocate:\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(c.want, "\n  "))
			}
			a, _ := d.core.ledger.Get(b.ids["A2"])
			if got := a.Owner.PodUID == "pod-uid-1"; got != c.wantOwner {
				t.Errorf("the new allocation's owner %+v; want the attached pod's: %v", a.Owner, c.wantOwner)
			}
			n.broker.mu.Lock()
			o := n.broker.owner[a.ID]
			n.broker.mu.Unlock()
			if got := o.PodUID == "pod-uid-1"; got != c.wantOwner {
				t.Errorf("the broker's owner %+v; want the attached pod's: %v", o, c.wantOwner)
			}
		})
	}
}

// TestQueueInfo: each queue an allocation holds is a series of
// xdpq_queue_info naming its pool, allocation and pod once the pod is
// known (its CNI attachment), so that the per-queue families can be
// joined per pod.
func TestQueueInfo(t *testing.T) {
	n := newFakeNode(t, fakeNetdev("xa", 4))
	d, _ := n.daemon(pools("upf:xa#0-3"))
	if err := d.core.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.metrics = newMetrics(d)
	b := &before{t: t, n: n, d: d, labels: map[string]string{}, ids: map[string]string{}}
	b.alloc("A", 0, 1) // standalone: the daemon chooses
	b.alloc("B", 2)
	req := b.attachReq("A", "c1")
	req.PodNamespace, req.PodName = "upf", "upf-0"
	if _, err := d.local.CNIAdd(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	fams, err := d.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range fams {
		if f.GetName() != "xdpq_queue_info" {
			continue
		}
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				v := l.GetValue()
				if v == b.ids["A"] || v == b.ids["B"] {
					v = b.labels[v]
				}
				ls = append(ls, l.GetName()+"="+v)
			}
			got = append(got, fmt.Sprintf("%s %g", strings.Join(ls, ","), m.GetGauge().GetValue()))
		}
	}
	slices.Sort(got)
	want := []string{
		"allocation=A,namespace=upf,netdev=xa,pod=upf-0,pool=upf,queue=0 1",
		"allocation=A,namespace=upf,netdev=xa,pod=upf-0,pool=upf,queue=1 1",
		"allocation=B,namespace=,netdev=xa,pod=,pool=upf,queue=2 1",
	}
	if !slices.Equal(got, want) {
		t.Errorf("xdpq_queue_info:\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// TestNodeAddressDecisions: in a queue pool, a flow whose destination
// is an address of the node (static IPAM naming it as the pod's own,
// then "ipam" or the address itself as the destination) is refused as
// the request's fault, naming the address and its netdev, unless the
// pool's sharedDestinations grant it; the node is asked only about what
// a flow claims as the pod's own; a lookup that fails refuses the ADD
// as unavailable, never lets it through. A refusal leaves no attachment
// and no flow, and the allocation takes a good ADD after it.
func TestNodeAddressDecisions(t *testing.T) {
	node := map[netip.Addr]string{netip.MustParseAddr("10.0.0.5"): "eth0", netip.MustParseAddr("fd00::5"): "eth0",
		netip.MustParseAddr("10.99.0.1"): "xa"}
	udp := func(dst string, port uint16) api.CNIFlow {
		return api.CNIFlow{Protocol: "udp", Dst: netip.MustParsePrefix(dst), DstPort: port}
	}
	addrs := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, a := range s {
			out = append(out, netip.MustParseAddr(a))
		}
		return out
	}
	errLookup := errors.New("netlink: permission denied")
	for _, c := range []struct {
		name      string
		shared    string // the pool's sharedDestinations, YAML
		addresses []netip.Addr
		flows     []api.CNIFlow
		lookupErr error
		wantAsked []string
		kind      error  // nil: attached
		says      string // in the refusal
	}{
		{name: "the pod's own address, not the node's", addresses: addrs("10.77.0.4"), flows: []api.CNIFlow{udp("10.77.0.4/32", 2152)},
			wantAsked: []string{"[10.77.0.4]"}},
		{name: "static IPAM names the node's address", addresses: addrs("10.0.0.5"), flows: []api.CNIFlow{udp("10.0.0.5/32", 22)},
			wantAsked: []string{"[10.0.0.5]"}, kind: api.ErrInvalid,
			says: "pool upf: flow udp 10.0.0.5:22: destination 10.0.0.5 is an address of the node (eth0): " +
				"a pod's flows may not take the node's own traffic; an operator grants it with the pool's sharedDestinations"},
		{name: "the pool's netdev's own address", addresses: addrs("10.99.0.1"), flows: []api.CNIFlow{udp("10.99.0.1/32", 2152)},
			wantAsked: []string{"[10.99.0.1]"}, kind: api.ErrInvalid, says: "destination 10.99.0.1 is an address of the node (xa)"},
		{name: "the node's IPv6 address", addresses: addrs("fd00::5"), flows: []api.CNIFlow{udp("fd00::5/128", 0)},
			wantAsked: []string{"[fd00::5]"}, kind: api.ErrInvalid, says: "flow udp fd00::5: destination fd00::5 is an address of the node (eth0)"},
		{name: "ipam resolved to two addresses, the second the node's", addresses: addrs("10.77.0.4", "10.0.0.5"),
			flows: []api.CNIFlow{udp("10.77.0.4/32", 53), udp("10.0.0.5/32", 53)}, wantAsked: []string{"[10.77.0.4 10.0.0.5]"},
			kind: api.ErrInvalid, says: "flow udp 10.0.0.5:53: destination 10.0.0.5 is an address of the node (eth0)"},
		{name: "the node's address written v4-mapped: the v4 address the filter matches", addresses: addrs("::ffff:10.0.0.5"),
			flows: []api.CNIFlow{udp("::ffff:10.0.0.5/128", 22)}, wantAsked: []string{"[10.0.0.5]"}, kind: api.ErrInvalid,
			says: "flow udp 10.0.0.5:22: destination 10.0.0.5 is an address of the node (eth0)"},
		{name: "static IPAM names a multicast group: refused before the node is asked", addresses: addrs("224.0.0.18"),
			flows: []api.CNIFlow{udp("224.0.0.18/32", 0)}, kind: api.ErrInvalid,
			says: "pool upf: flow udp 224.0.0.18: destination 224.0.0.18 is a multicast group, never one pod's own address"},
		{name: "the node's address granted: the operator's choice, the node not asked", shared: "[10.0.0.5]",
			addresses: addrs("10.0.0.5"), flows: []api.CNIFlow{udp("10.0.0.5/32", 22)}},
		{name: "an own address that is the node's but no flow takes: nothing taken", shared: "[192.0.2.0/28]",
			addresses: addrs("10.0.0.5"), flows: []api.CNIFlow{udp("192.0.2.9/32", 80)}},
		{name: "no flows: the node not asked", addresses: addrs("10.0.0.5")},
		{name: "the node's addresses unreadable: refused, not let through", addresses: addrs("10.77.0.4"),
			flows: []api.CNIFlow{udp("10.77.0.4/32", 2152)}, lookupErr: errLookup, wantAsked: []string{"[10.77.0.4]"},
			kind: api.ErrUnavailable, says: "the node's addresses, which a pod's flows may not take: netlink: permission denied"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newFakeNode(t, fakeNetdev("xa", 4))
			n.addrs, n.addrsErr = node, c.lookupErr
			cfg := "pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-3']}"
			if c.shared != "" {
				cfg += ", sharedDestinations: " + c.shared
			}
			d, _ := n.daemon(cfg + "}]\n")
			if err := d.core.start(context.Background()); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 1, UID: 1000})
			if err != nil {
				t.Fatal(err)
			}
			_, err = d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Allocation: a.ID, Addresses: c.addresses, Flows: c.flows})
			refused := refusedAs(t, err, c.kind, c.says)
			if got := n.asked.take(); !slices.Equal(got, c.wantAsked) {
				t.Errorf("the node asked about %q; want %q", got, c.wantAsked)
			}
			if !refused {
				return
			}
			n.leftAfterRefusal(d, "c1/net1")
			n.addrsErr = nil
			good := api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Allocation: a.ID, Addresses: addrs("10.77.0.4"),
				Flows: []api.CNIFlow{udp("10.77.0.4/32", 2152)}}
			if _, err := d.local.CNIAdd(ctx, good); err != nil {
				t.Errorf("a good ADD after the refusal: %v", err)
			}
		})
	}
}

// TestClaimDecisions: an ADD whose flows steer, as its pod's own, an
// address that a live attachment of another pod on the same netdev
// steers as its own (two NADs with static IPAM naming one address) is
// refused as a conflict naming the other attachment, and leaves nothing;
// the same pod's attachments (by pod UID, sandbox or network namespace),
// another netdev and an address no flow takes are no conflict; once the
// first attachment is gone, the address is free. (An address a pool
// grants is no pod's own, and no pod of another pool may claim it:
// TestGrantIsItsPools.)
func TestClaimDecisions(t *testing.T) {
	own := netip.MustParseAddr("10.77.0.4")
	netns := fmt.Sprintf("/proc/%d/ns/net", os.Getpid()) // the first pod's
	flowTo := func(a netip.Addr, port uint16) []api.CNIFlow {
		return []api.CNIFlow{{Protocol: "udp", Dst: netip.PrefixFrom(a, a.BitLen()), DstPort: port}}
	}
	for _, c := range []struct {
		name string
		req  api.CNIAddRequest // the second ADD, of a second allocation of pool
		pool string
		says string // "" attached
	}{
		{name: "another pod, the same address and netdev", pool: "upf",
			req:  api.CNIAddRequest{ContainerID: "c2", PodUID: "uid-b", Addresses: []netip.Addr{own}, Flows: flowTo(own, 80)},
			says: "address 10.77.0.4: attachment c1/net1 (pod upf/upf-0) on xa steers it as its pod's own address already"},
		{name: "the same pod's second attachment", pool: "upf",
			req: api.CNIAddRequest{ContainerID: "c2", PodUID: "uid-a", Addresses: []netip.Addr{own}, Flows: flowTo(own, 80)}},
		{name: "the same sandbox", pool: "upf",
			req: api.CNIAddRequest{ContainerID: "c1", IfName: "net2", Addresses: []netip.Addr{own}, Flows: flowTo(own, 80)}},
		{name: "the same network namespace", pool: "upf",
			req: api.CNIAddRequest{ContainerID: "c2", Netns: netns, Addresses: []netip.Addr{own}, Flows: flowTo(own, 80)}},
		{name: "another netdev", pool: "dns",
			req: api.CNIAddRequest{ContainerID: "c2", PodUID: "uid-b", Addresses: []netip.Addr{own}, Flows: flowTo(own, 80)}},
		{name: "the address held, but no flow of the pod takes it", pool: "upf",
			req: api.CNIAddRequest{ContainerID: "c2", PodUID: "uid-b", Addresses: []netip.Addr{own, netip.MustParseAddr("10.77.0.9")},
				Flows: flowTo(netip.MustParseAddr("10.77.0.9"), 80)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newFakeNode(t, fakeNetdev("xa", 4), fakeNetdev("xb", 4))
			d, _ := n.daemon("pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}, sharedDestinations: [192.0.2.0/28]}, " +
				"{name: vip, steering: software, devices: {netdevs: ['xa#2-3']}, sharedDestinations: [10.78.0.0/24]}, " +
				"{name: dns, steering: software, devices: {netdevs: ['xb#0-3']}}]\n")
			if err := d.core.start(context.Background()); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			first, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 1, UID: 1000})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Allocation: first.ID, PodUID: "uid-a", Netns: netns,
				PodNamespace: "upf", PodName: "upf-0", Addresses: []netip.Addr{own}, Flows: flowTo(own, 2152)}); err != nil {
				t.Fatal(err)
			}
			second, err := d.local.Alloc(ctx, api.AllocRequest{Pool: c.pool, Count: 1, UID: 1000})
			if err != nil {
				t.Fatal(err)
			}
			req := c.req
			req.Allocation = second.ID
			if req.IfName == "" {
				req.IfName = "net1"
			}
			if _, err = d.local.CNIAdd(ctx, req); !refusedAs(t, err, api.ErrConflict, c.says) {
				return
			}
			n.leftAfterRefusal(d, ledger.Key(req.ContainerID, req.IfName), "c1/net1")
			if err := d.local.CNIDel(ctx, api.AttachmentRef{ContainerID: "c1", IfName: "net1"}); err != nil {
				t.Fatal(err)
			}
			if _, err := d.local.CNIAdd(ctx, req); err != nil {
				t.Errorf("the ADD once the first attachment is gone: %v", err)
			}
		})
	}
}

// TestOtherPodAddressDecisions: an ADD whose flows claim, as the pod's
// own, the primary address of another pod of this node (a NAD's static
// IPAM naming a neighbour's podIP) is refused as a conflict naming that
// pod, before any kernel work; the pod's own podIP, a pod named by
// namespace and name when no UID came, and an address the pool grants
// attach.
func TestOtherPodAddressDecisions(t *testing.T) {
	victim := netip.MustParseAddr("10.244.0.5")
	flowTo := func(port uint16) []api.CNIFlow {
		return []api.CNIFlow{{Protocol: "udp", Dst: netip.PrefixFrom(victim, 32), DstPort: port}}
	}
	for _, c := range []struct {
		name   string
		shared string
		req    api.CNIAddRequest
		says   string // "" attached
	}{
		{name: "a neighbour's podIP", req: api.CNIAddRequest{PodUID: "uid-thief", PodNamespace: "evil", PodName: "thief"},
			says: "pool upf: address 10.244.0.5 is pod shop/web-0's (its podIPs): a pod's flows may not take another pod's traffic"},
		{name: "the pod's own podIP", req: api.CNIAddRequest{PodUID: "uid-web", PodNamespace: "shop", PodName: "web-0"}},
		{name: "the pod's own, by name when no UID came", req: api.CNIAddRequest{PodNamespace: "shop", PodName: "web-0"}},
		{name: "another pod by name when no UID came", req: api.CNIAddRequest{PodNamespace: "evil", PodName: "thief"},
			says: "address 10.244.0.5 is pod shop/web-0's"},
		{name: "granted to the pool", shared: ", sharedDestinations: [10.244.0.0/24]",
			req: api.CNIAddRequest{PodUID: "uid-thief", PodNamespace: "evil", PodName: "thief"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newFakeNode(t, fakeNetdev("xa", 4))
			n.pods = newFakePods(kubepods.Pod{UID: "uid-web", Namespace: "shop", Name: "web-0", IPs: []netip.Addr{victim}})
			d, _ := n.daemon("pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-3']}" + c.shared + "}]\n")
			if err := d.core.start(context.Background()); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 1, UID: 1000})
			if err != nil {
				t.Fatal(err)
			}
			req := c.req
			req.ContainerID, req.IfName, req.Allocation = "c1", "net1", a.ID
			req.Addresses, req.Flows = []netip.Addr{victim}, flowTo(80)
			if _, err = d.local.CNIAdd(ctx, req); !refusedAs(t, err, api.ErrConflict, c.says) {
				return
			}
			n.leftAfterRefusal(d, "c1/net1")
		})
	}
}

// leftAfterRefusal checks what a refused ADD of attachment key left: no
// record of it, and flows on xa of the owners others alone.
func (n *fakeNode) leftAfterRefusal(d *Daemon, key string, others ...string) {
	n.t.Helper()
	if _, ok := d.core.ledger.Attachment(key); ok {
		n.t.Errorf("the refused ADD left attachment %s", key)
	}
	n.agent.mu.Lock()
	owners := slices.Sorted(maps.Keys(n.agent.flows["xa"]))
	n.agent.mu.Unlock()
	if !slices.Equal(owners, others) && len(owners)+len(others) > 0 {
		n.t.Errorf("flows on xa by %v after the refused ADD; want %v's alone", owners, others)
	}
}

// refusedAs checks an ADD's outcome: attached when says is "", else
// refused as kind, saying says. It reports whether the ADD was refused.
func refusedAs(t *testing.T, err, kind error, says string) bool {
	t.Helper()
	if says == "" {
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		return false
	}
	if !errors.Is(err, kind) || !strings.Contains(fmt.Sprint(err), says) {
		t.Fatalf("ADD: %v (code %s); want %v saying %q", err, api.CodeOf(err), kind, says)
	}
	return true
}
