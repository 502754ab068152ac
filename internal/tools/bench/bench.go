// Package bench measures receive rates on one veth pair, side by side in
// one run: an AF_XDP sender on B, pinned to one core, and on A in turn
// (a) an XDP_DROP program, the ceiling; (b) xdpq's direct program into a
// pkg/xsk rxdrop loop that spins; (c) xdpq's filter program into the same
// loop; (d) DPDK's af_xdp PMD in testpmd's rxonly mode, the C reference
// (it spins too). Then what a pod gets: the xdpq daemon (pkg/daemon,
// standalone, in this process) with a pool of A's queues (steering
// hardware: the direct program, as auto gives on a NIC with ntuple
// filters), an allocation for uid 65534, and a separate process as uid
// 65534 with no capabilities, pinned to the receive core, that takes its
// sockets from the broker with pkg/client's defaults: (e) `xdpqperf -mode
// rxdrop`, the pool's default settings; (f) the same with the pool's
// preferred busy polling (busyPoll); (g) the C client's example
// xdpq-rxdrop (clients/c). Rows (a) to (d) use queue 0; (e) to (g) run
// with 1, 2 and 4 queues, the one sender core sending round-robin on B's
// queues 0..N-1 (in native mode veth delivers B's tx queue k to A's rx
// queue k).
//
// On veth the receive-side XDP work runs in the sender's softirq, so the
// sender's core bounds every receiver but a busy-polling one ((f) runs the
// queue's NAPI on its own core): the table gives that core's busy
// nanoseconds per packet sent, from /proc/stat. It gives the receiver's own
// CPU time per packet received over the sender's run (the bench's loop
// thread's schedstat for (b) and (c), testpmd's threads' for (d), the pod
// process's CPU clock, its ended threads included, for (e) to (g)), and the kernel's drop counters (XDP_STATISTICS) of the
// receiver's sockets: for the pods, as the daemon's metrics report them.
//
// Then, in the same run, what a user plane does beyond receiving
// (forward.go, transmit.go): forwarding (each frame back out of its
// queue, MACs swapped) through XDP_TX, DPDK's macswap and the pods'
// forwarders, counted on B; transmitting (DPDK's txonly, xdpqperf
// txpush); and round trips of timestamped frames through each of them.
package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xdpq/xdpq/internal/testing/syncbuf"
	"github.com/xdpq/xdpq/internal/traffic"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// Config is what the bench command's flags set.
type Config struct {
	Duration  time.Duration // sending time per measurement
	Rounds    int           // each receiver is measured this many times, interleaved
	FrameSize int           // bytes per frame on the wire (without FCS); above 1514, jumbo (see Jumbo)
	TXBatch   int           // descriptors per TX ring submission
	SenderCPU int
	RxCPU     int
	Testpmd   string // path of dpdk-testpmd; empty to skip (d)
	// Pods are the pod programs of (e) to (g); an empty path skips its rows.
	Pods Pods
	// PodQueues are the queue counts of each pod row; nil means 1, 2 and 4.
	PodQueues []int
	// PodRings are the ring sizes the pod rows (e) to (g) ask for, a row
	// each; nil means the clients' defaults alone.
	PodRings []uint32
	// Hog runs a busy loop on the receivers' core through the whole run:
	// a neighbour that takes its share of the pods' core, late wake-ups
	// included.
	Hog bool
	Out io.Writer
	// Forward, Transmit and Latency add their tables after the receive
	// table (forward.go, transmit.go); SkipReceive leaves that one out.
	Forward, Transmit, Latency, SkipReceive bool
	// Stop, when closed, ends the run before its next measurement: Run
	// removes what it made (the namespace and its veth pair, the daemon,
	// the pods) and returns ErrInterrupted. Nil runs to the end.
	Stop <-chan struct{}
}

// ErrInterrupted is Run's error when Config.Stop ended it.
var ErrInterrupted = errors.New("interrupted: the table was not finished")

// Jumbo reports whether the frames are jumbo frames: the veth pair's MTU
// is raised to fit them, every socket is bound with multi-buffer (a frame
// comes in several descriptors when it does not fit a UMEM frame), the
// pods ask for multi-buffer sockets ((g) with xdpq-rxdrop -m), and the
// receiver that cannot take a frame in several buffers ((d) DPDK 22.11's
// PMD) is left out.
func (c Config) Jumbo() bool { return c.FrameSize > 1514 }

// Result is one receiver's measurements.
type Result struct {
	Name     string
	Queues   int
	Rates    []float64 // received packets per second, one per round
	SentPPS  []float64
	SenderNS []float64 // sender core busy ns per packet sent
	// RxCPUNS is the receiver's own CPU ns per packet received, one per
	// round; nil where it has no CPU time of its own (XDP_DROP).
	RxCPUNS []float64
	Spins   bool   // the receiver spins: its CPU time is all of the run's
	Ring    uint32 // the ring size a pod row asked for, when the run compares them (-pod-ring); 0 otherwise
	// Drops are its sockets' drop counters, one per round; nil where it
	// has none that the bench reads (XDP_DROP, DPDK).
	Drops []Drops
	// Away is, per round, the longest a receive loop of the pod left its
	// RX ring while frames came (client.Receiver.LongestAway), or the
	// spinning loop of (b) and (c) between two looks; nil where the
	// receiver does not say.
	Away []time.Duration
	// Waited is, per round, how long the receive loop's threads waited
	// for their core, runnable (schedstat): what other tasks took of it;
	// nil for XDP_DROP and DPDK.
	Waited []time.Duration
}

