// Package bench measures receive rates on one veth pair, side by side in
// one run: an AF_XDP sender on B's queue 0, pinned to one core, and on A's
// queue 0 in turn (a) an XDP_DROP program, the ceiling; (b) xdpq's direct
// program into a pkg/xsk rxdrop loop; (c) xdpq's filter program into the
// same loop; (d) DPDK's af_xdp PMD in testpmd's rxonly mode, the C
// reference. On veth the receive-side XDP work runs in the sender's
// softirq, so the sender's core bounds every receiver: the table also
// gives that core's busy nanoseconds per packet sent, from /proc/stat.
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

	"github.com/xdpq/xdpq/internal/syncbuf"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// Config is what the bench command's flags set.
type Config struct {
	Duration  time.Duration // sending time per measurement
	Rounds    int           // each receiver is measured this many times, interleaved
	FrameSize int           // bytes per frame on the wire (without FCS)
	TXBatch   int           // descriptors per TX ring submission
	SenderCPU int
	RxCPU     int
	Testpmd   string // path of dpdk-testpmd; empty to skip (d)
	Out       io.Writer
}

// Result is one receiver's measurements.
type Result struct {
	Name     string
	Rates    []float64 // received packets per second, one per round
	SentPPS  []float64
	SenderNS []float64 // sender core busy ns per packet sent
	Note     string
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

// A receiver is started before the sender runs and finished after; no
// traffic flows outside the sender's run, so finish reports the frames
// received in it.
type receiver struct {
	name  string
	start func(p *testnet.Pair) (finish func() (uint64, error), err error)
}

// Run measures every receiver and prints the table to cfg.Out.
func Run(cfg Config) ([]*Result, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the benchmark needs root (network namespaces, XDP, AF_XDP)")
	}
	if runtime.NumCPU() < 2 {
		return nil, errors.New("the benchmark needs two cores: one sends, one receives")
	}
	p, err := testnet.Create(1)
	if err != nil {
		return nil, err
	}
	defer p.Close()

	receivers := []receiver{
		{"(a) XDP_DROP (ceiling)", startDrop},
		{"(b) direct + pkg/xsk rxdrop", startXSK(xdp.Direct, cfg.RxCPU)},
		{"(c) filter + pkg/xsk rxdrop", startXSK(xdp.Filter, cfg.RxCPU)},
	}
	if cfg.Testpmd != "" {
		receivers = append(receivers, receiver{"(d) DPDK af_xdp PMD rxonly", startTestpmd(cfg)})
	}
	results := make([]*Result, len(receivers))
	for i, r := range receivers {
		results[i] = &Result{Name: r.name}
	}
	snd, err := newSender(p, cfg)
	if err != nil {
		return nil, err
	}
	defer snd.close()
	fmt.Fprintf(cfg.Out, "veth pair, %d-byte frames, AF_XDP sender on cpu %d (TX batch %d%s), receivers on cpu %d, %v per run, %d rounds\n",
		cfg.FrameSize, cfg.SenderCPU, cfg.TXBatch, snd.budgetNote, cfg.RxCPU, cfg.Duration, cfg.Rounds)
	for round := range cfg.Rounds {
		for i, r := range receivers {
			rate, sent, ns, err := measure(p, r, snd, cfg)
			if err != nil {
				return nil, fmt.Errorf("%s, round %d: %w", r.name, round+1, err)
			}
			res := results[i]
			res.Rates = append(res.Rates, rate)
			res.SentPPS = append(res.SentPPS, sent)
			res.SenderNS = append(res.SenderNS, ns)
			fmt.Fprintf(cfg.Out, "  round %d  %-30s %8.3f Mpps received, %8.3f Mpps sent, sender core %6.0f ns/pkt\n",
				round+1, r.name, rate/1e6, sent/1e6, ns)
		}
	}
	printTable(cfg.Out, results)
	return results, nil
}

func printTable(w io.Writer, rs []*Result) {
	fmt.Fprintf(w, "\n%-30s %12s %12s %18s %10s\n", "receiver (median)", "rx Mpps", "sent Mpps", "sender ns/pkt", "vs (a)")
	ceiling := Median(rs[0].Rates)
	for _, r := range rs {
		fmt.Fprintf(w, "%-30s %12.3f %12.3f %18.0f %10.2f\n", r.Name, Median(r.Rates)/1e6, Median(r.SentPPS)/1e6, Median(r.SenderNS), Median(r.Rates)/ceiling)
	}
	b, c := Median(rs[1].Rates), Median(rs[2].Rates)
	fmt.Fprintf(w, "\nb/a = %.2f   c/a = %.2f", b/ceiling, c/ceiling)
	if len(rs) > 3 {
		fmt.Fprintf(w, "   b/d = %.2f", b/Median(rs[3].Rates))
	}
	fmt.Fprintln(w)
}

