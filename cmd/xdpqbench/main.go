// Command xdpqbench prints receive rates on one veth pair side by side:
// XDP_DROP (the ceiling), xdpq's direct and filter programs into a pkg/xsk
// rxdrop loop, DPDK's af_xdp PMD (testpmd rxonly), and what a pod gets:
// the xdpq daemon in standalone mode and an unprivileged process taking
// its sockets from the broker, xdpqperf rxdrop with the pool's default
// settings and with its busy polling, and the C client's xdpq-rxdrop, on
// 1, 2 and 4 queues. Each row gives the rates, the sender core's and the
// receiver's own CPU ns per packet, and the sockets' drop counters. Then
// forwarding (XDP_TX, testpmd macswap, xdpqperf l2fwd, the C client's
// xdpq-l2fwd), transmit (testpmd txonly, xdpqperf txpush) and latency
// (round trips through each forwarder) tables; see package
// internal/tools/bench. It builds xdpqperf (and with a C compiler xdpq-rxdrop
// and xdpq-l2fwd) from the tree it runs in. Run it as root.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/xdpq/xdpq/internal/tools/bench"
)

func main() {
	cfg := bench.Config{Out: os.Stdout}
	flag.DurationVar(&cfg.Duration, "duration", 3*time.Second, "sending time per measurement")
	flag.IntVar(&cfg.Rounds, "rounds", 3, "measurements per receiver, interleaved; the table shows medians")
	flag.IntVar(&cfg.FrameSize, "size", 64, "frame size in bytes (without FCS), 60..9014; above 1514 jumbo frames: the MTU raised, multi-buffer sockets, (d) left out")
	podQueues := flag.String("pod-queues", "1,2,4", "queue counts of the pod rows, comma-separated")
	podRings := flag.String("pod-ring", "", "ring sizes the pod rows ask for, comma-separated, a row each (default: the clients' default)")
	flag.BoolVar(&cfg.Hog, "hog", false, "run a busy loop on the receivers' core through the run (a neighbour that takes its share)")
	flag.IntVar(&cfg.TXBatch, "batch", 1024, "TX descriptors per submission")
	flag.IntVar(&cfg.SenderCPU, "sender-cpu", 1, "core the sender runs on")
	flag.IntVar(&cfg.RxCPU, "rx-cpu", 0, "core the receivers run on")
	testpmd := flag.String("testpmd", "dpdk-testpmd", "DPDK testpmd binary for (d); empty to skip it")
	pods := flag.Bool("pods", true, "the pod rows (e) to (g): builds xdpqperf from this tree")
	cc := flag.String("cc", "clang,clang-14", "C compiler for (g)'s xdpq-rxdrop, the first found of a comma-separated list; empty to skip (g)")
	flag.BoolVar(&cfg.Forward, "forward", true, "the forwarding table: XDP_TX, DPDK's macswap and the pods' forwarders at 1 queue and the most of -pod-queues (not with jumbo frames, nor -tx and -latency)")
	flag.BoolVar(&cfg.Transmit, "tx", true, "the transmit table: DPDK's txonly and xdpqperf txpush")
	flag.BoolVar(&cfg.Latency, "latency", true, "the latency table: round trips through XDP_TX, DPDK's macswap and the pods' forwarders at 10,000 frames/s and at half the slowest forwarder's rate")
	rx := flag.Bool("rx", true, "the receive table (a) to (g)")
	flag.Parse()
	cfg.SkipReceive = !*rx
	if cfg.FrameSize > 1514 { // jumbo frames: the receive table alone
		cfg.Forward, cfg.Transmit, cfg.Latency = false, false, false
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "xdpqbench: unexpected argument %q\n", flag.Arg(0))
		os.Exit(2)
	}
	if cfg.FrameSize < 60 || cfg.FrameSize > 9014 {
		fmt.Fprintln(os.Stderr, "xdpqbench: -size must be 60..9014")
		os.Exit(2)
	}
	for _, q := range strings.Split(*podQueues, ",") {
		n, err := strconv.Atoi(q)
		if err != nil || n < 1 || n > 64 {
			fmt.Fprintf(os.Stderr, "xdpqbench: -pod-queues: %q is not a queue count 1..64\n", q)
			os.Exit(2)
		}
		cfg.PodQueues = append(cfg.PodQueues, n)
	}
	if *podRings != "" {
		for _, r := range strings.Split(*podRings, ",") {
			n, err := strconv.ParseUint(r, 10, 32)
			if err != nil || n < 64 || n&(n-1) != 0 || n > 1<<20 {
				fmt.Fprintf(os.Stderr, "xdpqbench: -pod-ring: %q is not a ring size (a power of two, 64..1048576)\n", r)
				os.Exit(2)
			}
			cfg.PodRings = append(cfg.PodRings, uint32(n))
		}
	}
	if *testpmd != "" {
		path, err := exec.LookPath(*testpmd)
		if err != nil {
			fmt.Fprintf(os.Stderr, "xdpqbench: %v (install Debian's dpdk-dev and librte-net-af-xdp23, or pass -testpmd= to skip (d))\n", err)
			os.Exit(1)
		}
		cfg.Testpmd = path
	}
	// Ctrl-C, SIGTERM or SIGHUP (a closed terminal) ends the run after
	// the measurement under way, with the namespace and veth pair, the
	// daemon and the pods removed; a second one ends it at once.
	stop := make(chan struct{})
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "xdpqbench: %v: stopping after the measurement under way and removing what the run made (again to stop at once)\n", s)
		close(stop)
		s = <-sigs
		fmt.Fprintf(os.Stderr, "xdpqbench: %v again: stopped at once; its network namespace (see the first line) may be left: ip netns delete it\n", s)
		os.Exit(1)
	}()
	cfg.Stop = stop
	if err := run(cfg, *pods, *cc); err != nil {
		fmt.Fprintln(os.Stderr, "xdpqbench:", err)
		os.Exit(1)
	}
}

func run(cfg bench.Config, pods bool, cc string) error {
	if os.Geteuid() != 0 { // before minutes of building for nothing
		return errors.New("the benchmark needs root (network namespaces, XDP, AF_XDP): run it with sudo")
	}
	if pods {
		compiler := ""
		if cc != "" {
			var err error
			if compiler, err = bench.FindCC(cc); err != nil {
				return fmt.Errorf("%w (install Debian's clang-14, or pass -cc= to skip (g))", err)
			}
		}
		dir, err := os.MkdirTemp("", "xdpqbench-")
		if err != nil {
			return err
		}
		defer func() {
			if err := os.RemoveAll(dir); err != nil {
				fmt.Fprintln(os.Stderr, "xdpqbench: left behind:", err)
			}
		}()
		if cfg.Pods, err = bench.BuildPods(dir, compiler); err != nil {
			select {
			case <-cfg.Stop: // the terminal's Ctrl-C ended the build too
				return bench.ErrInterrupted
			default:
				return err
			}
		}
	}
	_, err := bench.Run(cfg)
	return err
}
