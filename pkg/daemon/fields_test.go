package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/xdpq/xdpq/internal/testing/kubelettest"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/nic"
	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// The TestField tests hold the daemon to one rule: a config field with no
// effect is a bug. Each shows one pool field's effect on what the kernel,
// the broker's sockets or the daemon's status show, both when the daemon
// starts with the field and when a reload brings it in or changes it.

// fieldRig is a standalone daemon on a veth pair (xa, xb) whose config the
// test rewrites and reloads.
type fieldRig struct {
	t *testing.T
	p *testnet.Pair
	o Options
	d *Daemon
}

// startRig runs a standalone daemon on pair p with config.
func startRig(t *testing.T, p *testnet.Pair, config string) *fieldRig {
	t.Helper()
	o := standaloneOpts(t, p, t.TempDir(), testPins(t), config)
	d, _ := runDaemon(t, o)
	return &fieldRig{t: t, p: p, o: o, d: d}
}

// reload puts config in the file (renamed into place, as an operator's
// editor or a ConfigMap update does) and reloads, as SIGHUP does.
func (r *fieldRig) reload(config string) {
	r.t.Helper()
	tmp := r.o.ConfigPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(config), 0o644); err != nil {
		r.t.Fatal(err)
	}
	if err := os.Rename(tmp, r.o.ConfigPath); err != nil {
		r.t.Fatal(err)
	}
	if err := r.d.Reload(context.Background()); err != nil {
		r.t.Fatalf("reload: %v", err)
	}
}

func (r *fieldRig) status() *api.Status {
	r.t.Helper()
	s, err := r.d.core.Status(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	return s
}

// allocations lists every allocation, and checks that status counts
// what it lists (nothing runs meanwhile).
func (r *fieldRig) allocations() *api.AllocationList {
	r.t.Helper()
	l, err := r.d.core.Allocations(context.Background(), "")
	if err != nil {
		r.t.Fatal(err)
	}
	if s := r.status(); s.Allocations != len(l.Allocations) || s.Attachments != len(l.Attachments) {
		r.t.Errorf("status counts %d allocations and %d attachments; the list has %d and %d",
			s.Allocations, s.Attachments, len(l.Allocations), len(l.Attachments))
	}
	return l
}

// netdev is xa's status.
func (r *fieldRig) netdev() api.NetdevStatus {
	r.t.Helper()
	for _, n := range r.status().Netdevs {
		if n.Netdev == "xa" {
			return n
		}
	}
	r.t.Fatal("xa is not in the status")
	return api.NetdevStatus{}
}

// pool is the status of the named pool; ok is false when status has none.
func (r *fieldRig) pool(name string) (api.PoolStatus, bool) {
	for _, p := range r.status().Pools {
		if p.Name == name {
			return p, true
		}
	}
	return api.PoolStatus{}, false
}

// policy is the policy the node agent holds in force on xa.
func (r *fieldRig) policy() agent.Policy {
	r.t.Helper()
	for _, s := range r.d.core.agent.Status() {
		if s.Netdev == "xa" {
			return s.Policy
		}
	}
	r.t.Fatal("the agent does not manage xa")
	return agent.Policy{}
}

// waitNetdev polls xa's status until ok: the agent follows the kernel's
// link notifications on its own goroutine, and tells the test nothing.
func (r *fieldRig) waitNetdev(what string, ok func(api.NetdevStatus) bool) api.NetdevStatus {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := r.netdev()
		if ok(n) {
			return n
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("xa is not %s: %+v", what, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// alloc allocates count queues of pool for uid 0, the test's own.
func (r *fieldRig) alloc(pool string, count int) *api.Allocation {
	r.t.Helper()
	a, err := r.d.local.Alloc(context.Background(), api.AllocRequest{Pool: pool, Count: count, UID: 0})
	if err != nil {
		r.t.Fatalf("alloc %d of %s: %v", count, pool, err)
	}
	return a
}

// connect takes a lease on allocation a as its pod would (rings of 256
// entries unless o says otherwise).
func connect(a *api.Allocation, o client.Options) (*client.Lease, error) {
	if o.Ring == 0 {
		o.Ring = 256
	}
	o.Timeout = 5 * time.Second
	return client.Connect(a.Socket, o)
}

// demoPool is a config of one pool, demo, on queues of xa with software
// steering; extra are more fields of the pool ("attach: always").
func demoPool(queues string, extra ...string) string {
	fields := append([]string{"name: demo", "steering: software", "devices: {netdevs: ['xa#" + queues + "']}"}, extra...)
	return "pools: [{" + strings.Join(fields, ", ") + "}]\n"
}

// xdpEvent is a link notification of the watched netdev: when it came
// and the XDP program it reports (0: none).
type xdpEvent struct {
	at   time.Time
	prog uint32
}

// watchXDP follows the kernel's link notifications of netdev ifindex in
// the pair's namespace (RTM_NEWLINK carries IFLA_XDP) until the test ends.
func watchXDP(t *testing.T, p *testnet.Pair, ifindex int) <-chan xdpEvent {
	t.Helper()
	var fd int
	err := ns.WithNetNSPath(p.NSPath(), func(ns.NetNS) error {
		var err error
		if fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: unix.RTMGRP_LINK})
	})
	if err != nil {
		if fd > 0 {
			unix.Close(fd)
		}
		t.Fatalf("link notifications: %v", err)
	}
	// A receive timeout lets the reader see the end of the test.
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 50_000}); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	events := make(chan xdpEvent, 256)
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		defer unix.Close(fd)
		buf := make([]byte, 1<<16)
		for {
			select {
			case <-done:
				return
			default:
			}
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				continue // the timeout; a lost notification shows as a test timing out
			}
			at := time.Now()
			msgs, err := syscall.ParseNetlinkMessage(buf[:n])
			if err != nil {
				continue
			}
			for _, m := range msgs {
				if m.Header.Type != unix.RTM_NEWLINK {
					continue
				}
				h := unix.NlMsghdr(m.Header)
				l, err := netlink.LinkDeserialize(&h, m.Data)
				if err != nil || l.Attrs().Index != ifindex {
					continue
				}
				ev := xdpEvent{at: at}
				if x := l.Attrs().Xdp; x != nil && x.Attached {
					ev.prog = x.ProgId
				}
				select {
				case events <- ev:
				case <-done:
					return
				}
			}
		}
	}()
	t.Cleanup(func() { close(done); <-exited })
	return events
}

