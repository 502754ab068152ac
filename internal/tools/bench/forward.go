package bench

// What a user plane does beyond receiving, on the same veth pair: it
// forwards (each frame back out of its queue, MACs swapped), it
// transmits, and it answers, judged by how long a frame takes there and
// back. Each table sets xdpq's pods beside DPDK's af_xdp PMD in testpmd
// and beside XDP_TX, which needs no socket at all.
//
// On veth the work of a frame's receive side runs on the core that sent
// it: the sender's core runs A's XDP program (and copies into the
// forwarder's socket), and the forwarder's core, as it transmits, runs
// B's. Both cores' busy nanoseconds per frame are in the table.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/perf"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// counter is an XDP program on a netdev that drops every frame and
// counts it (the kernel's run count of the program).
type counter struct {
	prog  *ebpf.Program
	stats io.Closer
	ns    string
	index int
}

// startCounter attaches a counting XDP_DROP program to the netdev ifindex
// of namespace ns (native mode).
func startCounter(ns string, ifindex int) (*counter, error) {
	return attachCounting(ns, ifindex, "bench_drop", asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()})
}

// startReflector attaches to A an XDP program that swaps each frame's
// MAC addresses and sends it back out (XDP_TX): a forwarder with no
// socket, the floor of the latency and the ceiling of the forwarding.
func startReflector(ns string, ifindex int) (*counter, error) {
	const pass = "pass"
	return attachCounting(ns, ifindex, "bench_reflect", asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // data
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // data_end
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 12),
		asm.JGT.Reg(asm.R4, asm.R3, pass),
		asm.LoadMem(asm.R4, asm.R2, 0, asm.Word), // destination
		asm.LoadMem(asm.R5, asm.R2, 4, asm.Half),
		asm.LoadMem(asm.R6, asm.R2, 6, asm.Word), // source
		asm.LoadMem(asm.R7, asm.R2, 10, asm.Half),
		asm.StoreMem(asm.R2, 0, asm.R6, asm.Word),
		asm.StoreMem(asm.R2, 4, asm.R7, asm.Half),
		asm.StoreMem(asm.R2, 6, asm.R4, asm.Word),
		asm.StoreMem(asm.R2, 10, asm.R5, asm.Half),
		asm.Mov.Imm(asm.R0, 3), // XDP_TX
		asm.Return(),
		asm.Mov.Imm(asm.R0, 2).WithSymbol(pass), // XDP_PASS
		asm.Return(),
	})
}

func attachCounting(ns string, ifindex int, name string, insns asm.Instructions) (*counter, error) {
	// With frags (BPF_F_XDP_HAS_FRAGS), as xdpq's programs: veth takes no
	// other natively at a jumbo MTU.
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: name, Type: ebpf.XDP, License: "MIT", Flags: unix.BPF_F_XDP_HAS_FRAGS, Instructions: insns})
	if err != nil {
		return nil, err
	}
	// The kernel counts program runs only while someone holds stats enabled.
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		_ = prog.Close() // never attached
		return nil, fmt.Errorf("enable bpf stats: %w", err)
	}
	if _, err := xdp.Attach(ns, ifindex, prog, xdp.ModeNative); err != nil {
		return nil, errors.Join(err, stats.Close(), prog.Close())
	}
	return &counter{prog: prog, stats: stats, ns: ns, index: ifindex}, nil
}

// count is how many frames the program has run on.
func (c *counter) count() (uint64, error) {
	st, err := c.prog.Stats()
	if err != nil {
		return 0, err
	}
	return st.RunCount, nil
}

func (c *counter) close() error {
	return errors.Join(xdp.Detach(c.ns, c.index, xdp.ModeNative, c.prog), c.stats.Close(), c.prog.Close())
}

// fwdResult is one forwarder's measurements, one per round.
type fwdResult struct {
	Name   string
	Queues int
	Spins  bool
	// Back is the frames per second that came back to B; Sent what the
	// sender sent; Fwd what the forwarder says it transmitted.
	Back, Sent, Fwd []float64
	// SenderNS and FwdCoreNS are the two cores' busy ns per frame that
	// came back; FwdCPUNS is the forwarder's own CPU time per frame
	// (nil for XDP_TX, which runs in softirqs).
	SenderNS, FwdCoreNS, FwdCPUNS []float64
	// User, System and Softirq split FwdCoreNS: user space, the kernel
	// for a task (the forwarder's syscalls), softirqs (veth's NAPI).
	User, System, Softirq []float64
	// Lost is, per round, frames sent and not back; Drops what the
	// forwarder's sockets dropped (the pods: the daemon's metrics; DPDK:
	// testpmd's RX-dropped as RXDropped); nil where not read.
	Lost  []uint64
	Drops []Drops
}