func measure(p *testnet.Pair, r receiver, snd *sender, cfg Config) (rate, sentPPS, senderNS float64, err error) {
	finish, err := r.start(p)
	if err != nil {
		return 0, 0, 0, err
	}
	busy0, err0 := cpuBusy(cfg.SenderCPU)
	start := time.Now()
	sent, err1 := snd.run(cfg.Duration)
	elapsed := time.Since(start)
	busy1, err2 := cpuBusy(cfg.SenderCPU)
	time.Sleep(100 * time.Millisecond) // let the receiver drain its ring
	received, err3 := finish()
	if err := errors.Join(err0, err1, err2, err3); err != nil {
		return 0, 0, 0, err
	}
	secs := elapsed.Seconds()
	return float64(received) / secs, float64(sent) / secs, float64(busy1-busy0) / float64(max(sent, 1)), nil
}

// cpuBusy returns the nanoseconds cpu has spent not idle, from /proc/stat.
func cpuBusy(cpu int) (int64, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	prefix := fmt.Sprintf("cpu%d ", cpu)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		fields := strings.Fields(line)[1:]
		var busy int64
		for i, v := range fields {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/stat: %q: %w", line, err)
			}
			// user nice system idle iowait irq softirq steal guest guest_nice
			if i == 3 || i == 4 || i >= 8 {
				continue
			}
			busy += n
		}
		return busy * int64(time.Second) / 100, nil // USER_HZ is 100 on Linux
	}
	return 0, fmt.Errorf("/proc/stat has no %s", strings.TrimSpace(prefix))
}

func pin(cpu int) error {
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("pin to cpu %d: %w", cpu, err)
	}
	return nil
}

// sender transmits the same frame from every UMEM frame of a socket on B's
// queue 0 as fast as the kernel takes them.
type sender struct {
	umem       *xsk.UMEM
	sock       *xsk.Socket
	cfg        Config
	budgetNote string
}

// xdpMaxTXSKBBudget is XDP_MAX_TX_SKB_BUDGET (Linux 6.17): how many frames
// one sendto may transmit in copy mode (32 before it).
const xdpMaxTXSKBBudget = 9

func newSender(p *testnet.Pair, cfg Config) (*sender, error) {
	rings := xsk.Rings{Fill: 64, Completion: 4096, TX: 4096}
	dev := xsk.Netdev{Name: p.B.Name, Ifindex: p.B.Index, NetNS: p.NSPath()}
	umem, socks, err := xsk.Open(dev, []uint32{0}, 4096, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: rings})
	if err != nil {
		return nil, err
	}
	s := &sender{umem: umem, sock: socks[0], cfg: cfg, budgetNote: ", kernel TX budget 32"}
	if err := unix.SetsockoptInt(s.sock.FD(), unix.SOL_XDP, xdpMaxTXSKBBudget, cfg.TXBatch); err == nil {
		s.budgetNote = fmt.Sprintf(", kernel TX budget %d", cfg.TXBatch)
	}
	f, err := frame.Spec{SrcMAC: p.B.MAC, DstMAC: p.A.MAC, Src: p.B.Addr, Dst: p.A.Addr, Protocol: 17,
		SrcPort: 4000, DstPort: 5000, Payload: frame.Payload(1, 0, cfg.FrameSize-42)}.Build()
	if err != nil {
		s.close()
		return nil, err
	}
	for i := range umem.NumFrames() {
		copy(umem.Bytes(umem.FrameAddr(i), uint32(len(f))), f)
	}
	return s, nil
}

func (s *sender) close() {
	s.sock.Close()
	s.umem.Close()
}

// run sends for d on the sender's core and returns how many frames the
// kernel completed.
func (s *sender) run(d time.Duration) (uint64, error) {
	var sent uint64
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err = pin(s.cfg.SenderCPU); err != nil {
			return
		}
		defer runtime.UnlockOSThread()
		addrs := make([]uint64, s.umem.NumFrames())
		for i := range addrs {
			addrs[i] = s.umem.FrameAddr(i)
		}
		deadline := time.Now().Add(d)
		sent, err = traffic.Flood(s.sock, addrs, uint32(s.cfg.FrameSize), s.cfg.TXBatch,
			func() bool { return time.Now().After(deadline) })
	}()
	<-done
	return sent, err
}

func startDrop(p *testnet.Pair) (func() (uint64, error), error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "bench_drop", Type: ebpf.XDP, License: "MIT",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}})
	if err != nil {
		return nil, err
	}
	// The kernel counts program runs only while someone holds stats enabled.
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		prog.Close()
		return nil, fmt.Errorf("enable bpf stats: %w", err)
	}
	if _, err := xdp.Attach(p.NSPath(), p.A.Index, prog, xdp.ModeNative); err != nil {
		stats.Close()
		prog.Close()
		return nil, err
	}
	return func() (uint64, error) {
		defer prog.Close()
		defer stats.Close()
		st, err := prog.Stats()
		if err != nil {
			return 0, err
		}
		return st.RunCount, xdp.Detach(p.NSPath(), p.A.Index, xdp.ModeNative, prog)
	}, nil
}

