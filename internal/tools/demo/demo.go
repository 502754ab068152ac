// Package demo is what `make demo` runs: the product as a platform team
// meets it, on one machine. A network namespace holds a veth "NIC" of 4
// queues and a traffic source behind it; the xdpq daemon runs in
// standalone mode with a software-steered pool of two of its queues;
// an allocation of both is made for uid 65534; xdpqperf, the pod, runs as
// uid 65534 with no capabilities in a network namespace of its own and
// takes its sockets from the broker; cnitool runs the CNI ADD through the
// installed xdpq plugin (with host-local IPAM), which steers the pod's
// flow (udp to its IPAM address, port 5000) to its queues. While the
// source sends, a line per second shows what the pod receives and the
// state of the netdev's XDP hook; midway an operator's program takes the
// hook, and xdpq steps aside and comes back when it goes. Then the pod
// exits, cnitool runs DEL, the daemon stops, and the demo checks that
// nothing is left.
package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/perf"
	"github.com/xdpq/xdpq/internal/testing/handover"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/daemon"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

const (
	frameBytes = 64
	network    = "xdpq-demo"
	podUID     = 65534
)

// Binaries are the programs the demo runs.
type Binaries struct {
	Perf    string // xdpqperf
	CNIDir  string // holds the plugins: xdpq (cmd/cni) and host-local
	CNITool string
}

