package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/config"
	"github.com/xdpq/xdpq/pkg/ledger"
	"github.com/xdpq/xdpq/pkg/nic"
)

// reconciler puts the config in force on the node's netdevs: the pools
// and their devices in the ledger, and what the node agent manages and
// how. It is one goroutine (run): a config change, a reload, the resync
// ticker and the CNI verbs (a netdev moving into a pod and back) ask it
// through reqs and wait for its answer; nobody else calls the node
// agent's Set or Unmanage, so two of them can never interleave. What it
// found and put in force is read by the rest of the daemon through its
// accessors, under its own mutex, never across a call out.
type reconciler struct {
	log      *slog.Logger
	nodeName string
	labels   map[string]string
	resync   time.Duration
	discover func() ([]nic.Netdev, error)
	agent    netdevAgent // its Set and Unmanage are the reconciler's alone
	ledger   *ledger.Ledger
	// current is the watcher's config, for a reconcile before any apply.
	current func() *config.Config
	// The rest of the daemon: who serves a pool (and the problem when its
	// config and its allocations disagree), the netdevs in pods brought
	// to their pools' settings (and their problems), and what follows
	// each reconcile (fresh: the netdevs managed afresh).
	servedBy func(ledger.Pool) (string, string)
	podsSync func() []string
	after    func(fresh []string)
	reqs     chan reconcileRequest
	// fdNeed and fdProblem are the run goroutine's own: the descriptors
	// the pools needed at the last fitFDLimit, and what it found.
	fdNeed    uint64
	fdProblem string

	mu sync.Mutex // guards the fields below; never held across a call out
	// found are the netdevs of the last discovery, those in pods included.
	found    map[string]nic.Netdev
	cfg      *config.Config // the config put in force last
	problems []string       // why the config in force is not fully in force
	managed  map[string]agent.Policy
}

func (c *core) newReconciler() *reconciler {
	return &reconciler{log: c.log, nodeName: c.opts.NodeName, labels: c.opts.NodeLabels, resync: c.opts.Resync,
		discover: c.discover, agent: c.agent, ledger: c.ledger, current: c.watcher.Current,
		servedBy: c.servedBy, podsSync: c.reconcilePods, after: c.afterReconcile,
		reqs: make(chan reconcileRequest), found: map[string]nic.Netdev{}, managed: map[string]agent.Policy{}}
}

// netdev is what the last discovery found of a netdev.
func (r *reconciler) netdev(name string) (nic.Netdev, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.found[name]
	return n, ok
}

// netdevs is every netdev the last discovery found.
func (r *reconciler) netdevs() map[string]nic.Netdev {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.found)
}

// isManaged says whether the node agent manages netdev.
func (r *reconciler) isManaged(netdev string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.managed[netdev]
	return ok
}

// managedNetdevs are the netdevs the node agent manages, in order.
func (r *reconciler) managedNetdevs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.managed))
}

// inForce are the problems of the config in force.
func (r *reconciler) inForce() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.problems)
}

type reconcileRequest struct {
	cfg      *config.Config // a new config; nil: the one in force
	discover bool           // list the netdevs again
	done     chan error
}

// applier is the config watcher's apply: the reconciler puts cfg in force.
func (c *core) applier(ctx context.Context) func(*config.Config) error {
	return func(cfg *config.Config) error {
		if c.isUninstalling() {
			c.log.Info("config not applied: xdpq is being uninstalled")
			return nil
		}
		if err := c.rec.request(ctx, reconcileRequest{cfg: cfg, discover: true}); err != nil {
			return err
		}
		hadBroken := len(c.ledger.Broken()) > 0
		back := c.ledger.Rescan()
		for _, a := range back {
			c.log.Info("allocation record readable again", "allocation", a.ID)
			c.recoverRescanned(ctx, a)
		}
		if hadBroken {
			// With every record read again, the flows no record owns go
			// (those of a record the operator removed); with one still
			// unreadable, the readable ones are taken back.
			c.syncSteering(true)
		}
		c.publish(change{kind: configApplied})
		return nil
	}
}

