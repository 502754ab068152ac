// Command kubectl-xdpq is the kubectl plugin `kubectl xdpq`: on PATH as
// kubectl-xdpq, kubectl runs it for
//
//	kubectl xdpq status [NODE...]        # per node and netdev: XDP program state, mode, queues, pools, ready, config
//	kubectl xdpq pods [-A | -n NS]       # which pod holds which queues and flows
//	kubectl xdpq describe node NAME      # everything xdpq reports of a node
//	kubectl xdpq top [NODE...]           # live: per pod and queue, frames received and lost per second
//
// with kubectl's connection flags (--kubeconfig, --context, -n, ...) and
// -o json|yaml|wide. It reads the XdpqNode objects xdpq's daemons write,
// and for top the daemons' /metrics through the API server's pod proxy.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/xdpq/xdpq/internal/kubectlxdpq"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := kubectlxdpq.NewCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}).ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