// Drops are the kernel's counters (XDP_STATISTICS) of a receiver's
// sockets, summed over its queues.
type Drops struct {
	RXDropped uint64 // frames dropped for another reason than a full RX ring
	RingFull  uint64 // frames dropped because the RX ring was full
	FillEmpty uint64 // times a frame came and the fill ring was empty
}

func (d *Drops) add(st xsk.Statistics) {
	d.RXDropped += st.RXDropped
	d.RingFull += st.RXRingFull
	d.FillEmpty += st.RXFillRingEmptyDescs
}

// Ratio is x over y as the table gives it: the median of the rounds'
// ratios x[i]/y[i], each round's rows measured one after the other in
// that round, so that a machine that changes speed between rounds (a VM
// whose XDP_DROP ran 1.43 Mpps in two rounds and 2.28 in the third)
// compares each row with its own round, and a receiver cannot read above
// its ceiling because its median came from a faster round than the
// ceiling's. With rounds missing on either side: the medians' ratio.
func Ratio(x, y []float64) float64 {
	if len(x) == 0 || len(x) != len(y) {
		if m := Median(y); m != 0 {
			return Median(x) / m
		}
		return 0
	}
	r := make([]float64, 0, len(x))
	for i := range x {
		if y[i] != 0 {
			r = append(r, x[i]/y[i])
		}
	}
	return Median(r)
}

// Median returns the median of v.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// A receiver is started before the sender runs on its queues (B's
// 0..queues-1) and finished after; no traffic flows outside the sender's
// run, so finish reports the frames received in it.
type receiver struct {
	name   string
	queues int
	spins  bool
	pod    bool   // a pod row: a process of its own on the receive core
	ring   uint32 // the pod rows' ring size, when the run compares them; 0 otherwise
	start  func(p *testnet.Pair) (*running, error)
}

// running is a started receiver.
type running struct {
	// cpu returns the receiver's own CPU time so far; nil where it has
	// none (XDP_DROP runs in the sender's softirq).
	cpu    func() (time.Duration, error)
	finish func() (outcome, error)
}

type outcome struct {
	received uint64
	drops    *Drops         // nil: not read
	away     *time.Duration // the receive loops' longest absence from their rings; nil: not said
	waited   *time.Duration // the receive loop's threads runnable, waiting for their core; nil: not said
}

