// Command xdpqbench prints receive rates on one veth pair side by side:
// XDP_DROP (the ceiling), xdpq's direct and filter programs into a pkg/xsk
// rxdrop loop, and DPDK's af_xdp PMD (testpmd rxonly). Run it as root.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/xdpq/xdpq/internal/bench"
)

func main() {
	cfg := bench.Config{Out: os.Stdout}
	flag.DurationVar(&cfg.Duration, "duration", 3*time.Second, "sending time per measurement")
	flag.IntVar(&cfg.Rounds, "rounds", 3, "measurements per receiver, interleaved; the table shows medians")
	flag.IntVar(&cfg.FrameSize, "size", 64, "frame size in bytes (without FCS), at least 60")
	flag.IntVar(&cfg.TXBatch, "batch", 1024, "TX descriptors per submission")
	flag.IntVar(&cfg.SenderCPU, "sender-cpu", 1, "core the sender runs on")
	flag.IntVar(&cfg.RxCPU, "rx-cpu", 0, "core the receivers run on")
	testpmd := flag.String("testpmd", "dpdk-testpmd", "DPDK testpmd binary for (d); empty to skip it")
	flag.Parse()
	if cfg.FrameSize < 60 || cfg.FrameSize > 1500 {
		fmt.Fprintln(os.Stderr, "xdpqbench: -size must be 60..1500")
		os.Exit(2)
	}
	if *testpmd != "" {
		path, err := exec.LookPath(*testpmd)
		if err != nil {
			fmt.Fprintf(os.Stderr, "xdpqbench: %v (install Debian's dpdk-dev and librte-net-af-xdp23, or pass -testpmd= to skip (d))\n", err)
			os.Exit(1)
		}
		cfg.Testpmd = path
	}
	if _, err := bench.Run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "xdpqbench:", err)
		os.Exit(1)
	}
}
