// Command xdpqctl talks to a standalone xdpq daemon: it allocates queues
// of a pool to a local user, frees them, and shows the daemon's state.
//
//	xdpqctl alloc -pool upf -n 2 -uid 1000   # prints the allocation, with its socket
//	xdpqctl free <allocation id>
//	xdpqctl status
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/xdpq/xdpq/pkg/api"
)

func main() {
	socket := flag.String("api-socket", api.DefaultSocket, "the daemon's local API")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: xdpqctl [-api-socket path] alloc -pool P [-n N] [-uid U] | free ID | status")
	}
	flag.Parse()
	c := api.NewClient(*socket)
	args := flag.Args()
	if len(args) == 0 {
		flag.Usage()
		os.Exit(2)
	}
	var out any
	var err error
	switch args[0] {
	case "alloc":
		fs := flag.NewFlagSet("alloc", flag.ExitOnError)
		pool := fs.String("pool", "", "pool to allocate from")
		n := fs.Int("n", 1, "number of queues")
		uid := fs.Uint("uid", uint(os.Getuid()), "user the allocation is for")
		fs.Parse(args[1:])
		if *pool == "" {
			fmt.Fprintln(os.Stderr, "xdpqctl alloc: -pool is required")
			os.Exit(2)
		}
		out, err = c.Alloc(*pool, *n, uint32(*uid))
	case "free":
		if len(args) != 2 {
			flag.Usage()
			os.Exit(2)
		}
		err = c.Free(args[1])
		out = map[string]string{"freed": args[1]}
	case "status":
		out, err = c.Status()
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "xdpqctl:", err)
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.Encode(out)
}
