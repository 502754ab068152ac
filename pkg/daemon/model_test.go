package daemon

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/syncbuf"

	"github.com/xdpq/xdpq/internal/testing/testbin"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/broker"
)

// The model-based test drives a standalone daemon, run as its own
// process, through random sequences of what users and operators do:
// alloc, free, CNI ADD and DEL, config reloads that grow, shrink, add and
// remove pools, restarts, SIGKILL between two calls and SIGKILL while a
// call is in flight. After every step the daemon's status must match a
// simple model of who holds what; after each sequence, once everything is
// freed and the pools removed, nothing may be left: allocations,
// records, allocation directories, flows, pins, file descriptors.
//
// XDPQ_MODEL_SEQS sets the number of sequences (200 by default, the
// least CI runs); XDPQ_MODEL_SEED replays one (or, with
// XDPQ_MODEL_SEQS, starts there).

// modelConfigs are the configs a reload picks from: pool -> queues of xa.
var modelConfigs = []map[string][]uint32{
	{"upf": {0, 1}, "dns": {2, 3}},
	{"upf": {0, 1, 2}, "dns": {3}},
	{"upf": {0, 1}},
	{"upf": {0}, "dns": {2}, "web": {3}},
	{"web": {0, 1, 2, 3}},
}

func modelConfigYAML(pools map[string][]uint32) string {
	var b strings.Builder
	b.WriteString("pools: [")
	for i, name := range sortedKeys((pools)) {
		if i > 0 {
			b.WriteString(", ")
		}
		var qs []string
		for _, q := range pools[name] {
			qs = append(qs, strconv.Itoa(int(q)))
		}
		fmt.Fprintf(&b, "{name: %s, steering: software, devices: {netdevs: ['xa#%s']}}", name, strings.Join(qs, ","))
	}
	b.WriteString("]\n")
	return b.String()
}

// sortedKeys are m's keys in order.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// modelOp is a step: run does it and checks its answer against the
// model; apply updates the model after it.
type modelOp struct {
	name  string
	run   func() error
	apply func()
}

type modelAlloc struct {
	pool   string
	queues []uint32
}

type model struct {
	pools  map[string][]uint32
	allocs map[string]modelAlloc
	atts   map[string]string // key -> allocation
}

// free is how many queues of pool no allocation holds.
func (m *model) free(pool string) int {
	n := 0
	for _, q := range m.pools[pool] {
		held := false
		for _, a := range m.allocs {
			held = held || slices.Contains(a.queues, q)
		}
		if !held {
			n++
		}
	}
	return n
}

// spawner starts the daemon processes from one OS thread that lives as
// long as the test binary, with SIGKILL as their parent-death signal: a
// test binary killed by its timeout takes its daemons with it, and since
// the signal follows the thread that forked, the thread must be one that
// no goroutine's exit ends (a goroutine that locked its thread for a
// namespace and returned would).
var spawner struct {
	once sync.Once
	reqs chan spawnRequest
}

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

func spawn(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread outlives every daemon
			for r := range spawner.reqs {
				r.done <- r.cmd.Start()
			}
		}()
	})
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r := spawnRequest{cmd, make(chan error, 1)}
	spawner.reqs <- r
	return <-r.done
}

// drop forgets an allocation and its attachments.
func (m *model) drop(id string) {
	delete(m.allocs, id)
	for k, a := range m.atts {
		if a == id {
			delete(m.atts, k)
		}
	}
}

// daemonProc is the daemon as its own process.
type daemonProc struct {
	t    *testing.T
	bin  string
	args []string
	cmd  *exec.Cmd
	done chan error
	out  *syncbuf.Buffer
	api  *api.Client
}

func (p *daemonProc) start() {
	p.t.Helper()
	p.cmd = exec.Command(p.bin, p.args...)
	p.out = &syncbuf.Buffer{}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := spawn(p.cmd); err != nil {
		p.t.Fatal(err)
	}
	p.done = make(chan error, 1)
	go func() { p.done <- p.cmd.Wait() }()
	// An external process: its API answering is the sign it is ready.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := p.api.Version(); err == nil {
			return
		}
		select {
		case err := <-p.done:
			p.t.Fatalf("the daemon exited: %v\n%s", err, p.out)
		default:
		}
		if time.Now().After(deadline) {
			p.stop(syscall.SIGQUIT)
			p.t.Fatalf("the daemon did not come up:\n%s", p.out)
		}
	}
}