// waitDetach returns when the kernel reported the netdev without an XDP
// program.
func waitDetach(t *testing.T, events <-chan xdpEvent, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev := <-events:
			if ev.prog == 0 {
				return ev.at
			}
		case <-deadline:
			t.Fatalf("no detach within %v", timeout)
		}
	}
}

// attached is the program on xa's hook, nil for none.
func attached(t *testing.T, p *testnet.Pair) *xdp.Attached {
	t.Helper()
	att, err := xdp.Query(p.NSPath(), p.A.Index)
	if err != nil {
		t.Fatal(err)
	}
	return att
}

// operatorObj is an operator's own XDP program (XDP_PASS).
const operatorObj = "../agent/testdata/operator.o"

// foreign attaches (on) or removes the operator's program on xa with
// ip(8), forced over whatever is there, and returns ip's error.
func foreign(p *testnet.Pair, on bool) error {
	args := []string{"-n", filepath.Base(p.NSPath()), "-force", "link", "set", "dev", "xa", "xdpdrv"}
	if on {
		args = append(args, "obj", operatorObj, "sec", "xdp")
	} else {
		args = append(args, "off")
	}
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// TestFieldLinger: the time from the last socket closing to the
// program's detach (the kernel's link notification) is the pool's
// linger, whether the daemon started with it or a reload set it, and a
// reload shortens a linger that already runs. The lower bound shows the
// program stayed for the linger; the upper one (the linger and a second
// of slack for a loaded 2-core machine) that it did not stay for the
// default 5 s.
func TestFieldLinger(t *testing.T) {
	const slack = time.Second
	for _, tc := range []struct {
		name          string
		start, reload string // the pool's linger field; "" none
		want          time.Duration
	}{
		{"start 300ms", "linger: 300ms", "", 300 * time.Millisecond},
		{"start 2s", "linger: 2s", "", 2 * time.Second},
		{"reload default to 300ms", "", "linger: 300ms", 300 * time.Millisecond},
		{"reload 300ms to 2s", "linger: 300ms", "linger: 2s", 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testnet.NewPair(t, 4)
			cfg := func(linger string) string {
				if linger == "" {
					return demoPool("0-1")
				}
				return demoPool("0-1", linger)
			}
			r := startRig(t, p, cfg(tc.start))
			if tc.reload != "" {
				r.reload(cfg(tc.reload))
			}
			if got := r.policy().Linger; got != tc.want {
				t.Errorf("the agent's policy has linger %v, want %v", got, tc.want)
			}
			lease, err := connect(r.alloc("demo", 1), client.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if n := r.netdev(); n.State != string(agent.StateFilter) || len(n.Sockets) != 1 {
				lease.Close()
				t.Fatalf("with a lease: %+v", n)
			}
			events := watchXDP(t, p, p.A.Index)
			closed := time.Now()
			lease.Close()
			took := waitDetach(t, events, tc.want+10*time.Second).Sub(closed)
			t.Logf("linger %v: detached %v after the last socket closed", tc.want, took)
			if took < tc.want || took > tc.want+slack {
				t.Errorf("detached %v after the last socket closed, want the linger %v (to %v)", took, tc.want, tc.want+slack)
			}
			// Status follows once the agent's reconcile that detached
			// ends: the kernel's notification may come before.
			r.waitNetdev("None after the linger", func(n api.NetdevStatus) bool { return n.State == string(agent.StateNone) })
		})
	}
	t.Run("reload shortens a running linger", func(t *testing.T) {
		p := testnet.NewPair(t, 4)
		r := startRig(t, p, demoPool("0-1", "linger: 10m"))
		lease, err := connect(r.alloc("demo", 1), client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		events := watchXDP(t, p, p.A.Index)
		closed := time.Now()
		lease.Close()
		r.waitNetdev("without sockets, lingering", func(n api.NetdevStatus) bool {
			return len(n.Sockets) == 0 && n.State == string(agent.StateFilter)
		})
		reloaded := time.Now()
		r.reload(demoPool("0-1", "linger: 300ms"))
		at := waitDetach(t, events, 10*time.Second)
		t.Logf("detached %v after the last socket closed, %v after the reload", at.Sub(closed), at.Sub(reloaded))
		if took := at.Sub(closed); took < 300*time.Millisecond {
			t.Errorf("detached %v after the last socket closed, before the new linger of 300ms", took)
		}
		if took := at.Sub(reloaded); took > 300*time.Millisecond+slack {
			t.Errorf("detached %v after the reload that set a linger of 300ms", took)
		}
	})
}

// TestFieldBusyPoll: with busyPoll, the pod's sockets carry
// SO_PREFER_BUSY_POLL=1 and SO_BUSY_POLL=<timeoutMicros> (the budget
// cannot be read back: SO_BUSY_POLL_BUDGET has no getsockopt), the lease
// says the setting, and xa's napi_defer_hard_irqs and gro_flush_timeout
// (read from a sysfs of the pair's namespace) are the busy polling ones;
// a reload that removes busyPoll puts xa's own values back and the next
// lease's sockets have no busy polling; a reload that brings it in or
// changes its timeout reaches the next lease.
func TestFieldBusyPoll(t *testing.T) {
	busyNAPI := nic.NAPIConfig{DeferHardIRQs: 2, GROFlushTimeout: 200_000}
	setup := func(t *testing.T) (*testnet.Pair, func() nic.NAPIConfig) {
		p := testnet.NewPair(t, 4)
		sys, err := nic.MountSysfs(p.NSPath())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sys.Close() })
		return p, func() nic.NAPIConfig {
			t.Helper()
			c, err := sys.NAPI("xa")
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
	}
	busyPoll := func(timeout int) string {
		return fmt.Sprintf("busyPoll: {timeoutMicros: %d, budget: 16}", timeout)
	}
	// expect takes a lease and checks its sockets' busy polling (timeout
	// 0: none).
	expect := func(t *testing.T, r *fieldRig, a *api.Allocation, timeout int) {
		t.Helper()
		lease, err := connect(a, client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Close()
		var want *wire.BusyPoll
		if timeout > 0 {
			want = &wire.BusyPoll{TimeoutMicros: timeout, Budget: 16}
		}
		if (lease.BusyPoll == nil) != (want == nil) || (want != nil && *lease.BusyPoll != *want) {
			t.Errorf("the lease says busy polling %+v, want %+v", lease.BusyPoll, want)
		}
		prefer := 0
		if timeout > 0 {
			prefer = 1
		}
		for i, s := range lease.Sockets {
			for _, o := range []struct {
				name      string
				opt, want int
			}{{"SO_PREFER_BUSY_POLL", unix.SO_PREFER_BUSY_POLL, prefer}, {"SO_BUSY_POLL", unix.SO_BUSY_POLL, timeout}} {
				v, err := unix.GetsockoptInt(s.FD(), unix.SOL_SOCKET, o.opt)
				if err != nil || v != o.want {
					t.Errorf("queue %d: %s is %d (%v), want %d", lease.Queues[i], o.name, v, err, o.want)
				}
			}
		}
	}

	t.Run("at start, removed by reload", func(t *testing.T) {
		p, napi := setup(t)
		own := napi()
		if own == busyNAPI {
			t.Fatalf("xa has the busy polling NAPI settings before the daemon: %+v", own)
		}
		r := startRig(t, p, demoPool("0-1", busyPoll(50)))
		if got := napi(); got != busyNAPI {
			t.Errorf("napi settings of xa %+v, want %+v", got, busyNAPI)
		}
		if !r.policy().BusyPoll {
			t.Error("the agent's policy has no busy polling")
		}
		a := r.alloc("demo", 2)
		expect(t, r, a, 50)

		r.reload(demoPool("0-1"))
		if got := napi(); got != own {
			t.Errorf("after the reload without busyPoll: napi settings of xa %+v, want its own %+v", got, own)
		}
		if n := r.netdev(); r.policy().BusyPoll || n.PolicyError != "" {
			t.Errorf("after the reload without busyPoll: policy %+v, %+v", r.policy(), n)
		}
		expect(t, r, a, 0)
	})
	t.Run("brought in and changed by reload", func(t *testing.T) {
		p, napi := setup(t)
		own := napi()
		r := startRig(t, p, demoPool("0-1"))
		if got := napi(); got != own {
			t.Errorf("without busyPoll: napi settings of xa %+v, want its own %+v", got, own)
		}
		a := r.alloc("demo", 1)
		expect(t, r, a, 0)

		r.reload(demoPool("0-1", busyPoll(20)))
		if got := napi(); got != busyNAPI {
			t.Errorf("after the reload with busyPoll: napi settings of xa %+v, want %+v", got, busyNAPI)
		}
		expect(t, r, a, 20)
		r.reload(demoPool("0-1", busyPoll(100)))
		expect(t, r, a, 100)
	})
}

// TestFieldAttach: attach: always keeps the program on xa with no socket
// at all, onDemand keeps it off; a reload to always attaches at once (the
// reload returns with the program attached), and a reload back to
// onDemand starts the linger: the program goes a linger after the reload,
// not at once.
func TestFieldAttach(t *testing.T) {
	const linger = 500 * time.Millisecond
	always, onDemand := demoPool("0-1", "attach: always", "linger: 500ms"), demoPool("0-1", "linger: 500ms")
	isOurs := func(att *xdp.Attached) bool { return att != nil && att.Ours && att.Kind == xdp.Filter }
	check := func(t *testing.T, r *fieldRig, when string, on bool) {
		t.Helper()
		want := agent.StateNone
		if on {
			want = agent.StateFilter
		}
		// Status follows once the agent's reconcile ends: the kernel's
		// notification of the attach or detach may come before.
		n := r.waitNetdev(string(want)+" "+when, func(n api.NetdevStatus) bool { return n.State == string(want) })
		if len(n.Sockets) != 0 {
			t.Errorf("%s: xa %+v, want %s with no socket", when, n, want)
		}
		if att := attached(t, r.p); isOurs(att) != on {
			t.Errorf("%s: xa's hook has %+v", when, att)
		}
	}
	t.Run("always at start, onDemand by reload", func(t *testing.T) {
		p := testnet.NewPair(t, 4)
		r := startRig(t, p, always)
		check(t, r, "at start", true)
		events := watchXDP(t, p, p.A.Index)
		reloading := time.Now()
		r.reload(onDemand)
		took := waitDetach(t, events, 10*time.Second).Sub(reloading)
		t.Logf("detached %v after the reload to onDemand", took)
		if took < linger || took > linger+time.Second {
			t.Errorf("detached %v after the reload to onDemand, want the linger %v", took, linger)
		}
		check(t, r, "after the linger", false)
	})
	t.Run("onDemand at start, always by reload", func(t *testing.T) {
		p := testnet.NewPair(t, 4)
		r := startRig(t, p, onDemand)
		check(t, r, "at start", false)
		r.reload(always)
		check(t, r, "after the reload to always", true)
	})
}

// TestFieldExclusive: with exclusive the program is held by a pinned
// bpf_link and the kernel refuses an operator's `ip link set xa xdpdrv`
// even forced; without it the operator's program takes the hook (xa is
// Overridden) and xdpq's comes back when it goes. Both ways by reload;
// and a reload to exclusive while an operator's program is there leaves
// it alone (it has precedence), the link taking the hook once it goes.
func TestFieldExclusive(t *testing.T) {
	if _, err := os.Stat(operatorObj); err != nil {
		t.Fatal(err)
	}
	exclusive, shared := demoPool("0-1", "attach: always", "exclusive: true"), demoPool("0-1", "attach: always")
	held := func(t *testing.T, r *fieldRig, when string) {
		t.Helper()
		if _, err := os.Stat(filepath.Join(r.o.PinDir, "xa", "link")); err != nil {
			t.Errorf("%s: no pinned link: %v", when, err)
		}
		if err := foreign(r.p, true); err == nil {
			t.Errorf("%s: the kernel took the operator's program over the exclusive link", when)
		}
		if att := attached(t, r.p); att == nil || !att.Ours {
			t.Errorf("%s: xa's hook has %+v", when, att)
		}
	}
	yields := func(t *testing.T, r *fieldRig, when string) {
		t.Helper()
		if _, err := os.Stat(filepath.Join(r.o.PinDir, "xa", "link")); !os.IsNotExist(err) {
			t.Errorf("%s: a pinned link: %v", when, err)
		}
		if err := foreign(r.p, true); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		n := r.waitNetdev("Overridden", func(n api.NetdevStatus) bool { return n.State == string(agent.StateOverridden) })
		if !strings.Contains(n.Reason, "operator_pass") {
			t.Errorf("%s: overridden, reason %q", when, n.Reason)
		}
		if err := foreign(r.p, false); err != nil {
			t.Fatal(err)
		}
		r.waitNetdev("back to Filter", func(n api.NetdevStatus) bool { return n.State == string(agent.StateFilter) })
	}
	t.Run("exclusive at start, shared by reload", func(t *testing.T) {
		p := testnet.NewPair(t, 4)
		r := startRig(t, p, exclusive)
		if !r.policy().Exclusive {
			t.Error("the agent's policy is not exclusive")
		}
		held(t, r, "at start")
		r.reload(shared)
		yields(t, r, "after the reload without exclusive")
	})
	t.Run("shared at start, exclusive by reload", func(t *testing.T) {
		p := testnet.NewPair(t, 4)
		r := startRig(t, p, shared)
		yields(t, r, "at start")
		r.reload(exclusive)
		held(t, r, "after the reload to exclusive")
	})
	t.Run("exclusive by reload while overridden", func(t *testing.T) {
		p := testnet.NewPair(t, 4)
		r := startRig(t, p, shared)
		if err := foreign(p, true); err != nil {
			t.Fatal(err)
		}
		r.waitNetdev("Overridden", func(n api.NetdevStatus) bool { return n.State == string(agent.StateOverridden) })
		r.reload(exclusive)
		if att := attached(t, p); att == nil || att.Name != "operator_pass" {
			t.Fatalf("the reload to exclusive took the operator's program off: %+v", att)
		}
		if n := r.netdev(); n.State != string(agent.StateOverridden) {
			t.Errorf("after the reload to exclusive: %+v", n)
		}
		if err := foreign(p, false); err != nil {
			t.Fatal(err)
		}
		r.waitNetdev("back to Filter", func(n api.NetdevStatus) bool { return n.State == string(agent.StateFilter) })
		held(t, r, "once the operator's program went")
	})
}

// TestFieldSteering: auto resolves to software on veth (no ntuple
// filters): the filter program; software is the filter program; hardware
// is the direct program, and since veth has no ntuple filters and no RSS
// table, status must say so (an ADD with flows is refused, and the
// host's traffic on the pool's queues goes to the pods). By reload:
// software to hardware swaps the program in place with no flow, is
// refused with the reason in status (the netdev keeping software
// steering and its flow) with one, and back.
func TestFieldSteering(t *testing.T) {
	// notSilent checks that status says hardware steering is not there.
	notSilent := func(t *testing.T, r *fieldRig, when string) {
		t.Helper()
		s, n := r.status(), r.netdev()
		if said := n.PolicyError + " " + n.Reason + " " + s.ConfigError; !strings.Contains(said, "ntuple") {
			t.Errorf("%s: hardware steering on veth, which has no ntuple filters and no RSS table, and status says nothing of it: "+
				"xa %+v, config error %q", when, n, s.ConfigError)
		}
	}
	for _, tc := range []struct {
		steering string
		state    agent.State
		resolved string
	}{
		{"auto", agent.StateFilter, "software"},
		{"software", agent.StateFilter, "software"},
		{"hardware", agent.StateDirect, "hardware"},
	} {
		t.Run("start "+tc.steering, func(t *testing.T) {
			p := testnet.NewPair(t, 4)
			r := startRig(t, p, fmt.Sprintf("pools: [{name: demo, steering: %s, attach: always, devices: {netdevs: ['xa#0-1']}}]\n", tc.steering))
			n := r.netdev()
			if n.State != string(tc.state) || n.Steering != tc.resolved {
				t.Errorf("xa %+v, want %s with %s steering", n, tc.state, tc.resolved)
			}
			if att := attached(t, p); att == nil || !att.Ours || att.Kind != map[agent.State]xdp.Kind{agent.StateFilter: xdp.Filter, agent.StateDirect: xdp.Direct}[tc.state] {
				t.Errorf("xa's hook has %+v", att)
			}
			a := r.alloc("demo", 1)
			flow := api.CNIFlow{Protocol: "udp", Dst: netip.PrefixFrom(p.PodAddr, 32), DstPort: 5000}
			_, err := r.d.local.CNIAdd(context.Background(), api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Allocation: a.ID, Flows: []api.CNIFlow{flow}, Addresses: []netip.Addr{flow.Dst.Addr()}})
			if tc.resolved == "software" && err != nil {
				t.Errorf("add with a flow: %v", err)
			}
			if tc.resolved == "hardware" {
				if err == nil || !strings.Contains(err.Error(), "no ntuple filters") {
					t.Errorf("add with a flow on hardware steering on veth: %v", err)
				}
				notSilent(t, r, "at start")
			}
		})
	}
	t.Run("reload software to hardware and back", func(t *testing.T) {
		p := testnet.NewPair(t, 4)
		cfg := func(steering string) string {
			return fmt.Sprintf("pools: [{name: demo, steering: %s, attach: always, devices: {netdevs: ['xa#0-1']}}]\n", steering)
		}
		r := startRig(t, p, cfg("software"))
		before := attached(t, p)
		r.reload(cfg("hardware"))
		n := r.netdev()
		if n.State != string(agent.StateDirect) || n.Steering != "hardware" || r.policy().Steering != agent.SteerHardware {
			t.Errorf("after the reload to hardware: xa %+v, policy %+v", n, r.policy())
		}
		if att := attached(t, p); att == nil || !att.Ours || att.Kind != xdp.Direct || att.ID == before.ID {
			t.Errorf("after the reload to hardware: xa's hook has %+v (before %+v)", att, before)
		}
		notSilent(t, r, "after the reload to hardware")
		r.reload(cfg("auto"))
		if n := r.netdev(); n.State != string(agent.StateFilter) || n.Steering != "software" || n.PolicyError != "" {
			t.Errorf("after the reload to auto: xa %+v", n)
		}
	})
	t.Run("hardware refused with a flow", func(t *testing.T) {
		p := testnet.NewPair(t, 4)
		cfg := func(steering string) string {
			return fmt.Sprintf("pools: [{name: demo, steering: %s, attach: always, devices: {netdevs: ['xa#0-1']}}]\n", steering)
		}
		r := startRig(t, p, cfg("software"))
		a := r.alloc("demo", 1)
		flow := api.CNIFlow{Protocol: "udp", Dst: netip.PrefixFrom(p.PodAddr, 32), DstPort: 5000}
		ctx := context.Background()
		if _, err := r.d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Allocation: a.ID, Flows: []api.CNIFlow{flow}, Addresses: []netip.Addr{flow.Dst.Addr()}}); err != nil {
			t.Fatal(err)
		}
		r.reload(cfg("hardware"))
		n, s := r.netdev(), r.status()
		if n.State != string(agent.StateFilter) || n.Steering != "software" || n.Flows != 1 || r.policy().Steering != agent.SteerSoftware {
			t.Errorf("after the refused reload to hardware: xa %+v, policy %+v", n, r.policy())
		}
		if !strings.Contains(n.PolicyError, "keeps software steering") || !strings.Contains(n.PolicyError, "ntuple") ||
			!strings.Contains(s.ConfigError, "xa: steering hardware") {
			t.Errorf("the refusal is not reported: policy error %q, config error %q", n.PolicyError, s.ConfigError)
		}
		if _, err := r.d.local.CNICheck(ctx, api.AttachmentRef{ContainerID: "c1", IfName: "net1"}); err != nil {
			t.Errorf("the flow after the refused reload: %v", err)
		}
		r.reload(cfg("software"))
		if n, s := r.netdev(), r.status(); n.PolicyError != "" || s.ConfigError != "" || n.Flows != 1 {
			t.Errorf("back to software: xa %+v, config error %q", n, s.ConfigError)
		}
	})
}