// Run runs the demo with seconds seconds of traffic, writing to out.
// When ctx ends (Ctrl-C), it stops early and still removes all it made.
func Run(ctx context.Context, out io.Writer, bin Binaries, seconds int) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("the demo needs root: it creates network namespaces and attaches XDP programs (sudo make demo)")
	}
	for _, f := range []string{bin.Perf, bin.CNITool, filepath.Join(bin.CNIDir, "xdpq"), filepath.Join(bin.CNIDir, "host-local")} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("%w (make demo builds it)", err)
		}
	}
	var mu sync.Mutex // out is written by the pod's output copier too
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
	}
	var uname unix.Utsname
	if err := unix.Uname(&uname); err != nil {
		return fmt.Errorf("uname: %w", err)
	}
	say("xdpq demo on Linux %s", unix.ByteSliceToString(uname.Release[:]))

	// Everything the demo creates, removed in reverse order; what could
	// not be is told with the demo's outcome.
	var cleanups []func() error
	runCleanups := func() error {
		var errs []error
		for i := len(cleanups) - 1; i >= 0; i-- {
			errs = append(errs, cleanups[i]())
		}
		cleanups = nil
		return errors.Join(errs...)
	}
	defer func() {
		if cerr := runCleanups(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", cerr))
		}
	}()
	work, err := os.MkdirTemp("", "xdpq-demo-")
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() error { return os.RemoveAll(work) })
	if err := os.Chmod(work, 0o755); err != nil { // the pod reaches its allocation's socket in here
		return err
	}
	if err := xdp.MountBPFFS(xdp.DefaultBPFFS); err != nil {
		return err
	}
	pins, err := os.MkdirTemp(xdp.DefaultBPFFS, "xdpq-demo-")
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() error { return os.RemoveAll(pins) })

	pair, err := testnet.Create(4)
	if err != nil {
		return err
	}
	nsPath := pair.NSPath()
	cleanups = append(cleanups, pair.Close)
	say("[1/8] netns %s: veth %q (the NIC, 4 queues) <-> %q (the traffic source)", nsPath, "xa", "xb")

	cfg := filepath.Join(work, "config.yaml")
	if err := os.WriteFile(cfg, []byte("pools: [{name: demo, steering: software, devices: {netdevs: ['xa#0-1']}}]\n"), 0o644); err != nil {
		return err
	}
	apiSock := filepath.Join(work, "api.sock")
	d, err := daemon.New(daemon.Options{ConfigPath: cfg, NetNS: nsPath, PinDir: filepath.Join(pins, "xdpq"),
		StateDir: filepath.Join(work, "state"), AllocDir: filepath.Join(work, "alloc"), Standalone: true,
		APISocket: apiSock, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	dctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- d.Run(dctx) }()
	daemonDone := false
	stopDaemon := func() error {
		if daemonDone {
			return nil
		}
		daemonDone = true
		cancel()
		return <-stopped
	}
	cleanups = append(cleanups, stopDaemon)
	select {
	case <-d.Ready():
	case err := <-stopped:
		daemonDone = true
		return fmt.Errorf("the daemon stopped: %w", err)
	}
	say("[2/8] daemon (standalone) serves %s; pool demo: xa queues 0-1, software steering (veth has no ntuple filters)", apiSock)
	alloc, err := d.API().Alloc(dctx, api.AllocRequest{Pool: "demo", Count: 2, UID: podUID})
	if err != nil {
		return err
	}
	say("[3/8] allocation %s: xa queues %v for uid %d, broker socket %s", alloc.ID, alloc.Queues, podUID, alloc.Socket)

	seconds = max(seconds, 4)
	var podErr bytes.Buffer
	pr, pw := io.Pipe()
	pod, err := handover.StartProgram(bin.Perf, []string{"-mode", "rxdrop", "-duration", strconv.Itoa(seconds+2) + "s", "-ring", "2048"},
		[]string{"XDPQ_SOCKET=" + alloc.Socket}, pw, &podErr)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() error { pod.Kill(); return nil })
	copied := make(chan struct{})
	var received perf.Totals // from xdpqperf's "total qN" and "drops qN" lines
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if t, ok := perf.ParseTotals(sc.Text()); ok {
				received.Queues = append(received.Queues, t.Queues...)
				received.RX = append(received.RX, t.RX...)
				received.TX = append(received.TX, t.TX...)
				received.Drops = append(received.Drops, t.Drops...)
			}
			say("   pod | %s", sc.Text())
		}
	}()
	if err := waitNetdev(d, func(n api.NetdevStatus) bool { return len(n.Sockets) == 2 }); err != nil {
		return fmt.Errorf("%w\npod stderr:\n%s", err, podErr.String())
	}
	var id handover.Msg
	if err := handover.IdentityOf(strconv.Itoa(pod.Cmd.Process.Pid), &id); err != nil {
		return err
	}
	say("[4/8] pod: xdpqperf as uid %s, CapEff %s, netns links %v; it sent its own memfd as UMEM and holds sockets on xa queues 0 and 1",
		id.UID, id.CapEff, id.Links)

	podNS := fmt.Sprintf("/proc/%d/ns/net", pod.Cmd.Process.Pid)
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"xdpq","daemonSocket":%q,
		"ipam":{"type":"host-local","subnet":"10.77.0.0/24","dataDir":%q},
		"flows":[{"protocol":"udp","destination":"ipam","destinationPort":"5000"}]}`, network, apiSock, filepath.Join(work, "ipam"))
	netdir := filepath.Join(work, "net.d")
	if err := os.MkdirAll(netdir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(netdir, network+".conf"), []byte(conf), 0o644); err != nil {
		return err
	}
	cni := func(verb string) ([]byte, time.Duration, error) {
		cmd := exec.Command(bin.CNITool, verb, network, podNS)
		cmd.Env = append(os.Environ(), "CNI_PATH="+bin.CNIDir, "NETCONFPATH="+netdir, "CNI_IFNAME=net1",
			"CNI_ARGS=IgnoreUnknown=1;XDPQ_ALLOCATION="+alloc.ID)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		start := time.Now()
		b, err := cmd.Output()
		if err != nil {
			return b, 0, fmt.Errorf("cnitool %s: %v: %s%s", verb, err, stderr.String(), b)
		}
		return b, time.Since(start), nil
	}
	// libcni keeps the result under /var/lib/cni until DEL; a failed demo
	// must not leave it.
	cleanups = append(cleanups, func() error {
		stale, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", network+"-*")) // a constant, valid pattern
		var errs []error
		for _, f := range stale {
			errs = append(errs, os.Remove(f))
		}
		return errors.Join(errs...)
	})
	b, took, err := cni("add")
	if err != nil {
		return err
	}
	var res struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(b, &res); err != nil || len(res.IPs) != 1 {
		return fmt.Errorf("cnitool add printed %s: %v", b, err)
	}
	podIP := netip.MustParsePrefix(res.IPs[0].Address).Addr()
	st, _ := netdevStatus(d)
	say("[5/8] cnitool add %s (%.0f ms): host-local gave the pod %s; xa: %d flow steered (udp %s:5000 -> queues 0,1), %s",
		network, float64(took.Microseconds())/1000, res.IPs[0].Address, st.Flows, podIP, describe(nsPath, pair.A.Index))

	say("[6/8] the source sends %d-byte UDP frames to %s:5000 on its queues 0 and 1, %d a second each, for %ds; an operator's program takes xa's hook at %ds and leaves at %ds",
		frameBytes, podIP, sourceRate, seconds, seconds/2-1, seconds/2+1)
	src, err := newSource(pair, podIP)
	if err != nil {
		return err
	}
	defer src.close()
	var stop atomic.Bool
	var wg sync.WaitGroup
	var sent [2]atomic.Uint64
	sendErr := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sendErr[i] = src.pace(i, sourceRate, stop.Load, &sent[i])
		}()
	}
	sentNow := func() uint64 { return sent[0].Load() + sent[1].Load() }
	sendStart := time.Now()
	// The frames sent while xdpq's program was off the hook: from the
	// operator's attach to xdpq's return.
	var offFrom, offTo uint64
	var operator *ebpf.Program
	for s := 1; s <= seconds; s++ {
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			stop.Store(true)
			wg.Wait()
			return fmt.Errorf("interrupted; everything the demo made is removed: %w", ctx.Err())
		}
		switch s {
		case seconds/2 - 1:
			if operator, err = AttachOperator(nsPath, pair.A.Index); err != nil {
				stop.Store(true)
				wg.Wait()
				return err
			}
			offFrom = sentNow()
			cleanups = append(cleanups, operator.Close)
			// The agent sees it on the netlink notification and steps aside.
			if err := waitNetdev(d, func(n api.NetdevStatus) bool { return n.State == string(agent.StateOverridden) }); err != nil {
				stop.Store(true)
				wg.Wait()
				return fmt.Errorf("the agent did not step aside for the operator's program: %w", err)
			}
		case seconds/2 + 1:
			if err := DetachOperator(nsPath, pair.A.Index); err != nil {
				stop.Store(true)
				wg.Wait()
				return err
			}
			// ... and comes back when it goes.
			if err := waitNetdev(d, func(n api.NetdevStatus) bool { return n.State == string(agent.StateFilter) }); err != nil {
				stop.Store(true)
				wg.Wait()
				return fmt.Errorf("xdpq did not come back after the operator's program left: %w", err)
			}
			offTo = sentNow()
		}
		st, _ := netdevStatus(d)
		say("  node | t=%ds xa: %s, state %s, sockets %v, flows %d", s, describe(nsPath, pair.A.Index), st.State, st.Sockets, st.Flows)
	}
	stop.Store(true)
	wg.Wait()
	sending := time.Since(sendStart)
	if err := errors.Join(sendErr...); err != nil {
		return err
	}
	err = pod.Wait()
	_ = pw.Close() // an io.PipeWriter's Close always returns nil
	<-copied
	if err != nil {
		return fmt.Errorf("pod: %w\n%s", err, podErr.String())
	}
	acc := accounting{sent: sentNow(), received: received.Received(), offHook: offTo - offFrom, seconds: sending.Seconds()}
	acc.rxDropped, acc.ringFull, acc.fillEmpty, acc.invalid = received.Dropped()
	for _, l := range acc.lines() {
		say("      %s", l)
	}
	if err := acc.check(); err != nil {
		return err
	}

	if _, took, err = cni("del"); err != nil {
		return err
	}
	if err := waitNetdev(d, func(n api.NetdevStatus) bool { return n.Flows == 0 && len(n.Sockets) == 0 }); err != nil {
		return err
	}
	leases, _ := filepath.Glob(filepath.Join(work, "ipam", network, "10.*"))
	if len(leases) != 0 {
		return fmt.Errorf("host-local leases left after DEL: %v", leases)
	}
	say("[7/8] the pod exited; cnitool del (%.0f ms): no flow, no socket, no lease left", float64(took.Microseconds())/1000)

	if err := stopDaemon(); err != nil {
		return err
	}
	if err := runCleanups(); err != nil {
		return fmt.Errorf("clean up: %w", err)
	}
	for _, p := range []string{nsPath, pins, work} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			return fmt.Errorf("%s still there after cleanup: %v", p, err)
		}
	}
	if stale, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", network+"-*")); len(stale) != 0 {
		return fmt.Errorf("libcni results left: %v", stale)
	}
	say("[8/8] daemon stopped; netns, veth pair, pins, sockets, IPAM leases and CNI cache removed; nothing left behind")
	return nil
}

func netdevStatus(d *daemon.Daemon) (api.NetdevStatus, bool) {
	s, _ := d.API().Status(context.Background())
	for _, n := range s.Netdevs {
		if n.Netdev == "xa" {
			return n, true
		}
	}
	return api.NetdevStatus{}, false
}

func waitNetdev(d *daemon.Daemon, ok func(api.NetdevStatus) bool) error {
	for deadline := time.Now().Add(10 * time.Second); ; {
		n, found := netdevStatus(d)
		if found && ok(n) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("xa: %+v", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func describe(nsPath string, ifindex int) string {
	a, err := xdp.Query(nsPath, ifindex)
	switch {
	case err != nil:
		return "query failed: " + err.Error()
	case a == nil:
		return "no XDP program"
	case a.Ours:
		return fmt.Sprintf("%s (id %d, %s)", a.Name, a.ID, a.Mode)
	}
	return fmt.Sprintf("foreign program %s (id %d, %s)", a.Name, a.ID, a.Mode)
}

// AttachOperator loads an XDP_PASS program named operator_pass and
// attaches it over whatever the netdev ifindex in the network namespace
// at nsPath has, as `ip -force link set xdpdrv` does: an operator's
// program, which xdpq steps aside for. The caller closes the program.
func AttachOperator(nsPath string, ifindex int) (*ebpf.Program, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "operator_pass", Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}})
	if err != nil {
		return nil, fmt.Errorf("operator program: %w", err)
	}
	if err := setXDP(nsPath, ifindex, prog.FD()); err != nil {
		_ = prog.Close() // never attached
		return nil, err
	}
	return prog, nil
}

// DetachOperator removes the XDP program of the netdev, as `ip link set
// xdpdrv off` does: xdpq re-attaches its own.
func DetachOperator(nsPath string, ifindex int) error { return setXDP(nsPath, ifindex, -1) }

