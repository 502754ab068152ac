// Package prometheus is the module the e2e's Prometheus server is built
// from (kubebin): Debian's prometheus package is built without Kubernetes
// service discovery, which the chart's ServiceMonitor needs; a module of
// its own, so that Prometheus' dependencies do not change what the e2e
// module builds the Kubernetes binaries with.
package prometheus
