// Command xdpqctl talks to a standalone xdpq daemon: it allocates queues
// of a pool to a local user, frees them, and shows the daemon's state.
//
//	xdpqctl alloc -pool upf -n 2 -uid 1000   # prints the allocation, with its socket
//	xdpqctl free <allocation id>
//	xdpqctl status
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"

	"github.com/xdpq/xdpq/pkg/api"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

const usage = `usage: xdpqctl [-api-socket PATH] COMMAND [flags] [arguments]

commands:
  alloc -pool POOL [-n N] [-uid UID]   allocate N queues of POOL to user UID; prints the allocation and its socket
  free ID                              end the allocation ID
  status                               print the daemon's pools, allocations and netdevs

flags:
  -api-socket PATH   the daemon's local API (default ` + api.DefaultSocket + `)

"xdpqctl COMMAND -h" describes a command.
`

// command is a subcommand: its usage line, its flags, and what it does
// with its arguments.
type command struct {
	synopsis, doc string
	flags         func(fs *flag.FlagSet) func(c *api.Client, args []string) (any, error)
}

func commands() map[string]command {
	return map[string]command{
		"alloc": {"alloc -pool POOL [-n N] [-uid UID]", "Allocate N queues of POOL to user UID and print the allocation, with the\nsocket its holder connects to.", func(fs *flag.FlagSet) func(*api.Client, []string) (any, error) {
			pool := fs.String("pool", "", "the pool to allocate from (required)")
			n := fs.Int("n", 1, "how many queues (default 1)")
			uid := fs.Uint("uid", uint(os.Getuid()), "the user the allocation is for, whose processes alone may take its sockets (default yours)")
			return func(c *api.Client, args []string) (any, error) {
				switch {
				case len(args) > 0:
					return nil, newUsageError("takes no arguments, got %q", args)
				case *pool == "":
					return nil, newUsageError("-pool is required")
				case *n < 1:
					return nil, newUsageError("-n %d: at least 1 queue", *n)
				case *uid > math.MaxUint32:
					return nil, newUsageError("-uid %d: not a uid", *uid)
				}
				return c.Alloc(*pool, *n, uint32(*uid))
			}
		}},
		"free": {"free ID", "End the allocation ID, and its CNI attachments with it.", func(*flag.FlagSet) func(*api.Client, []string) (any, error) {
			return func(c *api.Client, args []string) (any, error) {
				switch {
				case len(args) == 0:
					return nil, newUsageError("the allocation id is missing")
				case len(args) > 1:
					return nil, newUsageError("takes one allocation id, got %d arguments %q", len(args), args)
				case args[0] == "":
					return nil, newUsageError("the allocation id is empty")
				}
				if err := c.Free(args[0]); err != nil {
					return nil, err
				}
				return api.FreeAnswer{Freed: args[0]}, nil
			}
		}},
		"status": {"status", "Print the daemon's pools, allocations and netdevs.", func(*flag.FlagSet) func(*api.Client, []string) (any, error) {
			return func(c *api.Client, args []string) (any, error) {
				if len(args) > 0 {
					return nil, newUsageError("takes no arguments, got %q", args)
				}
				return c.Status()
			}
		}},
	}
}

// usageError is a command line the command cannot take.
type usageError string

func (e usageError) Error() string { return string(e) }

func newUsageError(format string, a ...any) usageError { return usageError(fmt.Sprintf(format, a...)) }

// run is xdpqctl with args, and returns its exit status: 0, 1 when the
// daemon refused or failed, 2 for a bad command line.
func run(args []string, stdout, stderr io.Writer) int {
	global := flag.NewFlagSet("xdpqctl", flag.ContinueOnError)
	global.SetOutput(io.Discard)
	socket := global.String("api-socket", api.DefaultSocket, "the daemon's local API")
	if err := global.Parse(args); err != nil {
		return bad(stdout, stderr, "", usage, err)
	}
	args = global.Args()
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	if args[0] == "help" {
		fmt.Fprint(stdout, usage)
		return 0
	}
	cmd, ok := commands()[args[0]]
	if !ok {
		return bad(stdout, stderr, "", usage, fmt.Errorf("unknown command %q", args[0]))
	}
	name := args[0]
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	do := cmd.flags(fs)
	cmdUsage := "usage: xdpqctl [-api-socket PATH] " + cmd.synopsis + "\n\n" + cmd.doc + "\n" + flagUsage(fs)
	rest, err := parseInterspersed(fs, args[1:])
	if err != nil {
		return bad(stdout, stderr, name, cmdUsage, err)
	}
	out, err := do(api.NewClient(*socket), rest)
	var ue usageError
	if errors.As(err, &ue) {
		return bad(stdout, stderr, name, cmdUsage, err)
	}
	if err != nil {
		fmt.Fprintf(stderr, "xdpqctl %s: %v\n", name, err)
		return 1
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(stderr, "xdpqctl %s: %v\n", name, err)
		return 1
	}
	return 0
}

// bad reports a bad command line (help asked for is not one: it prints
// the usage on stdout and succeeds).
func bad(stdout, stderr io.Writer, name, usage string, err error) int {
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		return 0
	}
	prefix := "xdpqctl"
	if name != "" {
		prefix += " " + name
	}
	fmt.Fprintf(stderr, "%s: %v\n%s", prefix, err, usage)
	return 2
}

// parseInterspersed parses fs's flags wherever they are among the
// arguments (`free ID -h` asks for help; it does not free "-h"), up to a
// "--", and returns the arguments.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		left := fs.Args()
		if len(left) == 0 {
			return rest, nil
		}
		if n := len(args) - len(left); n > 0 && args[n-1] == "--" {
			return append(rest, left...), nil
		}
		rest = append(rest, left[0])
		args = left[1:]
	}
}

// flagUsage lists fs's flags, or nothing for a command without any.
func flagUsage(fs *flag.FlagSet) string {
	var b strings.Builder
	fs.VisitAll(func(f *flag.Flag) { fmt.Fprintf(&b, "  -%s\t%s\n", f.Name, f.Usage) })
	if b.Len() == 0 {
		return ""
	}
	return "\nflags:\n" + b.String()
}