func setXDP(nsPath string, ifindex, fd int) error {
	return ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		link, err := netlink.LinkByIndex(ifindex)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetXdpFdWithFlags(link, fd, unix.XDP_FLAGS_DRV_MODE); err != nil {
			return fmt.Errorf("operator's xdp on %s: %w", link.Attrs().Name, err)
		}
		return nil
	})
}

// sourceRate is the frames a second the source sends on each queue: a
// rate this 2-core class of machine carries with the pod, the source and
// the softirq sharing its cores, so that what the pod receives is the
// product's share and not the machine's (make bench measures the
// rates the machine can take).
const sourceRate = 100_000

// pace sends the source's frame on queue i's socket at rate frames a
// second until stop returns true, counting the frames the kernel
// completed in sent as it goes. The frames still in flight at the end
// are waited for, up to a second.
func (s *source) pace(i int, rate float64, stop func() bool, sent *atomic.Uint64) error {
	sock := s.socks[i]
	free := slices.Clone(s.addrs[i])
	comp := make([]uint64, sock.Rings().Completion)
	descs := make([]xsk.Desc, 0, 256)
	inflight := 0
	complete := func() {
		n := sock.Complete(comp)
		free = append(free, comp[:n]...)
		inflight -= n
		sent.Add(uint64(n))
	}
	start := time.Now()
	var queued uint64
	for !stop() {
		complete()
		due := uint64(rate * time.Since(start).Seconds())
		if k := min(int(due-min(due, queued)), len(free), cap(descs)); k > 0 {
			descs = descs[:0]
			for _, a := range free[len(free)-k:] {
				descs = append(descs, xsk.Desc{Addr: a, Len: uint32(len(s.frame))})
			}
			m, err := sock.Transmit(descs)
			if err != nil {
				return err
			}
			free = free[:len(free)-m]
			queued += uint64(m)
			inflight += m
		}
		// In copy mode a kick transmits at most the kernel's TX budget
		// (32 frames): kick until the ring is drained.
		for kicks := 0; inflight > 0 && kicks < 64; kicks++ {
			if err := sock.Kick(); err != nil {
				return err
			}
			complete()
		}
		time.Sleep(100 * time.Microsecond) // the pace: a batch per wake-up
	}
	for end := time.Now().Add(time.Second); inflight > 0 && time.Now().Before(end); {
		if err := sock.Kick(); err != nil {
			return err
		}
		complete()
	}
	return nil
}