// request has the reconciler run req and waits for the outcome.
func (r *reconciler) request(ctx context.Context, req reconcileRequest) error {
	req.done = make(chan error, 1)
	select {
	case r.reqs <- req:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// syncNetdevs brings the node agent's netdevs in line with the ledger now
// (a netdev moved into a pod or back).
func (c *core) syncNetdevs(ctx context.Context) error {
	return c.rec.request(ctx, reconcileRequest{})
}

// run is the reconciler's goroutine, until ctx ends.
func (r *reconciler) run(ctx context.Context) error {
	t := time.NewTicker(r.resync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case req := <-r.reqs:
			req.done <- r.reconcile(req)
		case <-t.C:
			if err := r.reconcile(reconcileRequest{discover: true}); err != nil {
				r.log.Warn("resync", "err", err)
			}
		}
	}
}

// reconcile puts a config in force on the netdevs found: the pools and
// their devices in the ledger, the node agent's netdevs and policies, the
// live allocations' limits and the device plugins. Netdev-level problems
// (a queue range the netdev lacks, pools that disagree on a netdev) do
// not refuse the config: they are reported with the pools they concern.
func (r *reconciler) reconcile(req reconcileRequest) error {
	// The config in force is the last one this reconciler applied: the
	// watcher's Current changes only after apply returns, and a
	// reconcile in between must not bring the old one back.
	r.mu.Lock()
	cfg := req.cfg
	if cfg == nil {
		cfg = r.cfg
	}
	found := maps.Clone(r.found)
	r.mu.Unlock()
	if cfg == nil {
		cfg = r.current()
	}
	if req.discover || len(found) == 0 {
		list, err := r.discover()
		if err != nil {
			return err
		}
		found = map[string]nic.Netdev{}
		for _, n := range list {
			found[n.Name] = n
		}
	}
	// A netdev in a pod is not on the node, but still its pool's.
	inPods := map[string]bool{}
	for _, att := range r.ledger.Attachments() {
		if att.Mode != api.ModeNetdev {
			continue
		}
		inPods[att.Netdev] = true
		if _, ok := found[att.Netdev]; !ok {
			if m, err := decodeMoved(att.Moved); err == nil {
				found[att.Netdev] = m.Device
			}
		}
	}
	netdevs := slices.SortedFunc(maps.Values(found), func(a, b nic.Netdev) int { return strings.Compare(a.Name, b.Name) })
	pools := cfg.ForNode(r.nodeName, r.labels)
	res, resolveProblems := config.Resolve(pools, netdevs)
	lpools, desired, problems := plan(cfg, pools, res, resolveProblems)
	r.mu.Lock()
	managed := maps.Clone(r.managed)
	r.mu.Unlock()
	// Queues allocations hold stay managed and kept off RSS whatever the
	// config says now (a shrink, a pool removed, a range the netdev lacks,
	// a netdev missing for a moment): their pods still use them. A netdev
	// the config no longer names keeps the policy it had.
	held := map[string][]uint32{}
	for _, a := range r.ledger.Allocations() {
		held[a.Netdev] = append(held[a.Netdev], a.Queues...)
	}
	for name, qs := range held {
		pol, ok := desired[name]
		if !ok {
			if pol, ok = managed[name]; !ok {
				continue // never managed by this daemon: nothing to keep
			}
		}
		if pol.Steering != agent.SteerSoftware {
			pol.Reserved = slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(pol.Reserved), qs...))))
		}
		desired[name] = pol
	}
	for name := range inPods {
		delete(desired, name)
	}
	changes := r.ledger.SetPools(lpools)
	if p := r.fitFDLimit(lpools); p != "" {
		problems = append(problems, p)
	}
	for _, p := range r.ledger.Metas() {
		if _, why := r.servedBy(p); why != "" {
			problems = append(problems, why)
		}
	}
	for _, p := range changes.Lingering {
		r.log.Info("pool removed from the config; it goes once its allocations are freed", "pool", p)
	}
	// Each reconcile finds them again (a resync, a netdev back from a
	// pod): a problem is logged when it is new, and in status always.
	r.mu.Lock()
	said := r.problems
	r.mu.Unlock()
	for _, p := range problems {
		if !slices.Contains(said, p) {
			r.log.Error("config", "problem", p)
		}
	}

	// The node agent: what it manages and how.
	var fresh []string
	for _, name := range slices.Sorted(maps.Keys(desired)) {
		pol := desired[name]
		if old, ok := managed[name]; ok && policyEqual(old, pol) {
			continue
		}
		if err := r.agent.Set(name, pol); err != nil {
			problems = append(problems, err.Error()) // it names the netdev
			if _, was := managed[name]; !was {
				if !slices.Contains(said, err.Error()) {
					r.log.Error("netdev not managed", "netdev", name, "err", err)
				}
				continue // tried again at the next reconcile
			}
			// Managed, with the fields it could apply (status says which
			// not); tried again when the config changes.
			r.log.Error("netdev policy not wholly in force", "netdev", name, "err", err)
		}
		if _, was := managed[name]; !was {
			fresh = append(fresh, name)
		}
		managed[name] = pol
	}
	for _, name := range slices.Sorted(maps.Keys(managed)) {
		if _, ok := desired[name]; ok {
			continue
		}
		if err := r.agent.Unmanage(name); err != nil {
			r.log.Warn("unmanage", "netdev", name, "err", err)
			problems = append(problems, err.Error()) // it names the netdev
		}
		delete(managed, name)
	}
	problems = append(problems, r.podsSync()...)
	r.mu.Lock()
	r.found, r.problems, r.managed = found, problems, managed
	r.cfg = cfg
	r.mu.Unlock()
	r.after(fresh)
	return nil
}