// TestFieldQueues: a pool grows and shrinks by reload; the devices an
// allocation holds stay its own (counted beyond the pool, with a reason)
// and free never goes negative. A range beyond the netdev's queues is
// reported in status's configError and the pool's reason, at start and
// by reload, never a silent pool of no queues.
func TestFieldQueues(t *testing.T) {
	type want struct {
		queues, free int
		reason       string // a part of the pool's reason; "" none
	}
	expect := func(t *testing.T, r *fieldRig, when string, w want) {
		t.Helper()
		ps, ok := r.pool("demo")
		if !ok {
			t.Fatalf("%s: no pool demo in status", when)
		}
		if ps.Queues != w.queues || ps.Free != w.free || (w.reason == "") != (ps.Reason == "") || !strings.Contains(ps.Reason, w.reason) {
			t.Errorf("%s: pool %+v, want %d queues, %d free, reason %q", when, ps, w.queues, w.free, w.reason)
		}
		if ps.Free < 0 || ps.Free > ps.Queues {
			t.Errorf("%s: %d free of %d", when, ps.Free, ps.Queues)
		}
	}
	t.Run("grow and shrink", func(t *testing.T) {
		p := testnet.NewPair(t, 4)
		r := startRig(t, p, demoPool("0-1"))
		expect(t, r, "at start", want{2, 2, ""})
		a := r.alloc("demo", 1)
		if !slices.Equal(a.Queues, []uint32{0}) {
			t.Fatalf("allocation %+v, want queue 0", a)
		}
		r.reload(demoPool("0-3"))
		expect(t, r, "grown to 0-3", want{4, 3, ""})
		r.reload(demoPool("2-3"))
		const beyond = "1 devices held by allocations are no longer in the pool"
		expect(t, r, "shrunk to 2-3", want{2, 2, beyond})
		if l := r.allocations(); len(l.Allocations) != 1 || l.Allocations[0].ID != a.ID {
			t.Errorf("shrunk to 2-3: allocations %+v, want %s kept", l.Allocations, a.ID)
		}
		if lease, err := connect(a, client.Options{}); err != nil {
			t.Errorf("shrunk to 2-3: a lease of the allocation's queue out of the pool: %v", err)
		} else {
			lease.Close()
		}
		b := r.alloc("demo", 2)
		if !slices.Equal(b.Queues, []uint32{2, 3}) {
			t.Errorf("shrunk to 2-3: the next allocation got %v", b.Queues)
		}
		expect(t, r, "shrunk to 2-3 and taken", want{2, 0, beyond})
		r.reload(demoPool("0"))
		expect(t, r, "shrunk to 0, held", want{1, 0, "2 devices held by allocations are no longer in the pool"})
		if _, err := r.d.local.Alloc(context.Background(), api.AllocRequest{Pool: "demo", Count: 1}); !errors.Is(err, api.ErrConflict) {
			t.Errorf("alloc from a pool whose one queue is held: %v", err)
		}
		for _, x := range []*api.Allocation{a, b} {
			if err := r.d.local.Free(context.Background(), x.ID); err != nil {
				t.Fatal(err)
			}
		}
		expect(t, r, "freed", want{1, 1, ""})
	})
	t.Run("beyond the netdev", func(t *testing.T) {
		p := testnet.NewPair(t, 4)
		const why = "xa has 4 rx queues, so no queue 7"
		r := startRig(t, p, demoPool("0-7"))
		expect(t, r, "0-7 at start", want{0, 0, why})
		if s := r.status(); !strings.Contains(s.ConfigError, why) {
			t.Errorf("0-7 at start: config error %q", s.ConfigError)
		}
		r.reload(demoPool("0-3"))
		expect(t, r, "0-3", want{4, 4, ""})
		if s := r.status(); s.ConfigError != "" {
			t.Errorf("0-3: config error %q", s.ConfigError)
		}
		a := r.alloc("demo", 1)
		r.reload(demoPool("0-7"))
		expect(t, r, "0-7 by reload", want{0, 0, why})
		if s, l := r.status(), r.allocations(); !strings.Contains(s.ConfigError, why) || len(l.Allocations) != 1 || l.Allocations[0].ID != a.ID {
			t.Errorf("0-7 by reload: config error %q, allocations %+v", s.ConfigError, l.Allocations)
		}
	})
}