// forwarders are the forwarding rows at n queues: the reflector, DPDK,
// and the pods.
func (pd *podDaemon) forwarders(cfg Config, n int) []receiver {
	rs := []receiver{{name: "XDP_TX reflector (no socket)", queues: n, start: startCounting(startReflector)}}
	if cfg.Testpmd != "" {
		rs = append(rs, receiver{name: "DPDK af_xdp PMD macswap", queues: n, spins: true, start: startTestpmd(cfg, "macswap", n)})
	}
	if pd == nil {
		return rs
	}
	for _, k := range pd.fwdKinds(cfg, false) {
		rs = append(rs, receiver{name: k.name, queues: n, pod: true, start: pd.startPod(k, n, cfg)})
	}
	return rs
}

// fwdKinds are the pod forwarders: xdpqperf l2fwd (busy polling too,
// with busyPoll) and the C client's xdpq-l2fwd.
func (pd *podDaemon) fwdKinds(cfg Config, busyPoll bool) []podKind {
	var ks []podKind
	if cfg.Pods.Perf != "" {
		args := []string{"-mode", "l2fwd"}
		if cfg.Jumbo() {
			args = append(args, "-multi-buffer")
		}
		perf := func(p Pods) (string, []string) { return p.Perf, args }
		ks = append(ks, podKind{name: "pod: xdpqperf l2fwd", tx: true, command: perf, ready: "xdpqperf l2fwd: allocation", received: perfSent})
		if busyPoll {
			ks = append(ks, podKind{name: "pod: xdpqperf l2fwd, busyPoll", tx: true, busyPoll: true, command: perf, ready: "xdpqperf l2fwd: allocation", received: perfSent})
		}
	}
	if cfg.Pods.CL2fwd != "" && !cfg.Jumbo() {
		ks = append(ks, podKind{name: "pod: C xdpq-l2fwd", tx: true, command: func(p Pods) (string, []string) { return p.CL2fwd, nil },
			ready: ": forwarding (", received: cForwarded})
	}
	return ks
}

// perfSent adds up the frames xdpqperf transmitted on all its queues.
func perfSent(out string) (uint64, error) {
	t, ok := perf.ParseTotals(out)
	if !ok {
		return 0, errors.New("xdpqperf printed no total")
	}
	var n uint64
	for _, tx := range t.TX {
		n += tx
	}
	return n, nil
}

// cForwarded reads xdpq-l2fwd's "total: N frames forwarded, ..." line.
func cForwarded(out string) (uint64, error) {
	for line := range strings.Lines(out) {
		var n uint64
		if _, err := fmt.Sscanf(line, "total: %d frames forwarded", &n); err == nil {
			return n, nil
		}
	}
	return 0, errors.New("xdpq-l2fwd printed no total")
}