// accounting is where the source's frames went: received by the pod,
// dropped by the kernel at its sockets (by reason), sent while xdpq's
// program was off the hook (the operator's program had it, or xdpq was
// coming back), and the rest.
type accounting struct {
	sent, received, offHook                 uint64
	rxDropped, ringFull, fillEmpty, invalid uint64
	seconds                                 float64 // of sending
}

func (a accounting) dropped() uint64 { return a.rxDropped + a.ringFull + a.fillEmpty + a.invalid }

// rest is what no count explains: frames in flight as the hook changed
// hands, counted on the wrong side of it (it may be negative).
func (a accounting) rest() int64 {
	return int64(a.sent) - int64(a.received) - int64(a.offHook) - int64(a.dropped())
}

func (a accounting) lines() []string {
	pct := func(n uint64) float64 { return 100 * float64(n) / float64(max(a.sent, 1)) }
	return []string{
		fmt.Sprintf("the source sent %d frames (%.0f a second):", a.sent, float64(a.sent)/a.seconds),
		fmt.Sprintf("  %10d (%5.1f%%) received by the pod", a.received, pct(a.received)),
		fmt.Sprintf("  %10d (%5.1f%%) sent while xdpq's program was off xa's hook (the operator's program held it; then xdpq came back)", a.offHook, pct(a.offHook)),
		fmt.Sprintf("  %10d (%5.1f%%) dropped by the kernel at the pod's sockets: fill ring empty %d, rx ring full %d, other %d, invalid %d",
			a.dropped(), pct(a.dropped()), a.fillEmpty, a.ringFull, a.rxDropped, a.invalid),
		fmt.Sprintf("  %10d in flight as the hook changed hands, counted on the other side of it", a.rest()),
	}
}