// TestFieldAllowTX: a lease that asks for a TX ring is refused (limit,
// receive-only) without allowTX and granted with it, the socket with a TX
// ring; a reload changes it for the next lease of a live allocation.
func TestFieldAllowTX(t *testing.T) {
	expect := func(t *testing.T, a *api.Allocation, when string, granted bool) {
		t.Helper()
		lease, err := connect(a, client.Options{TX: true})
		if !granted {
			var pe *wire.ProtocolError
			if !errors.As(err, &pe) || pe.Code != wire.CodeLimit || !strings.Contains(pe.Reason, "receive-only") {
				t.Errorf("%s: a lease with TX: %v, want refused as receive-only", when, err)
			}
			if err == nil {
				lease.Close()
			}
			return
		}
		if err != nil {
			t.Errorf("%s: a lease with TX: %v", when, err)
			return
		}
		defer lease.Close()
		if !lease.Limits.AllowTX || lease.Sockets[0].Rings().TX == 0 {
			t.Errorf("%s: lease limits %+v, rings %+v", when, lease.Limits, lease.Sockets[0].Rings())
		}
	}
	t.Run("without at start, with by reload", func(t *testing.T) {
		r := startRig(t, testnet.NewPair(t, 4), demoPool("0-1"))
		a := r.alloc("demo", 1)
		expect(t, a, "without allowTX", false)
		r.reload(demoPool("0-1", "allowTX: true"))
		expect(t, a, "reloaded with allowTX", true)
	})
	t.Run("with at start, without by reload", func(t *testing.T) {
		r := startRig(t, testnet.NewPair(t, 4), demoPool("0-1", "allowTX: true"))
		a := r.alloc("demo", 1)
		expect(t, a, "with allowTX", true)
		r.reload(demoPool("0-1"))
		expect(t, a, "reloaded without allowTX", false)
	})
}

