// Command xdpqctl talks to an xdpq daemon: it allocates queues of a pool
// to a local user (a standalone daemon), frees them, and shows the
// daemon's state and its allocations, as tables or (-o json) as the API's
// JSON.
//
//	xdpqctl alloc -pool upf -n 2 -uid 1000   # prints the allocation, with its socket
//	xdpqctl free <allocation id>
//	xdpqctl status -o json                   # GET /v1/status: pools, counts, netdevs
//	xdpqctl allocations -pool upf -o json    # GET /v1/allocations?pool=upf
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
	"time"

	"github.com/xdpq/xdpq"
	"github.com/xdpq/xdpq/pkg/api"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

const usage = `usage: xdpqctl [-api-socket PATH] [-o table|json] COMMAND [flags] [arguments]

commands:
  alloc -pool POOL [-n N] [-uid UID]   allocate N queues of POOL to user UID; prints the allocation and its socket
  free ID                              end the allocation ID
  status                               print the daemon's pools, allocations and who holds them, CNI attachments and netdevs
                                       (-o json: the status answer alone, pools with their allocation counts and netdevs)
  allocations [-pool POOL]             print the allocations (of POOL) and who holds them, and their CNI attachments
  version                              print xdpqctl's release and the daemon's (its release and API version)

flags (before or after the command):
  -api-socket PATH   the daemon's local API (default ` + api.DefaultSocket + `)
  -o table|json      tables for a person (default), or the API's JSON for a program

"xdpqctl COMMAND -h" describes a command.
`

// globals are the flags every command takes, before or after its name.
type globals struct {
	socket, output string
}

// register adds the global flags to fs, with their values so far as
// defaults.
func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.socket, "api-socket", g.socket, "the daemon's local API")
	fs.StringVar(&g.output, "o", g.output, "output: table or json")
}

// command is a subcommand: its usage line, its flags, and what it does
// with its arguments. Its answer is printed as a table, or as JSON where
// asJSON (which it may ask the daemon less for).
type command struct {
	synopsis, doc string
	flags         func(fs *flag.FlagSet) func(c *api.Client, asJSON bool, args []string) (any, error)
}

func commands() map[string]command {
	return map[string]command{
		"alloc": {"alloc -pool POOL [-n N] [-uid UID]", "Allocate N queues of POOL to user UID and print the allocation, with the\nsocket its holder connects to.", func(fs *flag.FlagSet) func(*api.Client, bool, []string) (any, error) {
			pool := fs.String("pool", "", "the pool to allocate from (required)")
			n := fs.Int("n", 1, "how many queues (default 1)")
			uid := fs.Uint("uid", uint(os.Getuid()), "the user the allocation is for, whose processes alone may take its sockets (default yours)")
			return func(c *api.Client, _ bool, args []string) (any, error) {
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
		"free": {"free ID", "End the allocation ID, and its CNI attachments with it.", func(*flag.FlagSet) func(*api.Client, bool, []string) (any, error) {
			return func(c *api.Client, _ bool, args []string) (any, error) {
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
		"status": {"status", "Print the daemon's pools, with how many allocations each has; its allocations,\n" +
			"each with who holds it (the uid of a standalone allocation, the pod of a Kubernetes\n" +
			"one) and the queues a client holds sockets of (LEASE); the CNI attachments\n" +
			"(container, interface, netns, flows); the netdevs; and what is wrong with the\n" +
			"config or the records.\n\n" +
			"With -o json it prints the daemon's status answer (GET /v1/status) alone: pools,\n" +
			"allocation and attachment counts, netdevs, problems; \"xdpqctl allocations -o json\"\n" +
			"lists the allocations.", func(*flag.FlagSet) func(*api.Client, bool, []string) (any, error) {
			return func(c *api.Client, asJSON bool, args []string) (any, error) {
				if len(args) > 0 {
					return nil, newUsageError("takes no arguments, got %q", args)
				}
				s, err := c.Status()
				if err != nil || asJSON {
					return s, err
				}
				l, err := c.Allocations("")
				if err != nil {
					return nil, err
				}
				return statusView{Status: s, list: l}, nil
			}
		}},
		"version": {"version", "Print xdpqctl's release and the daemon's: its release and the version of the\n" +
			"local API it speaks (GET /v1/version). A daemon that does not answer is said\n" +
			"so after xdpqctl's own release, and the command fails.", func(*flag.FlagSet) func(*api.Client, bool, []string) (any, error) {
			return func(c *api.Client, _ bool, args []string) (any, error) {
				if len(args) > 0 {
					return nil, newUsageError("takes no arguments, got %q", args)
				}
				v := versionView{Client: xdpq.Version()}
				d, err := c.VersionInfo()
				if err != nil {
					return partial{v, err}, nil
				}
				v.Daemon = &d
				return v, nil
			}
		}},
		"allocations": {"allocations [-pool POOL]", "Print the allocations, of every pool or of POOL, each with who holds it (the uid\n" +
			"of a standalone allocation, the pod of a Kubernetes one) and the queues a client\n" +
			"holds sockets of (LEASE), and their CNI attachments (container, interface, netns,\n" +
			"flows). With -o json it prints the daemon's answer (GET /v1/allocations).", func(fs *flag.FlagSet) func(*api.Client, bool, []string) (any, error) {
			pool := fs.String("pool", "", "only the allocations of this pool (default every pool)")
			return func(c *api.Client, _ bool, args []string) (any, error) {
				if len(args) > 0 {
					return nil, newUsageError("takes no arguments, got %q", args)
				}
				return c.Allocations(*pool)
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
	g := globals{socket: api.DefaultSocket, output: "table"}
	global := flag.NewFlagSet("xdpqctl", flag.ContinueOnError)
	global.SetOutput(io.Discard)
	g.register(global)
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
	cmdFlags := flagUsage(fs)
	g.register(fs)
	cmdUsage := "usage: xdpqctl [-api-socket PATH] [-o table|json] " + cmd.synopsis + "\n\n" + cmd.doc + "\n" +
		cmdFlags + "\nflags of every command:\n  -api-socket PATH\tthe daemon's local API (default " + api.DefaultSocket + ")\n" +
		"  -o table|json\ttables for a person (default), or the API's JSON for a program\n"
	rest, err := parseInterspersed(fs, args[1:])
	if err != nil {
		return bad(stdout, stderr, name, cmdUsage, err)
	}
	if g.output != "table" && g.output != "json" {
		return bad(stdout, stderr, name, cmdUsage, fmt.Errorf("-o %s: want table or json", g.output))
	}
	out, err := do(api.NewClient(g.socket), g.output == "json", rest)
	var ue usageError
	if errors.As(err, &ue) {
		return bad(stdout, stderr, name, cmdUsage, err)
	}
	if err != nil {
		fmt.Fprintf(stderr, "xdpqctl %s: %v\n", name, err)
		return 1
	}
	var failed error
	if p, ok := out.(partial); ok {
		out, failed = p.out, p.err
	}
	if g.output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(out)
	} else {
		err = printTable(stdout, out, time.Now())
	}
	if err != nil {
		fmt.Fprintf(stderr, "xdpqctl %s: %v\n", name, err)
		return 1
	}
	if failed != nil {
		fmt.Fprintf(stderr, "xdpqctl %s: %v\n", name, failed)
		return 1
	}
	return 0
}

// partial is an answer printed before the command fails with err.
type partial struct {
	out any
	err error
}

// versionView is what the version command shows: xdpqctl's release, and
// the daemon's version (nil when it did not answer).
type versionView struct {
	Client string           `json:"client"`
	Daemon *api.VersionInfo `json:"daemon,omitempty"`
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