// measureForward runs the sender on queues 0..r.queues-1 of B through
// forwarder r on A, counting on B what comes back.
func measureForward(p *testnet.Pair, r receiver, snd *sender, cfg Config) (fwdMeasure, error) {
	var m fwdMeasure
	back, err := startCounter(p.NSPath(), p.B.Index)
	if err != nil {
		return m, err
	}
	run, err := r.start(p)
	if err != nil {
		return m, errors.Join(err, back.close())
	}
	var cpu0, cpu1 time.Duration
	var errs []error
	if run.cpu != nil {
		cpu0, err = run.cpu()
		errs = append(errs, err)
	}
	s0, err0 := cpuBusy(cfg.SenderCPU)
	f0, err1 := readCPUTimes(cfg.RxCPU)
	b0, err2 := back.count()
	start := time.Now()
	sent, err3 := snd.run(cfg.Duration, r.queues)
	elapsed := time.Since(start)
	s1, err4 := cpuBusy(cfg.SenderCPU)
	f1, err5 := readCPUTimes(cfg.RxCPU)
	b1, err6 := back.count()
	if run.cpu != nil {
		cpu1, err = run.cpu()
		errs = append(errs, err)
	}
	time.Sleep(100 * time.Millisecond) // let the forwarder drain its rings
	out, err7 := run.finish()
	b2, err8 := back.count()
	errs = append(errs, err0, err1, err2, err3, err4, err5, err6, err7, err8, back.close())
	if err := errors.Join(errs...); err != nil {
		return m, err
	}
	secs := elapsed.Seconds()
	n := float64(max(b1-b0, 1))
	f := f1.sub(f0)
	m = fwdMeasure{back: float64(b1-b0) / secs, sent: float64(sent) / secs, fwd: float64(out.received) / secs,
		senderNS: float64(s1-s0) / n, fwdCoreNS: float64(f.busy) / n, drops: out.drops,
		split: [3]float64{float64(f.user) / n, float64(f.system) / n, float64(f.softirq) / n}}
	if sent > b2-b0 {
		m.lost = sent - (b2 - b0)
	}
	if run.cpu != nil {
		ns := float64(cpu1-cpu0) / n
		m.cpu = &ns
	}
	return m, nil
}

type fwdMeasure struct {
	back, sent, fwd     float64
	senderNS, fwdCoreNS float64
	split               [3]float64 // the forwarder core's ns per frame in user space, the kernel for a task, softirqs
	cpu                 *float64
	lost                uint64
	drops               *Drops
}

// runForward measures the forwarders at 1 queue and at the most queues
// the pods have, the rows interleaved round by round, and prints their
// table.
func runForward(p *testnet.Pair, pd *podDaemon, snd *sender, cfg Config, place func(pod bool) error) ([]*fwdResult, error) {
	var rows []receiver
	for _, n := range slices.Compact([]int{1, snd.queues()}) {
		rows = append(rows, pd.forwarders(cfg, n)...)
	}
	results := make([]*fwdResult, len(rows))
	for i, r := range rows {
		results[i] = &fwdResult{Name: r.name, Queues: r.queues, Spins: r.spins}
	}
	fmt.Fprintf(cfg.Out, "\nforwarding: the sender floods B's queues 0..N-1 as above; the forwarder on A sends each frame back out of its queue, MACs swapped (XDP_TX; testpmd --forward-mode=macswap on one lcore; the pods from a pool with allowTX); an XDP program on B counts what comes back\n")
	for round := range cfg.Rounds {
		for i, r := range rows {
			if err := place(r.pod); err != nil {
				return nil, err
			}
			m, err := measureForward(p, r, snd, cfg)
			if err != nil {
				return nil, fmt.Errorf("forwarding: %s, %d queues, round %d: %w", r.name, r.queues, round+1, err)
			}
			res := results[i]
			res.Back, res.Sent, res.Fwd = append(res.Back, m.back), append(res.Sent, m.sent), append(res.Fwd, m.fwd)
			res.SenderNS, res.FwdCoreNS = append(res.SenderNS, m.senderNS), append(res.FwdCoreNS, m.fwdCoreNS)
			res.User, res.System, res.Softirq = append(res.User, m.split[0]), append(res.System, m.split[1]), append(res.Softirq, m.split[2])
			res.Lost = append(res.Lost, m.lost)
			cpu := "-"
			if m.cpu != nil {
				res.FwdCPUNS = append(res.FwdCPUNS, *m.cpu)
				cpu = fmt.Sprintf("%.0f", *m.cpu)
			}
			if m.drops != nil {
				res.Drops = append(res.Drops, *m.drops)
			}
			fmt.Fprintf(cfg.Out, "  round %d  %-34s q%d %8.3f Mpps back, %8.3f Mpps sent, %d lost, sender core %5.0f ns/frame, forwarder core %5.0f, forwarder %s\n",
				round+1, r.name, r.queues, m.back/1e6, m.sent/1e6, m.lost, m.senderNS, m.fwdCoreNS, cpu)
		}
	}
	printForward(cfg.Out, results, cfg.FrameSize)
	return results, nil
}

