package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"
	"golang.org/x/sync/errgroup"

	"github.com/xdpq/xdpq/internal/testing/syncbuf"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/config"
	"github.com/xdpq/xdpq/pkg/ledger"
	"github.com/xdpq/xdpq/pkg/mover"
	"github.com/xdpq/xdpq/pkg/nic"
	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// Small fakes of what the daemon meets in the kernel and on the node, for
// table tests of its decisions (what a reload changes, what a start
// recovers, what an undo leaves) that run without root, the way
// kubelet's managers are tested. The real-kernel tests beside them show
// the same paths on veth.

// calls is a fake's record of what it was asked, in order.
type calls struct {
	mu  sync.Mutex
	log []string
}

func (c *calls) add(format string, args ...any) {
	c.mu.Lock()
	c.log = append(c.log, fmt.Sprintf(format, args...))
	c.mu.Unlock()
}

// take returns the calls since the last take.
func (c *calls) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.log
	c.log = nil
	return l
}

// fakeAgent is the node agent: it records policies and flows, and fails
// what fail names ("set eth1", "unsteer eth1", ...).
type fakeAgent struct {
	calls
	mu     sync.Mutex
	fail   map[string]error
	policy map[string]agent.Policy
	flows  map[string]map[string][]agent.Flow // netdev, owner
	down   map[string]bool                    // netdevs whose link is down
	state  map[string]agent.Status            // State and Reason a netdev reports, if not None
	listen chan struct{}
}

func newFakeAgent() *fakeAgent {
	l := make(chan struct{})
	close(l)
	return &fakeAgent{fail: map[string]error{}, policy: map[string]agent.Policy{}, flows: map[string]map[string][]agent.Flow{}, listen: l}
}

func (f *fakeAgent) failing(op, netdev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fail[op+" "+netdev]
}

func (f *fakeAgent) setFail(op, netdev string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.fail, op+" "+netdev)
		return
	}
	f.fail[op+" "+netdev] = err
}

func (f *fakeAgent) Set(netdev string, p agent.Policy) error {
	f.add("set %s %s", netdev, policyString(p))
	if err := f.failing("set", netdev); err != nil {
		return err
	}
	f.mu.Lock()
	f.policy[netdev] = p
	f.mu.Unlock()
	return nil
}

func (f *fakeAgent) Unmanage(netdev string) error {
	f.add("unmanage %s", netdev)
	if err := f.failing("unmanage", netdev); err != nil {
		return err
	}
	f.mu.Lock()
	delete(f.policy, netdev)
	f.mu.Unlock()
	return nil
}

func (f *fakeAgent) Status() []agent.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []agent.Status
	for _, n := range slices.Sorted(maps.Keys(f.policy)) {
		st := agent.Status{Netdev: n, State: agent.StateNone, Policy: f.policy[n], LinkUp: !f.down[n], RXQueues: 4,
			Flows: len(f.flows[n])}
		if s, ok := f.state[n]; ok {
			st.State, st.Reason = s.State, s.Reason
		}
		out = append(out, st)
	}
	return out
}

func (f *fakeAgent) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

func (f *fakeAgent) Listening() <-chan struct{}      { return f.listen }
func (f *fakeAgent) Close() error                    { return nil }
func (f *fakeAgent) Collector() prometheus.Collector { return prometheus.NewRegistry() }
func (f *fakeAgent) Ifindex(netdev string) (int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.policy[netdev]
	return 1, ok
}