// check says whether the counts add up: what is left is no more than
// what a few milliseconds of traffic at each change of the hook's holder
// makes.
func (a accounting) check() error {
	if bound := int64(2 * sourceRate / 20); a.rest() > bound || a.rest() < -bound {
		return fmt.Errorf("the counts do not add up: %d frames of %d sent are in no count (at most %d expected from the hook's changes of hands): "+
			"frames were lost where none of xdpq's or the kernel's socket counters sees them (the veth's own queue); "+
			"run the demo again on an idle machine, and if it repeats, report it with this output", a.rest(), a.sent, bound)
	}
	return nil
}

// source is the traffic source: one socket per queue on xb, sharing a
// UMEM whose frames all hold the same UDP frame.
type source struct {
	umem  *xsk.UMEM
	socks []*xsk.Socket
	addrs [][]uint64
	frame []byte
}

func newSource(p *testnet.Pair, dst netip.Addr) (*source, error) {
	dev := xsk.Netdev{Name: p.B.Name, Ifindex: p.B.Index, NetNS: p.NSPath()}
	const per = 1024
	umem, socks, err := xsk.Open(dev, []uint32{0, 1}, 2*per, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048},
		Rings: xsk.Rings{Fill: 64, Completion: 1024, TX: 1024}})
	if err != nil {
		return nil, err
	}
	f, err := frame.Spec{SrcMAC: p.B.MAC, DstMAC: p.A.MAC, Src: p.B.Addr, Dst: dst, Protocol: 17,
		SrcPort: 4000, DstPort: 5000, Payload: frame.Payload(0, 0, frameBytes-42)}.Build()
	if err != nil {
		return nil, err
	}
	s := &source{umem: umem, socks: socks, frame: f}
	for i := range 2 {
		var addrs []uint64
		for j := range per {
			a := umem.FrameAddr(i*per + j)
			copy(umem.Bytes(a, uint32(len(f))), f)
			addrs = append(addrs, a)
		}
		s.addrs = append(s.addrs, addrs)
	}
	return s, nil
}

// close frees the source's sockets and UMEM; Linux frees them even when
// close or munmap reports an error, and nothing is written through them.
func (s *source) close() {
	for _, k := range s.socks {
		_ = k.Close()
	}
	_ = s.umem.Close()
}