func printForward(w io.Writer, rs []*fwdResult, frameSize int) {
	fmt.Fprintf(w, "\nforwarding, %d-byte frames, medians of the rounds: back is what came back to B; lost is sent less back over a run, and the forwarder's sockets' drops are its share: "+
		"rx ring full, fill ring empty, and dropped (the kernel's rx_dropped, fill ring empty among them; DPDK: testpmd's RX-dropped); ns are per frame back: both cores busy (/proc/stat), split for the forwarder's core, and the forwarder's own CPU time\n", frameSize)
	fmt.Fprintf(w, "%-34s %2s %9s %9s %9s %10s %10s %10s %10s %10s %15s %10s %10s\n",
		"forwarder (median)", "q", "back Mpps", "sent Mpps", "lost", "rx ring", "fill ring", "dropped", "sender", "fwd core", "fwd core", "forwarder", "vs DPDK")
	fmt.Fprintf(w, "%-34s %2s %9s %9s %9s %10s %10s %10s %10s %10s %15s %10s %10s\n",
		"", "", "", "", "", "full", "empty", "rx", "ns/frame", "ns/frame", "usr/sys/softirq", "CPU ns", "rate, CPU")
	for _, r := range rs {
		var dpdk *fwdResult
		for _, d := range rs {
			if strings.HasPrefix(d.Name, "DPDK") && d.Queues == r.Queues {
				dpdk = d
			}
		}
		cpu, vs := "-", "-"
		if r.FwdCPUNS != nil {
			cpu = fmt.Sprintf("%.0f", Median(r.FwdCPUNS))
		}
		if dpdk != nil && dpdk != r {
			vs = fmt.Sprintf("%.2f", Ratio(r.Back, dpdk.Back))
			if r.FwdCPUNS != nil {
				vs += fmt.Sprintf(", %.2f", Ratio(r.FwdCPUNS, dpdk.FwdCPUNS))
			}
		}
		full, empty, other := "-", "-", "-"
		if r.Drops != nil {
			full, empty, other = medianDrop(r.Drops, func(d Drops) uint64 { return d.RingFull }),
				medianDrop(r.Drops, func(d Drops) uint64 { return d.FillEmpty }),
				medianDrop(r.Drops, func(d Drops) uint64 { return d.RXDropped })
		}
		lost := make([]float64, len(r.Lost))
		for i, l := range r.Lost {
			lost[i] = float64(l)
		}
		split := fmt.Sprintf("%.0f/%.0f/%.0f", Median(r.User), Median(r.System), Median(r.Softirq))
		fmt.Fprintf(w, "%-34s %2d %9.3f %9.3f %9.0f %10s %10s %10s %10.0f %10.0f %15s %10s %10s\n", r.Name, r.Queues,
			Median(r.Back)/1e6, Median(r.Sent)/1e6, Median(lost), full, empty, other, Median(r.SenderNS), Median(r.FwdCoreNS), split, cpu, vs)
	}
	fmt.Fprintln(w, "(vs DPDK: the rate back, and the forwarder's own CPU per frame, each the median of the rounds' ratios to DPDK's row at the same queue count; DPDK spins, its CPU is all of the run's)")
}

// The latency frames' payload: a sequence number and the send time, in
// nanoseconds since the echo started, after the UDP header.
const (
	echoSeq  = 42
	echoTime = 50
)

// echo sends timestamped frames from B's queue 0 at a rate, and takes
// back what the reflector on A returns, on any of B's queues (xdpq's
// direct program on B steers each to its socket): a socket's answer
// comes back on its queue, XDP_TX's on the queue of the core that ran it
// (veth picks the peer's queue so).
type echo struct {
	prog   *xdp.Program
	umem   *xsk.UMEM
	socks  []*xsk.Socket // on B's queues 0, 1, ...; the first sends
	free   []uint64      // TX frames not in flight
	frame  []byte
	cpu    int
	remove func() error
}

// echoRing is the entries of each of the echo's rings: 11 ms at 372,000
// frames a second, longer than the echo loop's own stalls on this VM.
const echoRing = 4096