func (f *fakeAgent) Steer(netdev, owner string, flows []agent.Flow) error {
	f.add("steer %s %s", netdev, owner)
	if err := f.failing("steer", netdev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.flows[netdev] == nil {
		f.flows[netdev] = map[string][]agent.Flow{}
	}
	f.flows[netdev][owner] = flows
	return nil
}

func (f *fakeAgent) Unsteer(netdev, owner string) error {
	f.add("unsteer %s %s", netdev, owner)
	if err := f.failing("unsteer", netdev); err != nil {
		return err
	}
	f.mu.Lock()
	delete(f.flows[netdev], owner)
	f.mu.Unlock()
	return nil
}

func (f *fakeAgent) VerifySteering(netdev, owner string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.flows[netdev][owner]; !ok {
		return fmt.Errorf("flows of %s on %s not installed", owner, netdev)
	}
	return nil
}

// RepairSteering: the fake's flows are never gone behind its back.
func (f *fakeAgent) RepairSteering(string) (map[string]int, error) { return nil, nil }

// EnsureSteering steers owner's flows unless it has some (the fake
// keeps an owner's flows whole).
func (f *fakeAgent) EnsureSteering(netdev, owner string, flows []agent.Flow) (int, error) {
	if f.VerifySteering(netdev, owner) == nil {
		return 0, nil
	}
	if err := f.Steer(netdev, owner, flows); err != nil {
		return 0, err
	}
	return len(flows), nil
}

func (f *fakeAgent) SyncSteering(netdev string, keep map[string][]agent.Flow) (int, error) {
	f.add("sync-steering %s keep %s", netdev, strings.Join(slices.Sorted(maps.Keys(keep)), ","))
	f.mu.Lock()
	defer f.mu.Unlock()
	removed := 0
	for owner := range f.flows[netdev] {
		if _, ok := keep[owner]; !ok {
			delete(f.flows[netdev], owner)
			removed++
		}
	}
	return removed, nil
}

func (f *fakeAgent) AdoptSteering(netdev string, keep map[string][]agent.Flow) (int, error) {
	f.add("adopt-steering %s keep %s", netdev, strings.Join(slices.Sorted(maps.Keys(keep)), ","))
	f.mu.Lock()
	defer f.mu.Unlock()
	unknown := 0
	for owner := range f.flows[netdev] {
		if _, ok := keep[owner]; !ok {
			unknown++
		}
	}
	return unknown, nil
}

// policyString is a policy in a table's words.
func policyString(p agent.Policy) string {
	s := fmt.Sprintf("steering=%s reserved=%v", p.Steering, p.Reserved)
	if p.AttachAlways {
		s += " always"
	}
	if p.Exclusive {
		s += " exclusive"
	}
	if p.BusyPoll {
		s += " busypoll"
	}
	return s
}

// fakeBroker serves allocations in a map.
type fakeBroker struct {
	calls
	mu     sync.Mutex
	served map[string]broker.Allocation
	owner  map[string]broker.Owner
	// failOwner, if set, fails SetOwner.
	failOwner error
}

func newFakeBroker() *fakeBroker {
	return &fakeBroker{served: map[string]broker.Allocation{}, owner: map[string]broker.Owner{}}
}

func (f *fakeBroker) Add(a broker.Allocation) error {
	f.add("serve %s", a.ID)
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.served[a.ID]; ok {
		return fmt.Errorf("allocation %s served already", a.ID)
	}
	f.served[a.ID] = a
	return os.MkdirAll(a.Dir, 0o755) // where the socket would be, as the broker makes it
}

func (f *fakeBroker) Remove(id string) error {
	f.add("unserve %s", id)
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.served[id]; !ok {
		return fmt.Errorf("allocation %s not served", id)
	}
	delete(f.served, id)
	return nil
}

func (f *fakeBroker) Retarget(id string, dev xsk.Netdev, own broker.PodDatapath) error {
	f.add("retarget %s %s", id, dev.Name)
	return nil
}

func (f *fakeBroker) SetOwner(id string, o broker.Owner) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failOwner != nil {
		return f.failOwner
	}
	f.owner[id] = o
	return nil
}

func (f *fakeBroker) SetLimits(string, wire.Limits, *wire.BusyPoll) error { return nil }
func (f *fakeBroker) Leased(string) bool                                  { return false }
func (f *fakeBroker) Holder(string) (broker.Peer, bool)                   { return broker.Peer{}, false }
func (f *fakeBroker) Stats() []broker.QueueStats                          { return nil }
func (f *fakeBroker) Refusals() map[string]uint64                         { return nil }
func (f *fakeBroker) Close()                                              {}

func (f *fakeBroker) servedIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.served))
}

// fakeMover moves nothing; MoveOut fails with fail when set.
type fakeMover struct {
	calls
	mu   sync.Mutex
	fail error
}

func (f *fakeMover) Prepare(netdev, ifname string, mtu int) (mover.Record, error) {
	return mover.Record{Name: netdev, IfName: ifname}, nil
}

func (f *fakeMover) MoveIn(r mover.Record, pod netns.NsHandle) (mover.Link, error) {
	return mover.Link{}, fmt.Errorf("the fake mover moves nothing in")
}

func (f *fakeMover) MoveOut(ctx context.Context, r mover.Record, pod netns.NsHandle) error {
	f.add("move-out %s", r.Name)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fail
}

func (f *fakeMover) Recover(ctx context.Context, r mover.Record, pod netns.NsHandle) (mover.Location, error) {
	return mover.Location{}, mover.ErrGone
}

func (f *fakeMover) Close() error { return nil }

// fakeKubelet answers PodResources' List with held, or fails with err.
type fakeKubelet struct {
	held map[string]bool
	err  error
}

func (f fakeKubelet) heldDevices(context.Context) (map[string]bool, error) { return f.held, f.err }
func (f fakeKubelet) podDevices(context.Context, string, string) (map[string][]string, error) {
	return nil, f.err
}

// fakeNode is a node as the decision tests see it: its netdevs, its state
// directories (which outlive a daemon, as on a node), and the fakes the
// daemons on it use.
type fakeNode struct {
	t       *testing.T
	dir     string
	netdevs []nic.Netdev
	agent   *fakeAgent
	broker  *fakeBroker
	mover   *fakeMover
	kubelet podResources
	// dra and pods, if set, are the options of the node's daemons.
	dra  *DRA
	pods PodDirectory
	logs *syncbuf.Buffer
	// addrs are the addresses the node's netdevs hold, by netdev
	// name; addrsErr fails the lookup; asked records each lookup.
	addrs    map[netip.Addr]string
	addrsErr error
	asked    calls
}