// TestFieldLimits: a lease over maxUMEMBytes, maxRing or maxQueuesPerPod
// is refused with the limit named; a reload that raises the limit lets
// the next lease of the same allocation in, one that lowers it again
// refuses it.
func TestFieldLimits(t *testing.T) {
	// The client's UMEM: a fill and an rx ring's worth of 2 KiB frames per
	// queue, 1 MiB with rings of 256.
	for _, tc := range []struct {
		name         string
		tight, roomy string // the pool's limits
		queues       int
		refusal      string
	}{
		{"maxUMEMBytes", "maxUMEMBytes: 524288", "maxUMEMBytes: 1048576", 1,
			"umem memfd of 1048576 bytes; this allocation allows at most 524288"},
		{"maxRing", "maxRing: 128", "maxRing: 256", 1, "ring of 256 entries; this allocation allows at most 128"},
		{"maxQueuesPerPod", "maxQueuesPerPod: 1", "maxQueuesPerPod: 2", 2, "2 queues; at most 1 per request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := func(limits string) string { return demoPool("0-3", "limits: {"+limits+"}") }
			start := tc.tight
			if tc.name == "maxQueuesPerPod" {
				// An allocation over it is refused (TestFieldMaxQueuesPerPodAlloc):
				// the allocation is made under the roomy limit, then lowered.
				start = tc.roomy
			}
			r := startRig(t, testnet.NewPair(t, 4), cfg(start))
			a := r.alloc("demo", tc.queues)
			if start == tc.roomy {
				r.reload(cfg(tc.tight))
			}
			expect := func(when string, granted bool) {
				t.Helper()
				lease, err := connect(a, client.Options{})
				if err == nil {
					lease.Close()
				}
				var pe *wire.ProtocolError
				switch {
				case granted && err != nil:
					t.Errorf("%s: %v", when, err)
				case !granted && (!errors.As(err, &pe) || pe.Code != wire.CodeLimit || !strings.Contains(pe.Reason, tc.refusal)):
					t.Errorf("%s: %v, want refused: %s", when, err, tc.refusal)
				}
			}
			expect("at start", false)
			r.reload(cfg(tc.roomy))
			expect("raised by reload", true)
			r.reload(cfg(tc.tight))
			expect("lowered by reload", false)
		})
	}
}