// Run measures every receiver and prints the table to cfg.Out.
func Run(cfg Config) ([]*Result, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the benchmark needs root (network namespaces, XDP, AF_XDP)")
	}
	if runtime.NumCPU() < 2 {
		return nil, errors.New("the benchmark needs two cores: one sends, one receives")
	}
	if cfg.PodQueues == nil {
		cfg.PodQueues = []int{1, 2, 4}
	}
	queues := 1
	if cfg.Pods.Perf != "" || cfg.Pods.CRxdrop != "" {
		queues = slices.Max(cfg.PodQueues)
	}
	stopped := func() bool {
		select {
		case <-cfg.Stop:
			return true
		default:
			return false
		}
	}
	if stopped() {
		return nil, ErrInterrupted
	}
	p, err := testnet.Create(queues)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := p.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
		}
	}()
	if cfg.Jumbo() {
		if err := p.SetMTU(cfg.FrameSize - 14); err != nil {
			return nil, err
		}
		cfg.Testpmd = ""
	}

	receivers := []receiver{
		{name: "(a) XDP_DROP (ceiling)", queues: 1, start: startDrop},
		{name: "(b) direct + pkg/xsk rxdrop", queues: 1, spins: true, start: startXSK(xdp.Direct, cfg)},
		{name: "(c) filter + pkg/xsk rxdrop", queues: 1, spins: true, start: startXSK(xdp.Filter, cfg)},
	}
	if cfg.Testpmd != "" {
		receivers = append(receivers, receiver{name: "(d) DPDK af_xdp PMD rxonly", queues: 1, spins: true, start: startTestpmd(cfg, "rxonly", 1)})
	}
	if cfg.Pods.Perf != "" || cfg.Pods.CRxdrop != "" {
		// XDP_DROP on the pod rows' other queue counts: what one sender
		// core delivers to N queues when no receiver copies a frame, the
		// ceiling of the pods' N-queue rates.
		for _, n := range cfg.PodQueues {
			if n > 1 {
				receivers = append(receivers, receiver{name: "(a) XDP_DROP (ceiling)", queues: n, start: startDrop})
			}
		}
	}
	var d *podDaemon
	if cfg.Pods.Perf != "" || cfg.Pods.CRxdrop != "" {
		if d, err = startDaemon(p, queues); err != nil {
			return nil, err
		}
		defer func() {
			// The rates are measured by then: a daemon that stopped
			// badly, or directories left, are said beside them.
			if err := d.close(); err != nil {
				fmt.Fprintln(os.Stderr, "bench: xdpq daemon:", err)
			}
		}()
		receivers = append(receivers, d.receivers(cfg)...)
	}
	results := make([]*Result, len(receivers))
	for i, r := range receivers {
		results[i] = &Result{Name: r.name, Queues: r.queues, Spins: r.spins, Ring: r.ring}
	}
	snd, err := newSender(p, queues, cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		if snd != nil {
			snd.close()
		}
	}()
	var everywhere unix.CPUSet
	if err := unix.SchedGetaffinity(0, &everywhere); err != nil {
		return nil, fmt.Errorf("affinity: %w", err)
	}
	var senderOnly unix.CPUSet
	senderOnly.Set(cfg.SenderCPU)
	defer func() { _ = confine(everywhere) }() // best effort: the run's outcome is known
	if cfg.Hog {
		stop, err := startHog(cfg.RxCPU)
		if err != nil {
			return nil, err
		}
		defer stop()
		fmt.Fprintf(cfg.Out, "a CPU hog (a busy loop, nice 0) shares the receivers' cpu %d through the run\n", cfg.RxCPU)
	}
	if m, err := ReadMachine(); err != nil {
		fmt.Fprintf(cfg.Out, "machine: %v\n", err)
	} else {
		fmt.Fprintln(cfg.Out, m)
	}
	fmt.Fprintf(cfg.Out, "veth pair (%d queues) in netns %s, %d-byte frames; 1 sender core: AF_XDP sender on cpu %d (TX batch %d%s, round-robin over B's queues 0..N-1); receivers on cpu %d; %v per run, %d rounds\n",
		queues, p.NSPath(), cfg.FrameSize, cfg.SenderCPU, cfg.TXBatch, snd.budgetNote, cfg.RxCPU, cfg.Duration, cfg.Rounds)
	if cfg.Jumbo() {
		fmt.Fprintf(cfg.Out, "jumbo frames: MTU %d, every socket multi-buffer (2 KiB UMEM frames: a frame sent in %d descriptors, received in %d, a received one holding a frame less the kernel's 256-byte headroom), the pods with -multi-buffer or -m (pkg/client's and the C client's defaults then: 4 KiB frames); (d) cannot take a frame in several buffers and is left out\n",
			cfg.FrameSize-14, (cfg.FrameSize+2047)/2048, (cfg.FrameSize+1791)/1792)
	}
	if d != nil {
		fmt.Fprintf(cfg.Out, "pods (e)-(g): the xdpq daemon in this process (standalone, pool of %s#0-%d, steering hardware); each pod a process as uid %d, no capabilities, pinned to cpu %d, pkg/client's or the C client's defaults\n",
			p.A.Name, queues-1, podUID, cfg.RxCPU)
	}
	if cfg.SkipReceive {
		receivers = nil
	}
	for round := range cfg.Rounds {
		for i, r := range receivers {
			if stopped() {
				return nil, ErrInterrupted
			}
			// While a pod row runs, the bench's own threads (the daemon in
			// this process, the Go runtime's) share the sender's core, not
			// the pod's: on it they took the pod's core for milliseconds at
			// a time, a neighbour of the bench's, not the product's (-hog
			// puts one there on purpose). The in-process receivers of (b)
			// and (c) need them beside their own core.
			set := everywhere
			if r.pod {
				set = senderOnly
			}
			if err := confine(set); err != nil {
				return nil, err
			}
			m, err := measure(p, r, snd, cfg)
			if err != nil && stopped() {
				// The signal that stopped the run may have reached the
				// receiver too (a terminal's Ctrl-C reaches the group).
				return nil, ErrInterrupted
			}
			if err != nil {
				return nil, fmt.Errorf("%s, %d queues, round %d: %w", r.name, r.queues, round+1, err)
			}
			res := results[i]
			res.Rates = append(res.Rates, m.rate)
			res.SentPPS = append(res.SentPPS, m.sent)
			res.SenderNS = append(res.SenderNS, m.senderNS)
			cpu := "-"
			if m.rxCPU != nil {
				res.RxCPUNS = append(res.RxCPUNS, *m.rxCPU)
				cpu = fmt.Sprintf("%.0f", *m.rxCPU)
			}
			if m.drops != nil {
				res.Drops = append(res.Drops, *m.drops)
			}
			if m.away != nil {
				res.Away = append(res.Away, *m.away)
			}
			if m.waited != nil {
				res.Waited = append(res.Waited, *m.waited)
			}
			fmt.Fprintf(cfg.Out, "  round %d  %-34s q%d %8.3f Mpps received, %8.3f Mpps sent, sender core %6.0f ns/pkt, receiver %s ns/pkt\n",
				round+1, r.name, r.queues, m.rate/1e6, m.sent/1e6, m.senderNS, cpu)
		}
	}
	if !cfg.SkipReceive {
		printTable(cfg.Out, results, cfg.FrameSize)
	}
	// The pod rows run with the bench's own threads on the sender's
	// core, as above.
	place := func(pod bool) error {
		if stopped() {
			return ErrInterrupted
		}
		set := everywhere
		if pod {
			set = senderOnly
		}
		return confine(set)
	}
	var slowest float64 // the slowest forwarder's 1-queue rate
	if cfg.Forward {
		fwd, err := runForward(p, d, snd, cfg, place)
		if err != nil {
			return nil, err
		}
		for _, r := range fwd {
			if r.Queues == 1 && (slowest == 0 || Median(r.Back) < slowest) {
				slowest = Median(r.Back)
			}
		}
	}
	if cfg.Transmit {
		if _, err := runTX(p, d, cfg, queues, place); err != nil {
			return nil, err
		}
	}
	if cfg.Latency {
		// The echo binds B's queue 0, which the flooding sender holds.
		snd.close()
		snd = nil
		rates := []float64{10_000}
		if slowest > 20_000 {
			rates = append(rates, slowest/2)
		}
		if _, err := runLatency(p, d, cfg, rates, place); err != nil {
			return nil, err
		}
	}
	return results, nil
}