// afterReconcile is what follows each reconcile in the rest of the
// daemon. A netdev managed afresh while the daemon runs (back from a
// pod, a first Set that failed before, a netdev that came back) takes its
// attachments' flows back: those still installed, and again those that
// are not; on every managed netdev, flows gone from the kernel are put
// back. The live allocations' limits and the device plugins follow the
// pools in force.
func (c *core) afterReconcile(fresh []string) {
	if len(fresh) > 0 && c.started() {
		c.syncSteering(true, fresh...)
	}
	c.repairSteering(fresh)
	c.updateLimits()
	c.publish(change{kind: poolsChanged})
}

// repairSteering puts back, on each managed netdev, the attachments'
// flows that are gone from the kernel (deleted behind the daemon's back:
// its pods would receive nothing, and its status would not say).
// RepairSteering logs what it puts back; each reconcile (a resync, a
// SIGHUP, a change) checks, but for the netdevs in done, which
// syncSteering has just settled.
func (c *core) repairSteering(done []string) {
	if !c.started() {
		return // the start's syncSteering settles the flows first
	}
	for _, n := range c.rec.managedNetdevs() {
		if slices.Contains(done, n) {
			continue
		}
		if _, err := c.agent.RepairSteering(n); err != nil {
			c.log.Error("flows gone from the kernel could not all be put back", "netdev", n, "err", err)
		}
	}
}

