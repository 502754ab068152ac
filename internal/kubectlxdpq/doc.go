// Package kubectlxdpq is the kubectl plugin `kubectl xdpq`
// (cmd/kubectl-xdpq): it reads the XdpqNode objects xdpq's daemons write
// and shows them to a cluster operator; top adds the daemons' /metrics,
// read through the API server's pod proxy, as rates per pod and queue.
//
// The package has three layers. Read (Client) fetches XdpqNodes and
// their Events and turns the API server's answers into errors that say
// what to do (the CRD not installed, no XdpqNode for a node). Render
// (PrintStatus, PodQueuesOf, PrintPods, Describe) turns objects into
// tables and describe text, and touches no network: it is what the
// golden tests check. Top (top.go) samples the daemons twice and turns
// the counters into rates (TopList), which PrintTop renders. NewCommand
// wires them behind cobra and
// cli-runtime's usual flags (--kubeconfig, --context, -n, ...).
package kubectlxdpq