// stop ends the daemon with sig and waits for it.
func (p *daemonProc) stop(sig syscall.Signal) {
	p.t.Helper()
	p.cmd.Process.Signal(sig)
	select {
	case err := <-p.done:
		if sig == syscall.SIGTERM && err != nil {
			p.t.Fatalf("the daemon on SIGTERM: %v\n%s", err, p.out)
		}
	case <-time.After(20 * time.Second):
		p.cmd.Process.Signal(syscall.SIGQUIT)
		<-p.done
		p.t.Fatalf("the daemon did not stop on %v:\n%s", sig, p.out)
	}
}

// fds lists what the daemon's descriptors are, the fewest of a few looks:
// a descriptor in use for a moment (a netlink request, a client's
// connection closing) is no leak.
func (p *daemonProc) fds() []string {
	var least []string
	for i := range 5 {
		if fds := p.fdsNow(); i == 0 || len(fds) < len(least) {
			least = fds
		}
		time.Sleep(5 * time.Millisecond) // sampling another process
	}
	return least
}

func (p *daemonProc) fdsNow() []string {
	dir := fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid)
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		target, _ := os.Readlink(filepath.Join(dir, e.Name()))
		out = append(out, target)
	}
	slices.Sort(out)
	return out
}

func TestModel(t *testing.T) {
	p := testnet.NewPair(t, 4)
	bin := t.TempDir()
	testbin.Build(t, filepath.Join(bin, "deviceplugin"), "github.com/xdpq/xdpq/cmd/deviceplugin")
	seqs, first := 200, uint64(1)
	if s, err := strconv.ParseUint(os.Getenv("XDPQ_MODEL_SEED"), 10, 64); err == nil {
		first, seqs = s, 1
	}
	if s, err := strconv.Atoi(os.Getenv("XDPQ_MODEL_SEQS")); err == nil {
		seqs = s
	}
	pins := testPins(t)
	// The descriptors of a daemon freshly started on an empty config:
	// what one must hold after a sequence that ends there.
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	os.WriteFile(cfg, []byte(modelConfigYAML(nil)), 0o644)
	sock := filepath.Join(dir, "api.sock")
	fresh := &daemonProc{t: t, bin: filepath.Join(bin, "deviceplugin"), api: api.NewClient(sock), args: []string{"--standalone",
		"--config", cfg, "--netns", p.NSPath(), "--pin-dir", filepath.Join(pins, "fresh"), "--state-dir", filepath.Join(dir, "state"),
		"--alloc-dir", filepath.Join(dir, "alloc"), "--api-socket", sock, "--metrics-addr", ""}}
	fresh.start()
	baseFDs := fresh.fds()
	fresh.stop(syscall.SIGTERM)
	for seed := first; seed < first+uint64(seqs); seed++ {
		if !t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			modelSequence(t, p, filepath.Join(bin, "deviceplugin"), pins, seed, baseFDs)
		}) {
			t.Fatalf("replay with XDPQ_MODEL_SEED=%d", seed)
		}
	}
}