func newFakeNode(t *testing.T, netdevs ...nic.Netdev) *fakeNode {
	t.Helper()
	return &fakeNode{t: t, dir: t.TempDir(), netdevs: netdevs, agent: newFakeAgent(), broker: newFakeBroker(), mover: &fakeMover{},
		logs: &syncbuf.Buffer{}}
}

// veth is a netdev with n rx queues.
func fakeNetdev(name string, n int) nic.Netdev {
	return nic.Netdev{Name: name, Ifindex: 1, Virtual: true, NUMANode: -1, RXQueues: n, TXQueues: n, OperUp: true}
}

func (n *fakeNode) writeConfig(yaml string) string {
	n.t.Helper()
	path := filepath.Join(n.dir, "config.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		n.t.Fatal(err)
	}
	return path
}

// started is daemon with its core started (recovery and the first
// reconcile done), failing the test if it cannot; the daemon stops when
// the test ends.
func (n *fakeNode) started(yaml string) *Daemon {
	t := n.t
	t.Helper()
	d, _ := n.daemon(yaml)
	if err := d.core.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return d
}

// daemon is a daemon on the node, standalone unless kubelet is set, with
// the config yaml; its reconciler runs until the test ends (or stop).
// It has not started: start is the test's to call.
func (n *fakeNode) daemon(yaml string) (d *Daemon, stop func()) {
	t := n.t
	t.Helper()
	path := n.writeConfig(yaml)
	opts := Options{ConfigPath: path, NodeName: "node-1", StateDir: filepath.Join(n.dir, "state"), AllocDir: filepath.Join(n.dir, "alloc"),
		PinDir: filepath.Join(n.dir, "pins"), Resync: time.Hour, CollectPeriod: time.Hour, Standalone: n.kubelet == nil, PluginDir: filepath.Join(n.dir, "plugins"),
		DeviceInfoDir: filepath.Join(n.dir, "devinfo"), DRA: n.dra, Pods: n.pods,
		Logger: slog.New(slog.NewTextHandler(n.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	d = newDaemon(opts)
	d.core.agent, d.core.broker, d.core.mover = n.agent, n.broker, n.mover
	if n.kubelet != nil {
		d.core.kubelet = n.kubelet
	}
	d.core.discover = func() ([]nic.Netdev, error) { return slices.Clone(n.netdevs), nil }
	d.core.nodeAddrs = func(addrs []netip.Addr) (map[netip.Addr]string, error) {
		n.asked.add("%v", addrs)
		if n.addrsErr != nil {
			return nil, n.addrsErr
		}
		held := map[netip.Addr]string{}
		for _, a := range addrs {
			if dev, ok := n.addrs[a]; ok {
				held[a] = dev
			}
		}
		return held, nil
	}
	d.node = noReporter{}
	d.metrics = newMetrics(d)
	d.dra = newDRAFace(d)
	var err error
	if d.core.watcher, err = config.NewWatcher(path, opts.Logger); err != nil {
		t.Fatal(err)
	}
	if d.core.ledger, err = ledger.Open(ledger.Options{Dir: filepath.Join(opts.StateDir, "allocations")}); err != nil {
		t.Fatal(err)
	}
	d.core.rec = d.core.newReconciler()
	for _, dir := range []string{opts.AllocDir, filepath.Join(opts.AllocDir, dpdkLinkDir), filepath.Join(opts.AllocDir, broker.StagingDir)} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	// With kubelet, the device plugins run (and wait for a kubelet that
	// never comes) in the group, as in Run.
	g, gctx := errgroup.WithContext(ctx)
	d.plugins.Use(gctx, g)
	g.Go(func() error { return d.core.rec.run(gctx) })
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := g.Wait(); err != nil {
				t.Errorf("the daemon's parts: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return d, stop
}

// serveAPI serves d's local API on a socket in the node's directory, as
// Run does, until the test ends, and returns the socket's path.
func (n *fakeNode) serveAPI(d *Daemon) string {
	n.t.Helper()
	sock := filepath.Join(n.dir, "api.sock")
	ln, err := api.Listen(sock)
	if err != nil {
		n.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- api.Serve(ctx, ln, api.NewHandler(d.local, d.log), d.log) }()
	n.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			n.t.Errorf("the local API: %v", err)
		}
	})
	return sock
}

// reload has d's reconciler put yaml in force, as the config watcher does.
func (n *fakeNode) reload(d *Daemon, yaml string) {
	n.t.Helper()
	c, err := config.Parse([]byte(yaml))
	if err != nil {
		n.t.Fatal(err)
	}
	if err := d.core.applier(context.Background())(c); err != nil {
		n.t.Fatal(err)
	}
}

// capacity is each pool's device count in d's ledger, "pool=n" sorted.
func capacity(d *Daemon) []string {
	var out []string
	for _, p := range d.core.ledger.Pools() {
		out = append(out, fmt.Sprintf("%s=%d", p.Name, len(p.Devices)))
	}
	sort.Strings(out)
	return out
}
