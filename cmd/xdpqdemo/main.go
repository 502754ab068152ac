// Command xdpqdemo runs the demo (see package internal/tools/demo): the xdpq
// daemon in standalone mode, an unprivileged pod (xdpqperf) taking a veth
// NIC's queues as AF_XDP sockets from its broker, and its flow steered
// through cnitool and the xdpq CNI plugin. Run it as root: `sudo make demo`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/xdpq/xdpq/internal/tools/demo"
)

func main() {
	seconds := flag.Int("seconds", 6, "seconds of traffic (at least 4)")
	dir := flag.String("bin", "", "where xdpqperf, cnitool and cni/{xdpq,host-local} are (default: next to this program)")
	flag.Parse()
	if *dir == "" {
		self, err := os.Executable()
		if err != nil {
			fmt.Fprintln(os.Stderr, "xdpqdemo:", err)
			os.Exit(1)
		}
		*dir = filepath.Dir(self)
	}
	bin := demo.Binaries{Perf: filepath.Join(*dir, "xdpqperf"), CNITool: filepath.Join(*dir, "cnitool"), CNIDir: filepath.Join(*dir, "cni")}
	// Ctrl-C and kill end the demo early, its clean-up still run; a closed
	// pipe on stdout (xdpqdemo | head) is a write error, not a death.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := demo.Run(ctx, os.Stdout, bin, *seconds); err != nil {
		fmt.Fprintln(os.Stderr, "xdpqdemo:", err)
		os.Exit(1)
	}
}