// TestFieldMaxQueuesPerPodAlloc: an allocation of more queues than
// maxQueuesPerPod is refused, naming the limit: the pod could never use
// the queues beyond it (a lease of more is refused) and they would be
// kept from every other pod.
func TestFieldMaxQueuesPerPodAlloc(t *testing.T) {
	r := startRig(t, testnet.NewPair(t, 4), demoPool("0-3", "limits: {maxQueuesPerPod: 1}"))
	a, err := r.d.local.Alloc(context.Background(), api.AllocRequest{Pool: "demo", Count: 2})
	if err == nil || !strings.Contains(err.Error(), "maxQueuesPerPod") {
		t.Errorf("alloc of 2 queues with maxQueuesPerPod 1: %+v, %v; want refused naming the limit", a, err)
	}
	r.reload(demoPool("0-3", "limits: {maxQueuesPerPod: 2}"))
	if _, err := r.d.local.Alloc(context.Background(), api.AllocRequest{Pool: "demo", Count: 2}); err != nil {
		t.Errorf("alloc of 2 queues with maxQueuesPerPod 2: %v", err)
	}
}

// TestFieldPoolsKubernetes: in Kubernetes mode a reload that adds a pool
// gives it devices in status and a device plugin registered under its
// resource; one that removes a pool with a live allocation keeps the
// allocation, the pool listed with no queues and a reason, until it is
// freed: then the pool is gone. A reload that changes resourcePrefix
// registers the pools again under the new names.
func TestFieldPoolsKubernetes(t *testing.T) {
	p := testnet.NewPair(t, 4)
	dir := t.TempDir()
	plugins := filepath.Join(dir, "device-plugins")
	os.MkdirAll(plugins, 0o755)
	regs := kubelettest.Start(t, plugins).Registrations
	cfgPath := filepath.Join(dir, "config.yaml")
	poolA := "{name: a, steering: software, devices: {netdevs: ['xa#0-1']}}"
	poolB := "{name: b, steering: software, devices: {netdevs: ['xa#2-3']}}"
	os.WriteFile(cfgPath, []byte("pools: ["+poolA+"]\n"), 0o644)
	o := Options{ConfigPath: cfgPath, NetNS: p.NSPath(), PinDir: filepath.Join(testPins(t), "xdpq"),
		StateDir: filepath.Join(dir, "state"), AllocDir: filepath.Join(dir, "alloc"), PluginDir: plugins,
		DeviceInfoDir: filepath.Join(dir, "devinfo"), APISocket: filepath.Join(dir, "api.sock"), CollectPeriod: time.Hour}
	d, _ := runDaemon(t, o)
	r := &fieldRig{t: t, p: p, o: o, d: d}
	ctx := context.Background()
	registered := func(resource string) *pluginapi.RegisterRequest {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case reg := <-regs:
				if reg.ResourceName == resource {
					return reg
				}
			case <-timeout:
				t.Fatalf("no registration of %s", resource)
			}
		}
	}
	regA := registered("xdpq.io/a")

	r.reload("pools: [" + poolA + ", " + poolB + "]\n")
	if ps, ok := r.pool("b"); !ok || ps.Queues != 2 || ps.Free != 2 || ps.Resource != "xdpq.io/b" || ps.Reason != "" {
		t.Errorf("pool b added by reload: %+v", ps)
	}
	regB := registered("xdpq.io/b")
	stream, err := kubelettest.Dial(t, filepath.Join(plugins, regB.Endpoint)).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, dev := range list.Devices {
		ids = append(ids, dev.ID)
	}
	if slices.Sort(ids); !slices.Equal(ids, []string{"xa-q2", "xa-q3"}) {
		t.Errorf("pool b's plugin lists %v", ids)
	}

	resp, err := kubelettest.Dial(t, filepath.Join(plugins, regA.Endpoint)).Allocate(ctx,
		&pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"xa-q0"}}}})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.ContainerResponses[0].Envs["XDPQ_ALLOCATION"]
	r.reload("pools: [" + poolB + "]\n")
	ps, ok := r.pool("a")
	if !ok || ps.Queues != 0 || ps.Free != 0 || !strings.Contains(ps.Reason, "removed from the config") {
		t.Errorf("pool a removed with a live allocation: %+v (listed %v)", ps, ok)
	}
	if l := r.allocations(); len(l.Allocations) != 1 || l.Allocations[0].ID != id {
		t.Errorf("pool a removed: allocations %+v, want %s kept", l.Allocations, id)
	}
	if _, err := os.Stat(filepath.Join(o.AllocDir, id, broker.SocketName)); err != nil {
		t.Errorf("pool a removed: the allocation is not served: %v", err)
	}
	if err := d.local.Free(ctx, id); err != nil {
		t.Fatal(err)
	}
	if ps, ok := r.pool("a"); ok {
		t.Errorf("pool a still listed once its allocation was freed: %+v", ps)
	}

	r.reload("resourcePrefix: example.org\npools: [" + poolB + "]\n")
	registered("example.org/b")
	if ps, _ := r.pool("b"); ps.Resource != "example.org/b" || ps.Queues != 2 {
		t.Errorf("pool b after the prefix changed: %+v", ps)
	}
}