// plan turns the pools in force and what they resolved to on this node
// into the ledger's pools and the node agent's policy per netdev.
func plan(cfg *config.Config, pools []config.Pool, res []config.Reservation, resolveProblems []error) ([]ledger.Pool, map[string]agent.Policy, []string) {
	var problems []string
	perPool := map[string][]string{}
	for _, e := range resolveProblems {
		msg := e.Error()
		problems = append(problems, msg)
		if name, rest, ok := strings.Cut(strings.TrimPrefix(msg, "pool "), ": "); ok {
			perPool[name] = append(perPool[name], rest)
		}
	}
	var out []ledger.Pool
	for _, pc := range pools {
		lp := ledger.Pool{Name: pc.Name, Resource: cfg.Resource(pc), Config: pc, Problems: perPool[pc.Name]}
		for _, r := range res {
			if r.Pool != pc.Name {
				continue
			}
			if pc.Mode == api.ModeNetdev {
				lp.Devices = append(lp.Devices, ledger.Device{ID: r.Netdev.Name, Netdev: r.Netdev.Name, Queues: r.Queues,
					NUMA: r.Netdev.NUMANode, PCI: r.Netdev.PCI})
				continue
			}
			for _, q := range r.Queues {
				lp.Devices = append(lp.Devices, ledger.Device{ID: ledger.DeviceID(r.Netdev.Name, q), Netdev: r.Netdev.Name,
					Queues: []uint32{q}, NUMA: r.Netdev.NUMANode, PCI: r.Netdev.PCI})
			}
		}
		if len(lp.Devices) == 0 && len(lp.Problems) == 0 {
			lp.Problems = []string{"no netdev on this node matches its devices selector"}
		}
		out = append(out, lp)
	}

	// One policy per netdev: the first pool's that uses it, with the
	// queues of every pool on it kept off RSS.
	byNetdev := map[string][]config.Reservation{}
	var order []string
	for _, r := range res {
		if byNetdev[r.Netdev.Name] == nil {
			order = append(order, r.Netdev.Name)
		}
		byNetdev[r.Netdev.Name] = append(byNetdev[r.Netdev.Name], r)
	}
	desired := map[string]agent.Policy{}
	for _, name := range order {
		rs := byNetdev[name]
		first := poolNamed(pools, rs[0].Pool)
		var reserved []uint32
		for _, r := range rs {
			reserved = append(reserved, r.Queues...)
			if other := poolNamed(pools, r.Pool); r.Pool != first.Name {
				if diff := netdevSettingsDiffer(first, other); diff != "" {
					msg := fmt.Sprintf("pools %s and %s share netdev %s and disagree on %s; %s's applies", first.Name, other.Name, name, diff, first.Name)
					problems = append(problems, msg)
				}
			}
		}
		sort.Slice(reserved, func(i, j int) bool { return reserved[i] < reserved[j] })
		if first.Mode == api.ModeNetdev {
			reserved = nil // the netdev is one pod's; RSS is its business
		}
		desired[name] = policyFor(first, reserved)
	}
	return out, desired, problems
}

func poolNamed(pools []config.Pool, name string) config.Pool {
	for _, p := range pools {
		if p.Name == name {
			return p
		}
	}
	return config.Pool{}
}

// netdevSettingsDiffer names the netdev-wide settings two pools on one
// netdev disagree on.
func netdevSettingsDiffer(a, b config.Pool) string {
	var d []string
	if a.Steering != b.Steering {
		d = append(d, "steering")
	}
	if a.Attach != b.Attach {
		d = append(d, "attach")
	}
	if a.Exclusive != b.Exclusive {
		d = append(d, "exclusive")
	}
	if a.Linger != b.Linger {
		d = append(d, "linger")
	}
	if (a.BusyPoll == nil) != (b.BusyPoll == nil) {
		d = append(d, "busyPoll")
	}
	return strings.Join(d, ", ")
}

// servedBy is how pool p is served now: as its config (or the daemon's
// default) says, unless allocations of the other way still hold its
// devices: then the other way, until they end (a pool is served one way
// at a time, so that the scheduler's view and kubelet's never both hand
// out a device).
func (c *core) servedBy(p ledger.Pool) (string, string) {
	want := p.Config.ServedBy
	if want == "" {
		want = c.opts.ServedBy
	}
	if want == "" || c.opts.DRA == nil {
		want = ServedByDevicePlugin
	}
	other := ServedByDRA
	if want == ServedByDRA {
		other = ServedByDevicePlugin
	}
	claims, others := c.ledger.ClaimsHeld(p.Name)
	n := others
	if other == ServedByDRA {
		n = claims
	}
	if n > 0 {
		return other, fmt.Sprintf("pool %s: served by %s until its %d allocations of %s end (its config says %s)", p.Name, other, n, other, want)
	}
	return want, ""
}