func newEcho(p *testnet.Pair, cfg Config) (*echo, error) {
	prog, err := xdp.Load(xdp.Direct, xdp.LoadOptions{Queues: p.B.Queues()})
	if err != nil {
		return nil, err
	}
	dev := xsk.Netdev{Name: p.B.Name, Ifindex: p.B.Index, NetNS: p.NSPath()}
	qs := make([]uint32, p.B.Queues())
	for i := range qs {
		qs[i] = uint32(i)
	}
	// A ring's worth of frames to fill each socket's fill ring, and one
	// more to send from.
	umem, socks, err := xsk.Open(dev, qs, (len(qs)+1)*echoRing, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048},
		Rings: xsk.Rings{Fill: echoRing, Completion: echoRing, RX: echoRing, TX: echoRing}})
	if err != nil {
		return nil, errors.Join(err, prog.Close())
	}
	e := &echo{prog: prog, umem: umem, socks: socks, cpu: cfg.SenderCPU}
	closeAll := func() error {
		var errs []error
		for _, k := range socks {
			errs = append(errs, k.Close())
		}
		return errors.Join(append(errs, umem.Close(), prog.Close())...)
	}
	e.remove = closeAll
	for i, k := range socks {
		fill := make([]uint64, echoRing)
		for j := range fill {
			fill[j] = umem.FrameAddr(i*echoRing + j)
		}
		k.Fill(fill)
		if err := prog.SetSocket(qs[i], k.FD()); err != nil {
			return nil, errors.Join(err, e.remove())
		}
	}
	for j := range echoRing {
		e.free = append(e.free, umem.FrameAddr(len(qs)*echoRing+j))
	}
	if _, err := xdp.Attach(p.NSPath(), p.B.Index, prog.Prog(), xdp.ModeNative); err != nil {
		return nil, errors.Join(err, e.remove())
	}
	e.remove = func() error {
		return errors.Join(xdp.Detach(p.NSPath(), p.B.Index, xdp.ModeNative, prog.Prog()), closeAll())
	}
	e.frame, err = frame.Spec{SrcMAC: p.B.MAC, DstMAC: p.A.MAC, Src: p.B.Addr, Dst: p.A.Addr, Protocol: 17,
		SrcPort: 4000, DstPort: 5000, Payload: frame.Payload(0, 0, cfg.FrameSize-42)}.Build()
	if err != nil {
		return nil, errors.Join(err, e.remove())
	}
	return e, nil
}

func (e *echo) close() error { return e.remove() }

// echoRun is what one echo run measured.
type echoRun struct {
	sent, back uint64
	rtts       []time.Duration // of the frames back, in the order they came
	// away is the longest the echo's own loop went between two looks at
	// its rings: a round trip can read no shorter than the stall of the
	// loop that timed it.
	away time.Duration
	// dropped is what the kernel dropped for the echo's own sockets (its
	// rings full or its fill ring empty): frames the reflector answered.
	dropped uint64
}

// drops sums the kernel's drop counters of the echo's sockets.
func (e *echo) drops() (uint64, error) {
	var n uint64
	for _, k := range e.socks {
		st, err := k.Statistics()
		if err != nil {
			return 0, err
		}
		n += st.RXDropped + st.RXRingFull
	}
	return n, nil
}

// run sends rate frames a second for d, on time (a frame late is sent at
// once, not skipped), from a thread pinned to the sender's core that
// spins on the rings, and waits up to a second after for the last ones. The Go
// collector is off meanwhile: its workers would share the core.
func (e *echo) run(rate float64, d time.Duration) (echoRun, error) {
	var r echoRun
	var err error
	done := make(chan struct{})
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	d0, err0 := e.drops()
	go func() {
		defer close(done)
		unpin, perr := pin(e.cpu)
		if err = perr; err != nil {
			return
		}
		defer unpin()
		r, err = e.loop(rate, d)
	}()
	<-done
	d1, err1 := e.drops()
	r.dropped = d1 - d0
	return r, errors.Join(err, err0, err1)
}