func printTable(w io.Writer, rs []*Result, frameSize int) {
	fmt.Fprintf(w, "\n1 sender core (cpu of the sender: see above); medians of the rounds; drops are the kernel's XDP_STATISTICS of the receiver's sockets over a run; "+
		"away is the longest a receive loop left its RX ring while frames came, the worst round: the kernel drops once it exceeds the ring's depth at the rate (2048 frames at 2 Mpps: 1024 µs)\n")
	fmt.Fprintf(w, "%-34s %2s %9s %7s %9s %10s %16s %10s %10s %10s %9s %7s\n",
		"receiver (median)", "q", "rx Mpps", "rx", "sent Mpps", "sender", "receiver CPU", "rx", "rx ring", "fill ring", "away", "vs (a)")
	fmt.Fprintf(w, "%-34s %2s %9s %7s %9s %10s %16s %10s %10s %10s %9s %7s\n",
		"", "", "", "Gbit/s", "", "ns/pkt", "ns/pkt", "dropped", "full", "empty", "max µs", "")
	for _, r := range rs {
		cpu := "-"
		if r.RxCPUNS != nil {
			cpu = fmt.Sprintf("%.0f", Median(r.RxCPUNS))
			if r.Spins {
				cpu += " (spins)"
			}
		}
		dropped, full, empty := "-", "-", "-"
		if r.Drops != nil {
			dropped, full, empty = medianDrop(r.Drops, func(d Drops) uint64 { return d.RXDropped }),
				medianDrop(r.Drops, func(d Drops) uint64 { return d.RingFull }),
				medianDrop(r.Drops, func(d Drops) uint64 { return d.FillEmpty })
		}
		away := "-"
		if r.Away != nil {
			away = strconv.FormatInt(slices.Max(r.Away).Microseconds(), 10)
		}
		fmt.Fprintf(w, "%-34s %2d %9.3f %7.2f %9.3f %10.0f %16s %10s %10s %10s %9s %7.2f\n", r.Name, r.Queues,
			Median(r.Rates)/1e6, Median(r.Rates)*float64(frameSize)*8/1e9, Median(r.SentPPS)/1e6, Median(r.SenderNS), cpu, dropped, full, empty, away, Ratio(r.Rates, rs[0].Rates))
	}
	printRatios(w, rs, frameSize)
}

func medianDrop(ds []Drops, f func(Drops) uint64) string {
	v := make([]float64, len(ds))
	for i, d := range ds {
		v[i] = float64(f(d))
	}
	return strconv.FormatFloat(Median(v), 'f', 0, 64)
}

// printRatios prints the ratios issue 15's goals are stated in.
func printRatios(w io.Writer, rs []*Result, frameSize int) {
	find := func(prefix string, queues int) *Result {
		for _, r := range rs {
			if strings.HasPrefix(r.Name, prefix) && r.Queues == queues {
				return r
			}
		}
		return nil
	}
	rate := func(r *Result) float64 { return Median(r.Rates) }
	// Ratios within a round, the median of the rounds' (Ratio).
	rates := func(x, y *Result) float64 { return Ratio(x.Rates, y.Rates) }
	cpus := func(x, y *Result) float64 { return Ratio(x.RxCPUNS, y.RxCPUNS) }
	a, b, c, d := find("(a)", 1), find("(b)", 1), find("(c)", 1), find("(d)", 1)
	fmt.Fprintf(w, "\nratios are the median of each round's (a row against its own round's):\nb/a = %.2f   c/a = %.2f", rates(b, a), rates(c, a))
	if d != nil {
		fmt.Fprintf(w, "   b/d = %.2f", rates(b, d))
	}
	fmt.Fprintln(w)
	for _, r := range []*Result{b, c, find("(e)", 1), find("(g)", 1)} {
		printGap(w, r, frameSize)
	}
	var drops []string
	for _, r := range rs {
		if r != a && strings.HasPrefix(r.Name, "(a)") {
			drops = append(drops, fmt.Sprintf("%d queues/1 queue = %.2f", r.Queues, rates(r, a)))
		}
	}
	if drops != nil {
		fmt.Fprintf(w, "(a) XDP_DROP: %s (no receiver copies a frame: what N queues cost veth and the sender alone)\n", strings.Join(drops, "   "))
	}
	var names []string // each pod row kind (a ring size makes its own), in order
	for _, r := range rs {
		if (strings.HasPrefix(r.Name, "(e)") || strings.HasPrefix(r.Name, "(f)") || strings.HasPrefix(r.Name, "(g)")) && !slices.Contains(names, r.Name) {
			names = append(names, r.Name)
		}
	}
	for _, name := range names {
		var one *Result
		for _, r := range rs {
			if r.Name == name && r.Queues == 1 {
				one = r
			}
		}
		if one == nil {
			continue
		}
		label := name[:3] // (e), (f) or (g), and its ring size when the run compares them
		if one.Ring != 0 {
			label += fmt.Sprintf(", ring %d", one.Ring)
		}
		fmt.Fprintf(w, "%s 1 queue: rate/(a) = %.2f   receiver CPU/(b)'s = %.2f", label, rates(one, a), cpus(one, b))
		if d != nil {
			fmt.Fprintf(w, "   receiver CPU/(d)'s = %.2f (d spins)", cpus(one, d))
		}
		for _, r := range rs {
			if r.Name == name && r.Queues > 1 {
				fmt.Fprintf(w, "   %d queues/1 queue = %.2f", r.Queues, rates(r, one))
			}
		}
		fmt.Fprintln(w)
	}
	for _, r := range rs {
		// A row of the default ring divided among its queues (and no
		// 1-queue row of its own): beside its kind's rows.
		base, _, ok := strings.Cut(r.Name, ", ring ")
		one, full := find(base, 1), find(base, r.Queues)
		if !ok || r.Ring == 0 || find(r.Name, 1) != nil || one == nil || full == nil || full.Ring != 0 {
			continue
		}
		fmt.Fprintf(w, "%s %d queues of ring %d (the frames of 1 queue's ring in all): %d queues/1 queue = %.2f, against %.2f with the default ring each "+
			"(what N queues cost here is N rings of frames in circulation through the one core that copies them, on veth the sender's; "+
			"on a NIC each queue copies on its own queue's core)\n", base[:3], r.Queues, r.Ring, r.Queues, rates(r, one), rates(full, one))
	}
	for _, r := range rs {
		base, ok := strings.CutSuffix(r.Name, perLoopSuffix)
		if !ok {
			continue
		}
		if one := find(base, r.Queues); one != nil && one != r {
			fmt.Fprintf(w, "%s %d queues: one loop over them all (client.Poller, xdpqperf's default with fewer cores than queues) %.3f Mpps, "+
				"a goroutine per queue (client.Receiver) %.3f: %.2fx\n", base[:3], r.Queues, rate(one)/1e6, rate(r)/1e6, rates(one, r))
		}
	}
	if find("(e)", 1) != nil {
		fmt.Fprintln(w, "(one sender core bounds every row but (f): N queues can at best equal the 1-queue rate, a ratio of 1.00; a busy-polling pod (f) runs the queue's NAPI, the receive side's XDP work, on its own core, so it can pass (a))")
	}
	if e, f := find("(e)", 1), find("(f)", 1); e != nil && f != nil {
		senders := func(x, y *Result) float64 { return Ratio(x.SenderNS, y.SenderNS) }
		fmt.Fprintf(w, "(busyPoll on veth: (f)/(e) rate %.2f, the sender core's ns/pkt %.2fx (e)'s. veth has no interrupt to defer: the sender's transmit "+
			"schedules the queue's NAPI on the sender's core while the busy-polling pod polls it from its own: the sender's cost per frame "+
			"rises instead of the pod taking the work. On a NIC, preferred busy polling defers the NIC's interrupts and the pod's core does the "+
			"receive side alone: measure it there, not here)\n", rates(f, e), senders(f, e))
	}
}

