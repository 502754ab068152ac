// Package crd tests the XdpqNode resource against a real kube-apiserver
// and etcd (test/e2e/cluster): the chart's CRD installs, the daemon
// (cmd/deviceplugin, standalone on a veth pair, -kubeconfig) creates its
// node's XdpqNode and keeps its status, the real kubectl shows the
// printer columns, and Events appear. BenchmarkXdpqNodeWrites counts the
// status writes at the API server when idle and under allocation churn.
package crd
