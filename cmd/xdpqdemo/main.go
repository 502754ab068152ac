// Command xdpqdemo runs the datapath demo (see package internal/demo): an
// unprivileged pod receiving a veth NIC's queues as AF_XDP sockets. Run it
// as root: `sudo make demo`.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/xdpq/xdpq/internal/demo"
)

func main() {
	if strings.Contains(os.Getenv(strings.Split(demo.PodEnv, "=")[0]), "1") {
		if err := demo.Pod(); err != nil {
			fmt.Fprintln(os.Stderr, "pod:", err)
			os.Exit(1)
		}
		return
	}
	seconds := flag.Int("seconds", 5, "seconds of traffic")
	flag.Parse()
	if err := demo.Run(os.Stdout, *seconds); err != nil {
		fmt.Fprintln(os.Stderr, "xdpqdemo:", err)
		os.Exit(1)
	}
}
