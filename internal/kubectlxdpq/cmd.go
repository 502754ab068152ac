package kubectlxdpq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/yaml"

	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
)

// options is what every subcommand shares: the connection flags, the
// streams, and the list chunk size.
type options struct {
	config  *genericclioptions.ConfigFlags
	streams genericiooptions.IOStreams
	chunk   int64
}

// client connects to the API server the flags name.
func (o *options) client() (*Client, error) {
	if o.chunk < 0 {
		return nil, fmt.Errorf("--chunk-size %d: 0 (no chunks) or more", o.chunk)
	}
	cfg, err := o.config.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	return NewClient(cfg)
}

// NewCommand returns `kubectl xdpq` (the plugin's root command, named as
// kubectl runs it) and its subcommands status, pods, describe and top, with
// cli-runtime's connection flags, writing to streams.
func NewCommand(streams genericiooptions.IOStreams) *cobra.Command {
	o := &options{config: genericclioptions.NewConfigFlags(true).WithWarningPrinter(streams), streams: streams}
	root := &cobra.Command{
		Use:   "xdpq",
		Short: "Show what xdpq does on a cluster's nodes",
		Long: `kubectl xdpq shows what xdpq's daemons report in their XdpqNode objects:
each node's netdevs and the XDP program on them, which pod holds which
queues and flows, and everything of one node.`,
		Example: `  kubectl xdpq status                 # per node and netdev: program, mode, queues, pools, ready, config
  kubectl xdpq pods -A                # which pod holds which queues and flows, in every namespace
  kubectl xdpq describe node worker-1 # everything xdpq reports of node worker-1
  kubectl xdpq top                    # live: each pod's queues, frames received and lost per second`,
		Annotations:       map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl xdpq"},
		SilenceUsage:      true,
		SilenceErrors:     true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	o.config.AddFlags(root.PersistentFlags())
	root.PersistentFlags().Int64Var(&o.chunk, "chunk-size", DefaultChunkSize,
		"Return large lists in chunks rather than all at once. Pass 0 to disable.")
	root.AddCommand(o.statusCommand(), o.podsCommand(), o.describeCommand(), o.topCommand())
	return root
}

// noneReported is what a command says when there is no XdpqNode.
const noneReported = "No XdpqNodes found: no xdpq daemon has reported yet (kubectl get pods -A -l app.kubernetes.io/name=xdpq -o wide)."

// outputFlag adds -o to cmd.
func outputFlag(cmd *cobra.Command, output *string) {
	cmd.Flags().StringVarP(output, "output", "o", "", "Output format: json, yaml or wide (default: a table)")
}

// checkOutput refuses an -o the command cannot write.
func checkOutput(output string) error {
	switch output {
	case "", "wide", "json", "yaml":
		return nil
	}
	return fmt.Errorf("unable to match a printer suitable for the output format %q, allowed formats are: json, wide, yaml", output)
}

func (o *options) statusCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "status [NODE...]",
		Short: "Per node and netdev: XDP program state, mode, queues, pools, ready, config",
		Long: `Print one row per node and netdev that xdpq manages (of every node, or of
the nodes named):

  STATE    the netdev's XDP hook: Direct (xdpq's program, steering by the NIC),
           Filter (xdpq's program, steering by its flow map), Overridden (a
           foreign program has precedence), Idle (no socket bound: no program),
           Missing (the netdev is not there)
  PROGRAM  the program on the hook; the foreign program's name when Overridden
  MODE     where it runs: native, generic or offload
  QUEUES   the netdev's queues pods hold / its rx queues
  POOLS    the node's pools: queues allocated/capacity
  READY    the node's Ready condition: the daemon serves its pools; when not
           True, why: Starting (taking over), DaemonStopped
  CONFIG   the config in force (its hash); "(refused newer)" when a newer one was refused

-o wide adds the program id, steering, flows, link, driver, PCI address, NUMA
node, zero-copy, the queues kept off RSS, why the node is Degraded and the
daemon's reason for the netdev's state. -o json and -o yaml print the
XdpqNode objects.`,
		Example: `  kubectl xdpq status
  kubectl xdpq status worker-1 -o wide`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			objs, err := o.fetch(cmd.Context(), c, args)
			switch {
			case len(objs) == 0 && err != nil:
				return err
			case output == "json" || output == "yaml":
				return errors.Join(printObjects(o.streams.Out, objs, len(args) == 1, output), err)
			case len(objs) == 0:
				fmt.Fprintln(o.streams.ErrOut, noneReported)
				return nil
			}
			nodes, terr := Typed(objs)
			if terr != nil {
				return terr
			}
			return errors.Join(PrintStatus(o.streams.Out, nodes, output == "wide"), err)
		},
	}
	outputFlag(cmd, &output)
	return cmd
}