func startXSK(kind xdp.Kind, cpu int) func(p *testnet.Pair) (func() (uint64, error), error) {
	return func(p *testnet.Pair) (func() (uint64, error), error) {
		prog, err := xdp.Load(kind, xdp.LoadOptions{Queues: 1})
		if err != nil {
			return nil, err
		}
		if kind == xdp.Filter {
			if err := prog.AddFlow(xdp.Flow{Queue: 0, Protocol: xdp.UDP, Dst: p.A.Addr, Port: 5000}, 1); err != nil {
				prog.Close()
				return nil, err
			}
		}
		dev := xsk.Netdev{Name: p.A.Name, Ifindex: p.A.Index, NetNS: p.NSPath()}
		rings := xsk.Rings{Fill: 4096, Completion: 64, RX: 4096}
		umem, socks, err := xsk.Open(dev, []uint32{0}, 8192, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: rings})
		if err != nil {
			prog.Close()
			return nil, err
		}
		sock := socks[0]
		cleanup := func() error {
			sock.Close()
			umem.Close()
			return prog.Close()
		}
		addrs := make([]uint64, 4096)
		for i := range addrs {
			addrs[i] = umem.FrameAddr(i)
		}
		sock.Fill(addrs)
		if err := prog.SetSocket(0, sock.FD()); err != nil {
			cleanup()
			return nil, err
		}
		if _, err := xdp.Attach(p.NSPath(), p.A.Index, prog.Prog(), xdp.ModeNative); err != nil {
			cleanup()
			return nil, err
		}
		var received atomic.Uint64
		var stopFlag atomic.Bool
		var wg sync.WaitGroup
		var loopErr error
		wg.Add(1)
		go func() {
			defer wg.Done()
			if loopErr = pin(cpu); loopErr != nil {
				return
			}
			defer runtime.UnlockOSThread()
			loopErr = rxdrop(sock, &received, &stopFlag)
		}()
		return func() (uint64, error) {
			stopFlag.Store(true)
			wg.Wait()
			err := errors.Join(loopErr, xdp.Detach(p.NSPath(), p.A.Index, xdp.ModeNative, prog.Prog()), cleanup())
			return received.Load(), err
		}, nil
	}
}

// rxdrop is xdpsock's rxdrop: take received frames and give them straight
// back to the fill ring, spinning. Frames the fill ring does not take yet
// (the kernel publishes its consumer index lazily) wait in refill.
func rxdrop(s *xsk.Socket, received *atomic.Uint64, stop *atomic.Bool) error {
	descs := make([]xsk.Desc, 256)
	refill := make([]uint64, 0, s.UMEM().NumFrames())
	mask := ^uint64(s.UMEM().Config().FrameSize - 1)
	for i := 0; ; i++ {
		if len(refill) > 0 {
			n := s.Fill(refill)
			refill = refill[:copy(refill, refill[n:])]
		}
		n := s.Receive(descs)
		if n == 0 {
			if i&1023 == 0 && stop.Load() {
				return nil
			}
			continue
		}
		for _, d := range descs[:n] {
			refill = append(refill, d.Addr&mask)
		}
		received.Add(uint64(n))
	}
}

var rxPackets = regexp.MustCompile(`Accumulated forward statistics[^\n]*\n\s*RX-packets:\s*(\d+)`)

// startTestpmd runs dpdk-testpmd in rxonly mode on A's queue 0; it prints
// its count when it exits.
func startTestpmd(cfg Config) func(p *testnet.Pair) (func() (uint64, error), error) {
	return func(p *testnet.Pair) (func() (uint64, error), error) {
		// ip netns exec mounts the namespace's sysfs, where the PMD looks up the netdev.
		// stdbuf: testpmd writes to a pipe, which libc would buffer.
		cmd := exec.Command("ip", "netns", "exec", filepath.Base(p.NSPath()), "stdbuf", "-oL", cfg.Testpmd,
			"-l", fmt.Sprintf("%d,%d", cfg.RxCPU, cfg.SenderCPU), "--main-lcore", strconv.Itoa(cfg.SenderCPU),
			"--no-huge", "-m", "256", "--no-pci", "--no-shconf",
			"--vdev", "net_af_xdp0,iface="+p.A.Name+",start_queue=0,queue_count=1",
			"--", "--forward-mode=rxonly", "--total-num-mbufs=16384")
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
				stdin.Close()
				cmd.Process.Kill()
				cmd.Wait()
				return nil, fmt.Errorf("testpmd did not start:\n%s", out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		return func() (uint64, error) {
			stdin.Close()
			if err := cmd.Wait(); err != nil {
				return 0, fmt.Errorf("testpmd: %w\n%s", err, out.String())
			}
			m := rxPackets.FindStringSubmatch(out.String())
			if m == nil {
				return 0, fmt.Errorf("testpmd printed no RX-packets total:\n%s", out.String())
			}
			return strconv.ParseUint(m[1], 10, 64)
		}, nil
	}
}