// TestFieldAttachInPod: a reload of attach reaches a netdev-mode pool's
// netdev that is in a pod: always puts xdpq's program on it (inside the
// pod, no socket bound), onDemand takes it off after the linger. (Before,
// a hot reload of attach did not reach a netdev already in a pod.)
func TestFieldAttachInPod(t *testing.T) {
	p := testnet.NewPair(t, 2)
	pool := func(extra string) string {
		return "pools: [{name: vf, mode: netdev, linger: 200ms, devices: {netdevs: [xa]}" + extra + "}]\n"
	}
	r := startRig(t, p, pool(""))
	_, pod, ref := netdevInPod(t, r.d, "vf")
	ctx := context.Background()
	hook := func() *xdp.Attached {
		t.Helper()
		var att *xdp.Attached
		if err := pod.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName("net1")
			if err != nil {
				return err
			}
			att, err = xdp.Query(pod.Path(), l.Attrs().Index)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return att
	}
	if n := r.netdev(); n.State != string(agent.StateNone) || hook() != nil {
		t.Fatalf("in the pod, onDemand, no socket: %+v", n)
	}
	r.reload(pool(", attach: always"))
	if n := r.netdev(); n.State != string(agent.StateDirect) {
		t.Errorf("after the reload to always: %+v", n)
	}
	if att := hook(); att == nil || !att.Ours {
		t.Errorf("after the reload to always, net1's hook has %+v", att)
	}
	r.reload(pool(""))
	r.waitNetdev("the program gone after the linger", func(n api.NetdevStatus) bool { return n.State == string(agent.StateNone) })
	if att := hook(); att != nil {
		t.Errorf("after the reload back to onDemand, net1's hook has %+v", att)
	}
	if err := r.d.local.CNIDel(ctx, ref); err != nil {
		t.Fatal(err)
	}
}
