// Command xdpqperf is an xdpsock-like tool on xdpq's broker: it takes the
// AF_XDP sockets of its allocation from $XDPQ_SOCKET, needs no privilege,
// and runs rxdrop, txpush or l2fwd, printing packets per second per queue
// every second.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/xdpq/xdpq/internal/perf"
)

func main() {
	// First: a SIGTERM that comes while the flags are read or the sockets
	// are taken still ends the run (as a container's first process, an
	// unhandled SIGTERM would be ignored).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg := perf.Config{Out: os.Stdout}
	flag.StringVar(&cfg.Socket, "socket", "", "the allocation's socket (default $XDPQ_SOCKET)")
	flag.StringVar(&cfg.Mode, "mode", perf.RXDrop, "rxdrop, txpush or l2fwd")
	flag.DurationVar(&cfg.Duration, "duration", 0, "how long to run (default: until interrupted)")
	queues := flag.String("queues", "", "comma-separated queues to use (default: all of the allocation's)")
	ring := flag.Uint("ring", 0, "entries per ring (default: pkg/client's, 2048, or 4096 with -multi-buffer)")
	flag.IntVar(&cfg.Size, "size", 64, "txpush: frame size in bytes (above 2048 with -multi-buffer)")
	flag.StringVar(&cfg.Loops, "loops", "", "rxdrop: \"one\" loop over all queues (client.Poller), a loop per \"queue\" (client.Receiver); default: one when the process has fewer cores than queues (GOMAXPROCS)")
	flag.BoolVar(&cfg.MultiBuffer, "multi-buffer", false, "ask for multi-buffer sockets: frames larger than a UMEM frame (jumbo frames, to 9014 bytes at a 9000-byte MTU) are received and sent whole")
	srcMAC := flag.String("src-mac", "02:00:00:00:00:01", "txpush: source MAC")
	dstMAC := flag.String("dst-mac", "ff:ff:ff:ff:ff:ff", "txpush: destination MAC")
	src := flag.String("src", "10.0.0.1", "txpush: source address")
	dst := flag.String("dst", "10.0.0.2", "txpush: destination address")
	sport := flag.Uint("sport", 4000, "txpush: source port")
	dport := flag.Uint("dport", 5000, "txpush: destination port")
	flag.Parse()

	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "xdpqperf: "+format+"\n", args...)
		os.Exit(2)
	}
	if flag.NArg() > 0 {
		switch a := flag.Arg(0); a {
		case perf.RXDrop, perf.TXPush, perf.L2Fwd:
			fail("unexpected argument %q: the mode is a flag, -mode %s", a, a)
		default:
			fail("unexpected argument %q: xdpqperf takes flags only; see -h", a)
		}
	}
	if *queues != "" {
		for _, q := range strings.Split(*queues, ",") {
			v, err := strconv.ParseUint(q, 10, 32)
			if err != nil {
				fail("-queues: %q is not a queue number", q)
			}
			cfg.Queues = append(cfg.Queues, uint32(v))
		}
	}
	var err error
	if *ring > 1<<31 {
		fail("-ring %d: at most %d, a power of two", *ring, 1<<31)
	}
	cfg.Ring = uint32(*ring)
	if cfg.SrcMAC, err = net.ParseMAC(*srcMAC); err != nil {
		fail("-src-mac: %v", err)
	}
	if cfg.DstMAC, err = net.ParseMAC(*dstMAC); err != nil {
		fail("-dst-mac: %v", err)
	}
	if cfg.Src, err = netip.ParseAddr(*src); err != nil {
		fail("-src: %v", err)
	}
	if cfg.Dst, err = netip.ParseAddr(*dst); err != nil {
		fail("-dst: %v", err)
	}
	maxSize := 2048
	if cfg.MultiBuffer {
		maxSize = 9014
	}
	if *sport > 65535 || *dport > 65535 || cfg.Size < 60 || cfg.Size > maxSize {
		fail("ports must be 0..65535 and -size 60..%d (2048 without -multi-buffer)", maxSize)
	}
	cfg.SrcPort, cfg.DstPort = uint16(*sport), uint16(*dport)

	t, err := perf.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "xdpqperf:", err)
		os.Exit(1)
	}
	perf.WriteTotals(os.Stdout, t)
}
