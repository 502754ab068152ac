// Command xdpqdemo runs the demo (see package internal/demo): an
// unprivileged pod, xdpqperf, receiving a veth NIC's queues as AF_XDP
// sockets from xdpq's broker. Run it as root: `sudo make demo`.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/xdpq/xdpq/internal/demo"
)

func main() {
	seconds := flag.Int("seconds", 5, "seconds of traffic")
	perf := flag.String("perf", "", "the xdpqperf binary (default: next to this one)")
	flag.Parse()
	if *perf == "" {
		self, err := os.Executable()
		if err != nil {
			fmt.Fprintln(os.Stderr, "xdpqdemo:", err)
			os.Exit(1)
		}
		*perf = filepath.Join(filepath.Dir(self), "xdpqperf")
	}
	if err := demo.Run(os.Stdout, *perf, *seconds); err != nil {
		fmt.Fprintln(os.Stderr, "xdpqdemo:", err)
		os.Exit(1)
	}
}