func modelSequence(t *testing.T, p *testnet.Pair, bin, pins string, seed uint64, baseFDs []string) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	m := &model{pools: modelConfigs[0], allocs: map[string]modelAlloc{}, atts: map[string]string{}}
	writeConfig := func(pools map[string][]uint32) {
		os.WriteFile(cfg+".tmp", []byte(modelConfigYAML(pools)), 0o644)
		os.Rename(cfg+".tmp", cfg)
	}
	writeConfig(m.pools)
	sock := filepath.Join(dir, "api.sock")
	pinDir := filepath.Join(pins, fmt.Sprintf("seq%d", seed))
	allocDir := filepath.Join(dir, "alloc")
	stateDir := filepath.Join(dir, "state")
	d := &daemonProc{t: t, bin: bin, api: api.NewClient(sock), args: []string{"--standalone", "--config", cfg, "--netns", p.NSPath(),
		"--pin-dir", pinDir, "--state-dir", stateDir, "--alloc-dir", allocDir, "--api-socket", sock, "--metrics-addr", ""}}
	d.start()
	defer func() {
		if d.cmd.ProcessState == nil {
			d.stop(syscall.SIGKILL)
		}
	}()
	var trace []string
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%s\nsteps:\n  %s\ndaemon log (tail):\n%s", fmt.Sprintf(format, args...), strings.Join(trace, "\n  "), tail(d.out.String(), 40))
	}
	flowN := 0
	randomAlloc := func() string {
		ids := sortedKeys((m.allocs))
		if len(ids) == 0 || rng.IntN(10) == 0 {
			return "upf-0123456789ab" // none such
		}
		return ids[rng.IntN(len(ids))]
	}

	// check compares the daemon's status with the model.
	check := func() {
		t.Helper()
		s, err := d.api.Status()
		if err != nil {
			fail("status: %v", err)
		}
		l, err := d.api.Allocations("")
		if err != nil {
			fail("allocations: %v", err)
		}
		got := map[string]modelAlloc{}
		byPool := map[string]int{}
		for _, a := range l.Allocations {
			got[a.ID] = modelAlloc{a.Pool, a.Queues}
		}
		for _, a := range m.allocs {
			byPool[a.pool]++
		}
		if fmt.Sprint(got) != fmt.Sprint(m.allocs) {
			fail("allocations %v, model %v", got, m.allocs)
		}
		if s.Allocations != len(m.allocs) || s.Attachments != len(m.atts) || len(l.Attachments) != len(m.atts) {
			fail("status counts %d allocations and %d attachments, the list has %d attachments; model %d and %d",
				s.Allocations, s.Attachments, len(l.Attachments), len(m.allocs), len(m.atts))
		}
		for _, ps := range s.Pools {
			if ps.Allocations != byPool[ps.Name] {
				fail("pool %s: %d allocations; model %d", ps.Name, ps.Allocations, byPool[ps.Name])
			}
			qs, inConfig := m.pools[ps.Name]
			if !inConfig {
				if ps.Queues != 0 || ps.Free != 0 {
					fail("pool %s gone from the config: %d queues, %d free", ps.Name, ps.Queues, ps.Free)
				}
				continue
			}
			if ps.Queues != len(qs) || ps.Free != m.free(ps.Name) || ps.Free < 0 {
				fail("pool %s: %d queues, %d free; model %d, %d", ps.Name, ps.Queues, ps.Free, len(qs), m.free(ps.Name))
			}
		}
		flows := 0
		for _, n := range s.Netdevs {
			flows += n.Flows
		}
		if flows != len(m.atts) {
			fail("%d flows, model %d attachments of one flow each", flows, len(m.atts))
		}
		for key := range m.atts {
			cid, ifn, _ := strings.Cut(key, "/")
			if _, err := d.api.CNICheck(cid, ifn); err != nil {
				fail("check %s: %v", key, err)
			}
		}
		if len(s.StateErrors) > 0 {
			fail("state errors %v", s.StateErrors)
		}
	}

	// do runs one operation and updates the model; with uncertain (a kill
	// in flight) it accepts either outcome and learns which from status.
	steps := 8 + rng.IntN(12)
	for range steps {
		var o modelOp
		switch k := rng.IntN(100); {
		case k < 30:
			pool := sortedKeys((m.pools))[rng.IntN(len(m.pools))]
			n := 1 + rng.IntN(2)
			var got *api.Allocation
			o = modelOp{name: fmt.Sprintf("alloc %s %d", pool, n), run: func() (err error) {
				got, err = d.api.Alloc(pool, n, uint32(rng.IntN(2))*65534)
				if err == nil && m.free(pool) < n {
					return fmt.Errorf("alloc of %d from %s succeeded with %d free", n, pool, m.free(pool))
				}
				if err != nil && m.free(pool) >= n {
					return fmt.Errorf("alloc of %d from %s refused with %d free: %w", n, pool, m.free(pool), err)
				}
				return nil
			}, apply: func() {
				if got != nil {
					m.allocs[got.ID] = modelAlloc{pool, got.Queues}
				}
			}}
		case k < 45:
			id := randomAlloc()
			o = modelOp{name: "free " + id, run: func() error {
				err := d.api.Free(id)
				_, exists := m.allocs[id]
				switch {
				case exists && err != nil:
					return err
				case !exists && !errors.Is(err, api.ErrNotFound):
					return fmt.Errorf("free of an unknown allocation: %v", err)
				}
				return nil
			}, apply: func() { m.drop(id) }}
		case k < 65:
			id := randomAlloc()
			flowN++
			key := fmt.Sprintf("c%d/net1", flowN)
			flow := api.CNIFlow{Protocol: "udp", Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 7, byte(flowN >> 8), byte(flowN)}), 32), DstPort: 53}
			ok := false
			o = modelOp{name: "cni add " + key + " to " + id, run: func() error {
				_, err := d.api.CNIAdd(api.CNIAddRequest{ContainerID: fmt.Sprintf("c%d", flowN), IfName: "net1", Allocation: id, Flows: []api.CNIFlow{flow}, Addresses: []netip.Addr{flow.Dst.Addr()}})
				_, exists := m.allocs[id]
				switch {
				case exists && err != nil:
					return err
				case !exists && !errors.Is(err, api.ErrNotFound):
					return fmt.Errorf("add to an unknown allocation: %v", err)
				}
				ok = exists
				return nil
			}, apply: func() {
				if ok {
					m.atts[key] = id
				}
			}}
		case k < 78:
			keys := sortedKeys((m.atts))
			key := "nobody/net1"
			if len(keys) > 0 && rng.IntN(8) != 0 {
				key = keys[rng.IntN(len(keys))]
			}
			cid, ifn, _ := strings.Cut(key, "/")
			o = modelOp{name: "cni del " + key, run: func() error { return d.api.CNIDel(cid, ifn) }, apply: func() { delete(m.atts, key) }}
		case k < 88:
			next := modelConfigs[rng.IntN(len(modelConfigs))]
			o = modelOp{name: "reload " + strings.TrimSpace(modelConfigYAML(next)), run: func() error {
				writeConfig(next)
				d.cmd.Process.Signal(syscall.SIGHUP)
				// The daemon says a reload is done by the config in force.
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
					s, err := d.api.Status()
					if err == nil && poolsMatch(s, next) {
						return nil
					}
					if time.Now().After(deadline) {
						return fmt.Errorf("reload not in force: %+v %v", s, err)
					}
				}
			}, apply: func() { m.pools = next }}
		case k < 94:
			o = modelOp{name: "restart", run: func() error { d.stop(syscall.SIGTERM); d.start(); return nil }, apply: func() {}}
		case k < 95:
			o = modelOp{name: "kill -9", run: func() error { d.stop(syscall.SIGKILL); d.start(); return nil }, apply: func() {}}
		default:
			o = killInFlight(rng, d, m, &flowN)
		}
		trace = append(trace, o.name)
		if err := o.run(); err != nil {
			fail("%s: %v", o.name, err)
		}
		o.apply()
		check()
	}

	// The end: everything freed, the pools removed, nothing left.
	for id := range m.allocs {
		if err := d.api.Free(id); err != nil {
			fail("free %s: %v", id, err)
		}
	}
	m.allocs, m.atts = map[string]modelAlloc{}, map[string]string{}
	check()
	writeConfig(map[string][]uint32{})
	d.cmd.Process.Signal(syscall.SIGHUP)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		s, err := d.api.Status()
		if err == nil && len(s.Pools) == 0 && len(s.Netdevs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			fail("the pools are not gone: %+v %v", s, err)
		}
	}
	// As many descriptors as a daemon freshly started on an empty config:
	// looked at until the ones in use for a moment are closed.
	var fds []string
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(10 * time.Millisecond) { // another process's descriptors
		if fds = d.fdsNow(); len(fds) <= len(baseFDs) {
			break
		}
		if time.Now().After(deadline) {
			fail("the daemon holds %d descriptors after the sequence, %d fresh:\n%v\n%v", len(fds), len(baseFDs), fds, baseFDs)
		}
	}
	d.stop(syscall.SIGTERM)
	for _, dir := range []string{allocDir, filepath.Join(stateDir, "allocations"), pinDir} {
		ents, _ := os.ReadDir(dir)
		var names []string
		for _, e := range ents {
			// The broker's staging directory and DPDK's links are the
			// daemon's, not an allocation's; they must be empty.
			if dot := filepath.Join(dir, e.Name()); dir == allocDir && (e.Name() == broker.StagingDir || e.Name() == dpdkLinkDir) {
				if in, _ := os.ReadDir(dot); len(in) == 0 {
					continue
				}
			}
			names = append(names, e.Name())
		}
		if len(names) > 0 {
			fail("left in %s: %v", dir, names)
		}
	}
}