// printGap says how long a receive loop was away from its ring at worst,
// beside how long other tasks kept its threads off their core that
// round: a gap no task explains is the core stopped under it.
func printGap(w io.Writer, r *Result, frameSize int) {
	if r == nil || len(r.Away) == 0 || len(r.Away) != len(r.Waited) {
		return
	}
	i := 0
	for j := range r.Away {
		if r.Away[j] > r.Away[i] {
			i = j
		}
	}
	away, waited := r.Away[i], r.Waited[i]
	ring := uint32(spinRing)
	switch {
	case r.Ring != 0:
		ring = r.Ring
	case strings.HasPrefix(r.Name, "(e)") || strings.HasPrefix(r.Name, "(g)"):
		ring = defaultRing(Config{FrameSize: frameSize})
	}
	fmt.Fprintf(w, "%s %d queue: the longest its loop was away from its RX ring while frames came was %d µs (%.0f frames at its rate, its ring holds %d); "+
		"its threads waited for the core %d µs in all that round, runnable while another task ran",
		r.Name[:3], r.Queues, away.Microseconds(), away.Seconds()*r.Rates[i], ring, waited.Microseconds())
	if waited < away/2 {
		fmt.Fprint(w, ": no task of this machine held the core for the gap; the core itself was not running the loop (the hypervisor ran the vCPU late, or an interrupt ran long)")
	}
	fmt.Fprintln(w)
}

type measurement struct {
	rate, sent, senderNS float64
	rxCPU                *float64 // receiver CPU ns per packet received; nil: none
	drops                *Drops
	away, waited         *time.Duration
}

func measure(p *testnet.Pair, r receiver, snd *sender, cfg Config) (measurement, error) {
	run, err := r.start(p)
	if err != nil {
		return measurement{}, err
	}
	var cpu0, cpu1 time.Duration
	var errCPU0, errCPU1 error
	if run.cpu != nil {
		cpu0, errCPU0 = run.cpu()
	}
	busy0, err0 := cpuBusy(cfg.SenderCPU)
	start := time.Now()
	sent, err1 := snd.run(cfg.Duration, r.queues)
	elapsed := time.Since(start)
	busy1, err2 := cpuBusy(cfg.SenderCPU)
	if run.cpu != nil {
		cpu1, errCPU1 = run.cpu()
	}
	time.Sleep(100 * time.Millisecond) // let the receiver drain its ring
	out, err3 := run.finish()
	if err := errors.Join(err0, err1, err2, err3, errCPU0, errCPU1); err != nil {
		return measurement{}, err
	}
	secs := elapsed.Seconds()
	m := measurement{rate: float64(out.received) / secs, sent: float64(sent) / secs,
		senderNS: float64(busy1-busy0) / float64(max(sent, 1)), drops: out.drops, away: out.away, waited: out.waited}
	if run.cpu != nil {
		ns := float64(cpu1-cpu0) / float64(max(out.received, 1))
		m.rxCPU = &ns
	}
	return m, nil
}

// cpuBusy returns the nanoseconds cpu has spent not idle, from /proc/stat.
func cpuBusy(cpu int) (int64, error) {
	t, err := readCPUTimes(cpu)
	return t.busy, err
}

// cpuTimes are a core's times from /proc/stat, in nanoseconds: busy (not
// idle), and of that in user space (user and nice), in the kernel for a
// task (system), and in softirqs (the network stack's receive and
// transmit work, veth's NAPI among them).
type cpuTimes struct {
	busy, user, system, softirq int64
}

func (t cpuTimes) sub(u cpuTimes) cpuTimes {
	return cpuTimes{busy: t.busy - u.busy, user: t.user - u.user, system: t.system - u.system, softirq: t.softirq - u.softirq}
}