func (e *echo) loop(rate float64, d time.Duration) (echoRun, error) {
	r := echoRun{rtts: make([]time.Duration, 0, int(rate*d.Seconds())+1)}
	interval := time.Duration(float64(time.Second) / rate)
	base := time.Now()
	// After the last send, the loop waits for the answers until all
	// are back, or for a second: a reflector stalled at the end (a
	// hundred milliseconds on a loaded machine) still answers.
	next, stop, drain := time.Duration(0), d, d+time.Second
	rx := make([]xsk.Desc, 64)
	comp := make([]uint64, 64)
	tx := make([]xsk.Desc, 0, 64)
	refill := make([][]uint64, len(e.socks)) // frames received that the fill ring has not taken yet
	out := e.socks[0]
	last := time.Duration(0)
	for {
		now := time.Since(base)
		if now >= drain || (now >= stop && r.back >= r.sent) {
			break
		}
		if now < stop {
			r.away = max(r.away, now-last)
		}
		last = now
		if n := out.Complete(comp); n > 0 {
			e.free = append(e.free, comp[:n]...)
		}
		tx = tx[:0]
		for now < stop && next <= now && len(e.free) > 0 && len(tx) < cap(tx) {
			a := e.free[len(e.free)-1]
			e.free = e.free[:len(e.free)-1]
			b := e.umem.Bytes(a, uint32(len(e.frame)))
			copy(b, e.frame)
			binary.LittleEndian.PutUint64(b[echoSeq:], r.sent)
			binary.LittleEndian.PutUint64(b[echoTime:], uint64(time.Since(base)))
			tx = append(tx, xsk.Desc{Addr: a, Len: uint32(len(e.frame))})
			r.sent++
			next += interval
		}
		if len(tx) > 0 {
			if n, err := out.Transmit(tx); err != nil || n != len(tx) {
				return r, fmt.Errorf("echo: the TX ring took %d of %d: %v", n, len(tx), err)
			}
		}
		if out.TXPending() > 0 {
			if err := out.Kick(); err != nil {
				return r, err
			}
		}
		for i, k := range e.socks {
			if len(refill[i]) > 0 {
				n := k.Fill(refill[i])
				refill[i] = refill[i][:copy(refill[i], refill[i][n:])]
			}
			n := k.Receive(rx)
			if n == 0 {
				continue
			}
			at := time.Since(base)
			for _, d := range rx[:n] {
				b := e.umem.Bytes(d.Addr, d.Len)
				if len(b) >= echoTime+8 {
					r.rtts = append(r.rtts, at-time.Duration(binary.LittleEndian.Uint64(b[echoTime:])))
				}
				refill[i] = append(refill[i], d.Addr&^uint64(2047))
			}
			r.back += uint64(n)
		}
	}
	return r, nil
}

// latResult is one reflector's latency at one rate: per round, the
// percentiles of its round trips.
type latResult struct {
	Name                string
	Rate                float64
	P50, P99, P999, Max []time.Duration
	Sent, Back          []uint64
	Away                []time.Duration // the echo loop's longest stall
	EchoDropped         []uint64        // of Sent less Back, what the echo's own sockets dropped
	CPU                 []float64       // the reflector's own CPU, cores busy; nil for XDP_TX
	Softirqd            []float64       // ksoftirqd of the reflector's core, cores busy
}

