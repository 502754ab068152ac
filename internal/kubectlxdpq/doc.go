// Package kubectlxdpq is the kubectl plugin `kubectl xdpq`
// (cmd/kubectl-xdpq): it reads the XdpqNode objects xdpq's daemons write
// and shows them to a cluster operator.
//
// The package has three layers. Read (Client) fetches XdpqNodes and
// their Events and turns the API server's answers into errors that say
// what to do (the CRD not installed, no XdpqNode for a node). Render
// (PrintStatus, PodQueuesOf, PrintPods, Describe) turns objects into
// tables and describe text, and touches no network: it is what the
// golden tests check. NewCommand wires both behind cobra and
// cli-runtime's usual flags (--kubeconfig, --context, -n, ...).
package kubectlxdpq