// fetch returns the XdpqNodes of nodes, or every XdpqNode when nodes is
// empty. It returns those it found with the error of those it did not.
func (o *options) fetch(ctx context.Context, c *Client, nodes []string) ([]unstructured.Unstructured, error) {
	if len(nodes) == 0 {
		return c.List(ctx, o.chunk)
	}
	var out []unstructured.Unstructured
	var errs []error
	seen := map[string]bool{}
	for _, n := range nodes {
		if seen[n] {
			continue
		}
		seen[n] = true
		u, err := c.Get(ctx, n)
		if errors.Is(err, ErrCRDNotInstalled) {
			return nil, err
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, *u)
	}
	return out, errors.Join(errs...)
}

// printObjects writes objs as kubectl get does: one object when single
// (one was named), else a List; without managedFields.
func printObjects(w io.Writer, objs []unstructured.Unstructured, single bool, output string) error {
	var p printers.ResourcePrinter = &printers.JSONPrinter{}
	if output == "yaml" {
		p = &printers.YAMLPrinter{}
	}
	p = &printers.OmitManagedFieldsPrinter{Delegate: p}
	if single && len(objs) == 1 {
		return p.PrintObj(&objs[0], w)
	}
	list := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": "v1", "kind": "List", "metadata": map[string]any{"resourceVersion": ""}}}
	list.Items = objs
	if list.Items == nil {
		list.Items = []unstructured.Unstructured{}
	}
	return p.PrintObj(list, w)
}

func (o *options) podsCommand() *cobra.Command {
	var output, node string
	var all bool
	cmd := &cobra.Command{
		Use:   "pods [-A | -n NAMESPACE] [--node NODE]",
		Short: "Which pod holds which queues and flows on which node and netdev",
		Long: `Print the pods of a namespace (the context's, or -n) that hold xdpq queues,
or of every namespace (-A): the node and netdev of the queues, their pool,
the flows steered to them, and whether the pod holds their sockets now
(LEASE connected) or has not connected yet or has let go (not connected).
With -A, allocations no pod holds yet are listed too (POD <none>).

-o wide adds the allocation's id and the pod's UID; -o json and -o yaml
print the rows ({"items": [...]}).`,
		Example: `  kubectl xdpq pods -n upf
  kubectl xdpq pods -A --node worker-1 -o wide`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			namespace := ""
			if !all {
				ns, _, err := o.config.ToRawKubeConfigLoader().Namespace()
				if err != nil {
					return err
				}
				namespace = ns
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			var objs []unstructured.Unstructured
			if node != "" {
				objs, err = o.fetch(cmd.Context(), c, []string{node})
			} else {
				objs, err = c.List(cmd.Context(), o.chunk)
			}
			if err != nil {
				return err
			}
			nodes, err := Typed(objs)
			if err != nil {
				return err
			}
			rows := PodQueuesOf(nodes, namespace)
			switch output {
			case "json":
				return writeJSON(o.streams.Out, PodQueuesList{Items: orEmpty(rows)})
			case "yaml":
				b, err := yaml.Marshal(PodQueuesList{Items: orEmpty(rows)})
				if err != nil {
					return err
				}
				_, err = o.streams.Out.Write(b)
				return err
			}
			if len(rows) == 0 {
				where := ""
				if namespace != "" {
					where = " in namespace " + namespace
				}
				if node != "" {
					where += " on node " + node
				}
				fmt.Fprintf(o.streams.ErrOut, "No pods hold xdpq queues%s.\n", where)
				return nil
			}
			return PrintPods(o.streams.Out, rows, all, output == "wide")
		},
	}
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "List the pods of every namespace, and the allocations no pod holds")
	cmd.Flags().StringVar(&node, "node", "", "Only the pods on this node")
	outputFlag(cmd, &output)
	return cmd
}

func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "    ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// isNodeResource says whether describe takes s for its resource: as
// kubectl, "node", "nodes", "no", and the resource's own names.
func isNodeResource(s string) bool {
	switch strings.ToLower(s) {
	case "node", "nodes", "no", "xdpqnode", "xdpqnodes", "xqn", v1alpha1.Resource.GroupResource().String():
		return true
	}
	return false
}