func readCPUTimes(cpu int) (cpuTimes, error) {
	var t cpuTimes
	f, err := os.Open("/proc/stat")
	if err != nil {
		return t, err
	}
	defer func() { _ = f.Close() }() // read-only
	prefix := fmt.Sprintf("cpu%d ", cpu)
	sc := bufio.NewScanner(f)
	ns := func(ticks int64) int64 { return ticks * int64(time.Second) / 100 } // USER_HZ is 100 on Linux
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		for i, v := range strings.Fields(line)[1:] {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return t, fmt.Errorf("/proc/stat: %q: %w", line, err)
			}
			// user nice system idle iowait irq softirq steal guest guest_nice
			switch i {
			case 0, 1:
				t.user += ns(n)
			case 2:
				t.system += ns(n)
			case 6:
				t.softirq += ns(n)
			}
			if i == 3 || i == 4 || i >= 8 {
				continue
			}
			t.busy += ns(n)
		}
		return t, nil
	}
	return t, fmt.Errorf("/proc/stat has no %s", strings.TrimSpace(prefix))
}

// confine moves every thread of this process to the CPUs of set; the
// threads the Go runtime starts later inherit it from theirs. A thread
// that pins itself afterwards (pin) has its own core until it unpins.
func confine(set unix.CPUSet) error {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("confine the bench's threads: %w", err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue // not a thread's directory
		}
		// A thread that ended since the listing is ESRCH: nothing to move.
		if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("confine the bench's thread %d: %w", tid, err)
		}
	}
	return nil
}

// pin locks the goroutine to its thread and the thread to cpu; unpin
// gives the thread its CPUs back and unlocks it. (Ending the goroutine
// locked would end the thread instead: a pod forked from that thread
// earlier, when it ran another goroutine, would die of its Pdeathsig.)
func pin(cpu int) (unpin func(), err error) {
	runtime.LockOSThread()
	var was unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("affinity: %w", err)
	}
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("pin to cpu %d: %w", cpu, err)
	}
	return func() {
		if unix.SchedSetaffinity(0, &was) == nil {
			runtime.UnlockOSThread()
		} // else the thread ends with its goroutine, still locked
	}, nil
}

// sender transmits the same frame from every UMEM frame of its sockets on
// B's queues 0..n-1 as fast as the kernel takes them, from one core.
type sender struct {
	umem       *xsk.UMEM
	socks      []*xsk.Socket // on B's queues 0, 1, ...
	addrs      [][]uint64    // each socket's UMEM frames
	cfg        Config
	budgetNote string
}

// xdpMaxTXSKBBudget is XDP_MAX_TX_SKB_BUDGET (Linux 6.17): how many frames
// one sendto may transmit in copy mode (32 before it).
const xdpMaxTXSKBBudget = 9

// senderFrames is how many UMEM frames each of the sender's sockets has.
const senderFrames = 4096

func newSender(p *testnet.Pair, queues int, cfg Config) (*sender, error) {
	rings := xsk.Rings{Fill: 64, Completion: senderFrames, TX: senderFrames}
	dev := xsk.Netdev{Name: p.B.Name, Ifindex: p.B.Index, NetNS: p.NSPath()}
	qs := make([]uint32, queues)
	for i := range qs {
		qs[i] = uint32(i)
	}
	umem, socks, err := xsk.Open(dev, qs, senderFrames*queues, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: rings, MultiBuffer: cfg.Jumbo()})
	if err != nil {
		return nil, err
	}
	s := &sender{umem: umem, socks: socks, cfg: cfg, budgetNote: ", kernel TX budget 32"}
	budget := true
	for _, k := range socks {
		budget = budget && unix.SetsockoptInt(k.FD(), unix.SOL_XDP, xdpMaxTXSKBBudget, cfg.TXBatch) == nil
	}
	if budget {
		s.budgetNote = fmt.Sprintf(", kernel TX budget %d", cfg.TXBatch)
	}
	f, err := frame.Spec{SrcMAC: p.B.MAC, DstMAC: p.A.MAC, Src: p.B.Addr, Dst: p.A.Addr, Protocol: 17,
		SrcPort: 4000, DstPort: 5000, Payload: frame.Payload(1, 0, cfg.FrameSize-42)}.Build()
	if err != nil {
		s.close()
		return nil, err
	}
	for i := range socks {
		addrs := make([]uint64, senderFrames)
		for j := range addrs {
			addrs[j] = umem.FrameAddr(i*senderFrames + j)
		}
		if err := traffic.Prepare(umem, addrs, f); err != nil {
			s.close()
			return nil, err
		}
		s.addrs = append(s.addrs, addrs)
	}
	return s, nil
}

// queues is how many of B's queues the sender has sockets on.
func (s *sender) queues() int { return len(s.socks) }

// close frees the sender's sockets and UMEM; Linux frees them even when
// close or munmap reports an error, and nothing is written through them.
func (s *sender) close() {
	for _, k := range s.socks {
		_ = k.Close()
	}
	_ = s.umem.Close()
}

// run sends for d on the sender's core on queues 0..queues-1 and returns
// how many frames the kernel completed.
func (s *sender) run(d time.Duration, queues int) (uint64, error) {
	var sent uint64
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		unpin, perr := pin(s.cfg.SenderCPU)
		if err = perr; err != nil {
			return
		}
		defer unpin()
		deadline := time.Now().Add(d)
		sent, err = traffic.FloodAll(s.socks[:queues], s.addrs[:queues], uint32(s.cfg.FrameSize), s.cfg.TXBatch,
			func() bool { return time.Now().After(deadline) })
	}()
	<-done
	return sent, err
}

func startDrop(p *testnet.Pair) (*running, error) {
	return startCounting(startCounter)(p)
}

