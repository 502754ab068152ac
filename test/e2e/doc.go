// Package e2e holds xdpq's end-to-end tests against a real single-node
// Kubernetes cluster (see the cluster and kubebin packages).
package e2e