func (o *options) describeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "describe node [NAME...]",
		Short: "Everything xdpq reports of a node",
		Long: `Describe the XdpqNode of each node named (or of every node): its conditions
(Ready, ConfigValid, Degraded), the config in force (hash, last good
reload, last error), each netdev (XDP state, program, mode, driver, PCI
address, NUMA node, zero-copy, queues, steering, link), the pools, the
allocations (pod, queues, lease, flows) and the node's Events.`,
		Example: `  kubectl xdpq describe node worker-1`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New(`describe what? kubectl xdpq describe node NAME`)
			}
			if !isNodeResource(args[0]) {
				return fmt.Errorf("kubectl xdpq describes nodes, not %q: kubectl xdpq describe node NAME", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			objs, ferr := o.fetch(cmd.Context(), c, args[1:])
			if errors.Is(ferr, ErrCRDNotInstalled) {
				return ferr
			}
			nodes, err := Typed(objs)
			if err != nil {
				return err
			}
			if len(args) == 1 {
				nodes = sortedNodes(nodes)
			}
			for i := range nodes {
				if i > 0 {
					fmt.Fprint(o.streams.Out, "\n\n")
				}
				events, eerr := c.Events(cmd.Context(), &nodes[i])
				if err := Describe(o.streams.Out, &nodes[i], events, eerr, time.Now()); err != nil {
					return err
				}
			}
			if ferr == nil && len(nodes) == 0 {
				fmt.Fprintln(o.streams.ErrOut, noneReported)
			}
			return ferr
		},
	}
	return cmd
}

func (o *options) topCommand() *cobra.Command {
	var output, namespace, selector string
	var interval time.Duration
	var once bool
	cmd := &cobra.Command{
		Use:   "top [NODE...]",
		Short: "Live: each pod's queues, frames received and lost per second",
		Long: `Show, refreshed every --interval like watch, each queue pods hold on every
node (or on the nodes named) with the frames per second xdpq's program
redirected to the queue's socket and those the kernel lost of them, by
reason; above them a line per node with its daemon and its netdevs'
states:

  STATE         the netdev's XDP state and mode (Direct/native, Filter/generic,
                Overridden, Missing, ...); "(not connected)" while the pod
                does not hold the queue's socket
  RX/s          frames redirected to the queue's socket
  DROPPED/s     frames the kernel dropped for the socket (rx_dropped: a
                frame larger than the socket's frames, say)
  RING-FULL/s   frames dropped because the RX ring was full: the pod does
                not read fast enough
  FILL-EMPTY/s  times the fill ring was found empty: the pod gives back
                buffers too slowly
  INVALID/s     invalid descriptors the pod put on its fill ring

A rate is "-" when it is not known: the queue has no socket to count, or
the daemon is of a version that does not count in direct mode. The
rates come from two scrapes of each node's daemon /metrics, --interval
apart, read through the API server's pod proxy; a node whose daemon
cannot be read says why ("unreachable: ...") and the others still show.

On a terminal each refresh redraws the screen; otherwise the tables
follow each other. --once prints one table and -o json one sample pair
(two scrapes --interval apart) and exit.

RBAC: get and list on xdpqnodes (the chart aggregates it into the view
role), list on pods and get on pods/proxy in the daemons' namespace. The
chart makes a Role for the last two, xdpq-top for a release named xdpq,
and binds it to no one: pods/proxy reaches every port of every pod of
that namespace, so it is not part of view. Bind it to who may read the
daemons' metrics:

  kubectl -n kube-system create rolebinding alice-xdpq-top --role=xdpq-top --user=alice`,
		Example: `  kubectl xdpq top
  kubectl xdpq top worker-1 --interval 1s
  kubectl xdpq top --once
  kubectl xdpq top -o json | jq '.items[] | select(.lossesPerSecond.rxRingFull > 0)'`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "" && output != "json" {
				return fmt.Errorf("unable to match a printer suitable for the output format %q, allowed formats are: json", output)
			}
			if interval < 100*time.Millisecond {
				return fmt.Errorf("--interval %s: at least 100ms", interval)
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			t := &topper{c: c, nodes: slices.Compact(slices.Clone(args)), chunk: o.chunk, namespace: namespace,
				selector: selector, timeout: max(interval, 5*time.Second), now: time.Now}
			tick := time.NewTicker(interval)
			defer tick.Stop()
			r := topRun{interval: interval, once: once, json: output == "json", clear: isTerminal(o.streams.Out),
				wait: func(ctx context.Context) error {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-tick.C:
						return nil
					}
				}}
			return t.run(cmd.Context(), o.streams.Out, r)
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "Time between refreshes, and between the two scrapes a rate is computed from")
	cmd.Flags().BoolVar(&once, "once", false, "Print one table (two scrapes --interval apart) and exit")
	cmd.Flags().StringVarP(&output, "output", "o", "", "Output format: json (one sample pair, then exit)")
	cmd.Flags().StringVar(&namespace, "daemon-namespace", DefaultDaemonNamespace, "Namespace of xdpq's daemon pods (the chart's release namespace)")
	cmd.Flags().StringVar(&selector, "daemon-selector", DefaultDaemonSelector, "Label selector of xdpq's daemon pods")
	return cmd
}

// isTerminal says whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