// runLatency measures each reflector's round trips at each rate.
func runLatency(p *testnet.Pair, pd *podDaemon, cfg Config, rates []float64, place func(pod bool) error) ([]*latResult, error) {
	e, err := newEcho(p, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { _ = e.close() }() // the measurements are taken; what is left is the namespace's, removed with it
	rows := []receiver{{name: "XDP_TX reflector (no socket)", queues: 1, start: startCounting(startReflector)}}
	if cfg.Testpmd != "" {
		rows = append(rows, receiver{name: "DPDK af_xdp PMD macswap", queues: 1, spins: true, start: startTestpmd(cfg, "macswap", 1)})
	}
	if pd != nil {
		for _, k := range pd.fwdKinds(cfg, true) {
			rows = append(rows, receiver{name: k.name, queues: 1, pod: true, start: pd.startPod(k, 1, cfg)})
		}
	}
	// The reflector's core's ksoftirqd: softirqs the kernel could not
	// run on the way out of an interrupt or a syscall wait there for it,
	// a task like the others.
	softirqd, err := kthread(fmt.Sprintf("ksoftirqd/%d", cfg.RxCPU))
	if err != nil {
		return nil, err
	}
	var results []*latResult
	for _, rate := range rates {
		for _, r := range rows {
			results = append(results, &latResult{Name: r.name, Rate: rate})
		}
	}
	fmt.Fprintf(cfg.Out, "\nlatency: B's queue 0 sends timestamped frames at a steady rate from the sender's core, which spins on its rings; the reflector on A answers each (MACs swapped) out of its queue 0; the round trip is the time back less the time in the frame\n")
	for round := range cfg.Rounds {
		for i, rate := range rates {
			for j, r := range rows {
				if err := place(r.pod); err != nil {
					return nil, err
				}
				run, err := r.start(p)
				if err != nil {
					return nil, fmt.Errorf("latency: %s: %w", r.name, err)
				}
				var cpu0, cpu1 time.Duration
				var errCPU0, errCPU1 error
				if run.cpu != nil {
					cpu0, errCPU0 = run.cpu()
				}
				soft0, errSoft0 := schedstat(softirqd, onCPU)
				start := time.Now()
				m, err := e.run(rate, cfg.Duration)
				wall := time.Since(start)
				soft1, errSoft1 := schedstat(softirqd, onCPU)
				if run.cpu != nil {
					cpu1, errCPU1 = run.cpu()
				}
				_, errFinish := run.finish()
				if err := errors.Join(err, errCPU0, errCPU1, errFinish, errSoft0, errSoft1); err != nil {
					return nil, fmt.Errorf("latency: %s at %.0f/s, round %d: %w", r.name, rate, round+1, err)
				}
				res := results[i*len(rows)+j]
				p50, p99, p999, mx := percentiles(m.rtts)
				res.P50, res.P99, res.P999, res.Max = append(res.P50, p50), append(res.P99, p99), append(res.P999, p999), append(res.Max, mx)
				res.Sent, res.Back, res.Away = append(res.Sent, m.sent), append(res.Back, m.back), append(res.Away, m.away)
				res.Softirqd = append(res.Softirqd, float64(soft1-soft0)/float64(wall))
				res.EchoDropped = append(res.EchoDropped, m.dropped)
				cpu := "-"
				if run.cpu != nil {
					res.CPU = append(res.CPU, float64(cpu1-cpu0)/float64(wall))
					cpu = fmt.Sprintf("%.0f%%", 100*float64(cpu1-cpu0)/float64(wall))
				}
				fmt.Fprintf(cfg.Out, "  round %d  %-34s %8.0f/s  sent %d back %d (echo dropped %d)  p50 %v p99 %v p99.9 %v max %v, echo away %v, reflector CPU %s, ksoftirqd %.0f%%\n",
					round+1, r.name, rate, m.sent, m.back, m.dropped, p50, p99, p999, mx, m.away, cpu, 100*float64(soft1-soft0)/float64(wall))
			}
		}
	}
	printLatency(cfg.Out, results)
	if err := printWakeLateness(cfg.Out, cfg.RxCPU, cfg.Hog); err != nil {
		return nil, err
	}
	return results, nil
}

// percentiles returns the 50th, 99th and 99.9th percentiles of v and its
// largest (nearest rank); zeros when v is empty.
func percentiles(v []time.Duration) (p50, p99, p999, mx time.Duration) {
	if len(v) == 0 {
		return
	}
	s := slices.Clone(v)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return at(0.50), at(0.99), at(0.999), s[len(s)-1]
}

func medianDuration(v []time.Duration) time.Duration {
	f := make([]float64, len(v))
	for i, d := range v {
		f[i] = float64(d)
	}
	return time.Duration(Median(f))
}

func printLatency(w io.Writer, rs []*latResult) {
	fmt.Fprintf(w, "\nlatency, round trip in µs, medians of the rounds' percentiles (max: the largest of any round); lost: sent less back, the rounds summed, and of that what the kernel dropped at the echo's own sockets\n")
	fmt.Fprintf(w, "%-34s %10s %9s %9s %9s %9s %9s %9s %10s %12s %10s\n", "reflector", "frames/s", "p50", "p99", "p99.9", "max", "lost", "of which", "echo away", "reflector", "ksoftirqd")
	fmt.Fprintf(w, "%-34s %10s %9s %9s %9s %9s %9s %9s %10s %12s %10s\n", "", "", "", "", "", "", "", "at echo", "max µs", "CPU, cores", "cores")
	us := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e3) }
	for _, r := range rs {
		var lost, echoLost uint64
		for i := range r.Sent {
			if r.Sent[i] > r.Back[i] {
				lost += r.Sent[i] - r.Back[i]
			}
			echoLost += r.EchoDropped[i]
		}
		cpu := "-"
		if r.CPU != nil {
			cpu = fmt.Sprintf("%.2f", Median(r.CPU))
		}
		fmt.Fprintf(w, "%-34s %10.0f %9s %9s %9s %9s %9d %9d %10s %12s %10.2f\n", r.Name, r.Rate, us(medianDuration(r.P50)), us(medianDuration(r.P99)),
			us(medianDuration(r.P999)), us(slices.Max(r.Max)), lost, echoLost, us(slices.Max(r.Away)), cpu, Median(r.Softirqd))
	}
	for _, def := range rs {
		for _, busy := range rs {
			if busy.Rate == def.Rate && busy.Name == def.Name+", busyPoll" {
				fmt.Fprintf(w, "(busyPoll on veth at %.0f/s: p50 %s µs against the default's %s, on %.2f cores against %.2f. veth has no interrupt for preferred busy polling to defer: "+
					"the sender's transmit still schedules the queue's NAPI from its own core while the pod polls it from its own (the receive table's busyPoll rows measure the sender's cost per frame rising); measure busy polling on a NIC)\n",
					def.Rate, us(medianDuration(busy.P50)), us(medianDuration(def.P50)), Median(busy.CPU), Median(def.CPU))
			}
		}
	}
	fmt.Fprintln(w, "(echo away: the longest the timing loop itself was off its rings, the worst round: a tail no shorter than it may be the sender's core, not the reflector; "+
		"ksoftirqd: the reflector core's softirq thread, busy: softirqs (veth's NAPI of the answers on their way to B) deferred to a task that waits its turn on that core)")
}