// startCounting is a receiver of the counting program start attaches to
// A (startCounter, startReflector): it received what the program ran on.
func startCounting(start func(ns string, ifindex int) (*counter, error)) func(p *testnet.Pair) (*running, error) {
	return func(p *testnet.Pair) (*running, error) {
		c, err := start(p.NSPath(), p.A.Index)
		if err != nil {
			return nil, err
		}
		return &running{finish: func() (outcome, error) {
			n, err := c.count()
			return outcome{received: n}, errors.Join(err, c.close())
		}}, nil
	}
}

// spinRing is the entries of the spinning loops' ((b), (c)) fill and RX
// rings.
const spinRing = 4096

func startXSK(kind xdp.Kind, cfg Config) func(p *testnet.Pair) (*running, error) {
	cpu := cfg.RxCPU
	return func(p *testnet.Pair) (*running, error) {
		prog, err := xdp.Load(kind, xdp.LoadOptions{Queues: 1})
		if err != nil {
			return nil, err
		}
		if kind == xdp.Filter {
			if err := prog.AddFlow(xdp.Flow{Queue: 0, Protocol: xdp.UDP, Dst: p.A.Addr, Port: 5000}, 1); err != nil {
				_ = prog.Close() // never attached
				return nil, err
			}
		}
		dev := xsk.Netdev{Name: p.A.Name, Ifindex: p.A.Index, NetNS: p.NSPath()}
		rings := xsk.Rings{Fill: spinRing, Completion: 64, RX: spinRing}
		umem, socks, err := xsk.Open(dev, []uint32{0}, 2*spinRing, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: rings, MultiBuffer: cfg.Jumbo()})
		if err != nil {
			_ = prog.Close() // never attached
			return nil, err
		}
		sock := socks[0]
		cleanup := func() error {
			return errors.Join(sock.Close(), umem.Close(), prog.Close())
		}
		addrs := make([]uint64, spinRing)
		for i := range addrs {
			addrs[i] = umem.FrameAddr(i)
		}
		sock.Fill(addrs)
		if err := prog.SetSocket(0, sock.FD()); err != nil {
			return nil, errors.Join(err, cleanup())
		}
		if _, err := xdp.Attach(p.NSPath(), p.A.Index, prog.Prog(), xdp.ModeNative); err != nil {
			return nil, errors.Join(err, cleanup())
		}
		var received atomic.Uint64
		var stopFlag atomic.Bool
		var wg sync.WaitGroup
		var loopErr error
		var away, waited time.Duration
		tid := make(chan int, 1) // the loop's thread, for its CPU time
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(tid)
			unpin, err := pin(cpu)
			if loopErr = err; loopErr != nil {
				return
			}
			defer unpin()
			tid <- unix.Gettid()
			w0, err0 := threadWaited()
			away, loopErr = rxdrop(sock, &received, &stopFlag)
			w1, err1 := threadWaited()
			waited = w1 - w0
			loopErr = errors.Join(loopErr, err0, err1)
		}()
		stat := ""
		if t, ok := <-tid; ok {
			stat = fmt.Sprintf("/proc/self/task/%d/schedstat", t)
		}
		finish := func() (outcome, error) {
			stopFlag.Store(true)
			wg.Wait()
			var drops Drops
			st, errStats := sock.Statistics()
			drops.add(st)
			err := errors.Join(loopErr, errStats, xdp.Detach(p.NSPath(), p.A.Index, xdp.ModeNative, prog.Prog()), cleanup())
			return outcome{received: received.Load(), drops: &drops, away: &away, waited: &waited}, err
		}
		if stat == "" { // the loop could not start
			_, err := finish()
			return nil, err
		}
		return &running{cpu: func() (time.Duration, error) { return schedstat(stat, onCPU) }, finish: finish}, nil
	}
}

// The fields of a thread's schedstat file: nanoseconds on a CPU, and
// nanoseconds runnable on a run queue, waiting for one.
const (
	onCPU = iota
	runnable
)

// threadWaited returns how long the calling thread has waited on a run
// queue, runnable but not running.
func threadWaited() (time.Duration, error) {
	return schedstat("/proc/thread-self/schedstat", runnable)
}

// schedstat returns the sum of field (onCPU or runnable) of the threads
// whose schedstat files match pattern (a glob). A thread that ended
// since the listing is left out.
func schedstat(pattern string, field int) (time.Duration, error) {
	files, err := filepath.Glob(pattern)
	if err != nil {
		return 0, err
	}
	if len(files) == 0 {
		return 0, fmt.Errorf("no thread at %s (it exited)", pattern)
	}
	var sum time.Duration
	for _, file := range files {
		b, err := os.ReadFile(file)
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			continue // the thread ended since the listing
		}
		if err != nil {
			return 0, err
		}
		f := strings.Fields(string(b))
		if len(f) <= field {
			return 0, fmt.Errorf("%s: %q: no field %d", file, b, field)
		}
		ns, err := strconv.ParseInt(f[field], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %w", file, b, err)
		}
		sum += time.Duration(ns)
	}
	return sum, nil
}

// processCPU returns the CPU time process pid has used, its ended threads'
// included, to the nanosecond: its process CPU clock
// (CPUCLOCK_SCHED of pid, as clock_getcpuclockid(3) makes it).
func processCPU(pid int) (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(int32(^pid<<3|2), &ts); err != nil {
		return 0, fmt.Errorf("the CPU clock of process %d: %w", pid, err)
	}
	return time.Duration(ts.Nano()), nil
}