// killInFlight is SIGKILL while a call is in flight: an alloc, free, CNI
// ADD or DEL runs, the daemon is killed a moment later (at a random point
// of the call: before, during or after its records are written), and
// started again. Either outcome of the call is right; the model learns
// which from the restarted daemon, and check then requires that
// everything else agrees with it (a half-made allocation or attachment
// fails it).
func killInFlight(rng *rand.Rand, d *daemonProc, m *model, flowN *int) modelOp {
	delay := time.Duration(rng.IntN(3000)) * time.Microsecond
	var call func()
	var learn func() error
	var what string
	switch rng.IntN(4) {
	case 0:
		pool := sortedKeys(m.pools)[rng.IntN(len(m.pools))]
		n := 1 + rng.IntN(2)
		what = fmt.Sprintf("alloc %s %d", pool, n)
		call = func() { d.api.Alloc(pool, n, 0) }
		learn = func() error {
			l, err := d.api.Allocations("")
			if err != nil {
				return err
			}
			for _, a := range l.Allocations {
				if _, known := m.allocs[a.ID]; known {
					continue
				}
				if a.Pool != pool || len(a.Queues) != n {
					return fmt.Errorf("after the kill: allocation %+v, from alloc %s %d", a, pool, n)
				}
				m.allocs[a.ID] = modelAlloc{a.Pool, a.Queues}
			}
			return nil
		}
	case 1:
		id := randomID(rng, m)
		what = "free " + id
		call = func() { d.api.Free(id) }
		learn = func() error {
			l, err := d.api.Allocations("")
			if err != nil {
				return err
			}
			if !slices.ContainsFunc(l.Allocations, func(a api.Allocation) bool { return a.ID == id }) {
				m.drop(id)
			}
			return nil
		}
	case 2:
		id := randomID(rng, m)
		*flowN++
		cid := fmt.Sprintf("c%d", *flowN)
		flow := api.CNIFlow{Protocol: "udp", Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 7, byte(*flowN >> 8), byte(*flowN)}), 32), DstPort: 53}
		what = "cni add " + cid + "/net1 to " + id
		call = func() {
			d.api.CNIAdd(api.CNIAddRequest{ContainerID: cid, IfName: "net1", Allocation: id, Flows: []api.CNIFlow{flow}, Addresses: []netip.Addr{flow.Dst.Addr()}})
		}
		learn = func() error {
			_, err := d.api.CNICheck(cid, "net1")
			switch {
			case err == nil:
				m.atts[cid+"/net1"] = id
			case !errors.Is(err, api.ErrNotFound):
				return fmt.Errorf("after the kill: check %s: %w", cid, err)
			}
			return nil
		}
	default:
		keys := sortedKeys(m.atts)
		key := "nobody/net1"
		if len(keys) > 0 {
			key = keys[rng.IntN(len(keys))]
		}
		cid, ifn, _ := strings.Cut(key, "/")
		what = "cni del " + key
		call = func() { d.api.CNIDel(cid, ifn) }
		learn = func() error {
			_, err := d.api.CNICheck(cid, ifn)
			switch {
			case errors.Is(err, api.ErrNotFound):
				delete(m.atts, key)
			case err != nil:
				return fmt.Errorf("after the kill: check %s: %w", key, err)
			}
			return nil
		}
	}
	var learnErr error
	return modelOp{name: fmt.Sprintf("kill -9 %v into %s", delay, what), run: func() error {
		done := make(chan struct{})
		go func() { defer close(done); call() }()
		time.Sleep(delay) // where in the call the kill lands: the point of the step, not synchronisation
		d.stop(syscall.SIGKILL)
		<-done
		d.start()
		learnErr = learn()
		return learnErr
	}, apply: func() {}}
}

func randomID(rng *rand.Rand, m *model) string {
	ids := sortedKeys(m.allocs)
	if len(ids) == 0 {
		return "upf-0123456789ab"
	}
	return ids[rng.IntN(len(ids))]
}

// poolsMatch reports whether status shows exactly the config's pools.
func poolsMatch(s *api.Status, pools map[string][]uint32) bool {
	for name, qs := range pools {
		i := slices.IndexFunc(s.Pools, func(p api.PoolStatus) bool { return p.Name == name })
		if i < 0 || s.Pools[i].Queues != len(qs) {
			return false
		}
	}
	for _, p := range s.Pools {
		if _, ok := pools[p.Name]; !ok && p.Queues != 0 {
			return false
		}
	}
	return true
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