// kthread returns the schedstat path of the kernel thread named name.
func kthread(name string) (string, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*/comm")
	if err != nil {
		return "", err
	}
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err == nil && strings.TrimSpace(string(b)) == name {
			return filepath.Join(filepath.Dir(f), "schedstat"), nil
		}
	}
	return "", fmt.Errorf("no kernel thread %s", name)
}

// wakeLateness measures how late a thread on cpu wakes from a 50 µs
// sleep (clock_nanosleep, the pods' nap), n times: the percentiles of
// the time past 50 µs. A core with nothing else to run halts; on a VM
// the hypervisor then decides when the vCPU runs again.
func wakeLateness(cpu, n int) (p50, p99, p999 time.Duration, err error) {
	var late []time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		unpin, perr := pin(cpu)
		if err = perr; err != nil {
			return
		}
		defer unpin()
		ts := unix.NsecToTimespec(int64(50 * time.Microsecond))
		late = make([]time.Duration, 0, n)
		for range n {
			t0 := time.Now()
			// EINTR only shortens a sleep, which reads as early, not late.
			_ = unix.Nanosleep(&ts, nil)
			late = append(late, time.Since(t0)-50*time.Microsecond)
		}
	}()
	<-done
	p50, p99, p999, _ = percentiles(late)
	return p50, p99, p999, err
}

// printWakeLateness prints wakeLateness on cpu as it is, and beside a
// busy loop (a nice 19 one, which the sleeper preempts as it wakes) that
// keeps the core from halting.
func printWakeLateness(w io.Writer, cpu int, hog bool) error {
	const n = 20000
	a50, a99, a999, err := wakeLateness(cpu, n)
	if err != nil {
		return err
	}
	state := "idle but for it"
	if hog {
		state = "with the run's CPU hog on it"
	}
	fmt.Fprintf(w, "a 50 µs sleep on cpu %d (the reflectors'), %d times, %s: late by p50 %.1f µs, p99 %.1f, p99.9 %.1f", cpu, n, state,
		float64(a50)/1e3, float64(a99)/1e3, float64(a999)/1e3)
	if hog {
		fmt.Fprintln(w)
		return nil
	}
	cmd := exec.Command("nice", "-n", "19", "sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("busy loop: %w", err)
	}
	defer func() {
		_ = cmd.Process.Kill() // a busy loop: killing it loses nothing
		_ = cmd.Wait()
	}()
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(cmd.Process.Pid, &set); err != nil {
		return fmt.Errorf("busy loop on cpu %d: %w", cpu, err)
	}
	b50, b99, b999, err := wakeLateness(cpu, n)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "; beside a busy loop at nice 19, which keeps the core from halting: p50 %.1f, p99 %.1f, p99.9 %.1f\n",
		float64(b50)/1e3, float64(b99)/1e3, float64(b999)/1e3)
	return nil
}