// rxdrop is xdpsock's rxdrop: take received frames and give them straight
// back to the fill ring, spinning. Frames the fill ring does not take yet
// (the kernel publishes its consumer index lazily) wait in refill. It
// returns the longest time between two of its looks at the RX ring while
// frames came (within a millisecond): a spinning thread is away only
// while something else has its core.
func rxdrop(s *xsk.Socket, received *atomic.Uint64, stop *atomic.Bool) (time.Duration, error) {
	descs := make([]xsk.Desc, 256)
	refill := make([]uint64, 0, s.UMEM().NumFrames())
	mask := ^uint64(s.UMEM().Config().FrameSize - 1)
	var away time.Duration
	last := time.Now()
	lastFrame := last.Add(-time.Second)
	for i := 0; ; i++ {
		if len(refill) > 0 {
			n := s.Fill(refill)
			refill = refill[:copy(refill, refill[n:])]
		}
		n := s.Receive(descs)
		now := time.Now()
		if gap := now.Sub(last); gap > away && last.Sub(lastFrame) < time.Millisecond {
			away = gap
		}
		last = now
		if n == 0 {
			if i&1023 == 0 && stop.Load() {
				return away, nil
			}
			continue
		}
		lastFrame = now
		packets := 0
		for _, d := range descs[:n] {
			refill = append(refill, d.Addr&mask)
			if !d.Continues() {
				packets++ // a packet's last descriptor
			}
		}
		received.Add(uint64(packets))
	}
}

// testpmdTotals reads the counters testpmd prints of all its ports as it
// exits ("Accumulated forward statistics for all ports").
var testpmdTotals = regexp.MustCompile(`Accumulated forward statistics[^\n]*\n\s*RX-packets:\s*(\d+)\s+RX-dropped:\s*(\d+)[^\n]*\n\s*TX-packets:\s*(\d+)\s+TX-dropped:\s*(\d+)`)

// startTestpmd runs dpdk-testpmd in forwarding mode mode (rxonly,
// macswap, txonly) on A's queues 0..queues-1, a port each, one forwarding
// lcore on the receivers' core; it prints its counts when it exits. The outcome's
// frames are those it received in rxonly, those it transmitted
// otherwise; in macswap, its RX-dropped (the PMD's count of frames the
// kernel dropped for its sockets) is Drops.RXDropped.
func startTestpmd(cfg Config, mode string, queues int) func(p *testnet.Pair) (*running, error) {
	return func(p *testnet.Pair) (*running, error) {
		// ip netns exec mounts the namespace's sysfs, where the PMD looks up the netdev.
		// stdbuf: testpmd writes to a pipe, which libc would buffer.
		args := []string{"netns", "exec", filepath.Base(p.NSPath()), "stdbuf", "-oL", cfg.Testpmd,
			"-l", fmt.Sprintf("%d,%d", cfg.RxCPU, cfg.SenderCPU), "--main-lcore", strconv.Itoa(cfg.SenderCPU),
			"--no-huge", "-m", "512", "--no-pci", "--no-shconf"}
		// A port per queue: the PMD takes more than one queue of a port
		// only from a NIC with combined channels, which veth has not
		// ("Specified queue count 4 is larger than combined queue count 1").
		for q := range queues {
			args = append(args, "--vdev", fmt.Sprintf("net_af_xdp%d,iface=%s,start_queue=%d,queue_count=1", q, p.A.Name, q))
		}
		// loop: each port sends out of itself, as the pods do.
		args = append(args, "--", "--forward-mode="+mode, "--port-topology=loop", "--nb-cores=1",
			fmt.Sprintf("--total-num-mbufs=%d", 16384*min(queues, 2)))
		if mode == "txonly" {
			args = append(args, fmt.Sprintf("--txpkts=%d", cfg.FrameSize))
		}
		cmd := exec.Command("ip", args...)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		var out syncbuf.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start testpmd: %w", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for !strings.Contains(out.String(), "Press enter to exit") {
			if ctx.Err() != nil || cmd.ProcessState != nil {
				// Given up: killed and reaped; its output says why.
				_ = stdin.Close()
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				return nil, fmt.Errorf("testpmd did not start:\n%s", out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		// ip netns exec and stdbuf exec testpmd: the pid is testpmd's.
		threads := fmt.Sprintf("/proc/%d/task/*/schedstat", cmd.Process.Pid)
		return &running{cpu: func() (time.Duration, error) { return schedstat(threads, onCPU) }, finish: func() (outcome, error) {
			_ = stdin.Close() // "enter" to exit: Wait says how it went
			if err := cmd.Wait(); err != nil {
				return outcome{}, fmt.Errorf("testpmd: %w\n%s", err, out.String())
			}
			m := testpmdTotals.FindStringSubmatch(out.String())
			if m == nil {
				return outcome{}, fmt.Errorf("testpmd printed no totals:\n%s", out.String())
			}
			var v [4]uint64
			for i := range v {
				if v[i], err = strconv.ParseUint(m[i+1], 10, 64); err != nil {
					return outcome{}, err
				}
			}
			switch mode {
			case "rxonly":
				return outcome{received: v[0]}, nil
			case "macswap":
				return outcome{received: v[2], drops: &Drops{RXDropped: v[1]}}, nil
			default:
				return outcome{received: v[2]}, nil
			}
		}}, nil
	}
}

// startHog runs a busy loop pinned to cpu until stop.
func startHog(cpu int) (stop func(), err error) {
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("cpu hog: %w", err)
	}
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(cmd.Process.Pid, &set); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("cpu hog on cpu %d: %w", cpu, err)
	}
	return func() {
		_ = cmd.Process.Kill() // a busy loop: killing it loses nothing
		_ = cmd.Wait()
	}, nil
}
