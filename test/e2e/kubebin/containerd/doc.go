// Package containerd is the module the e2e node's containerd 2 is built
// from (kubebin): its own, so that containerd's dependencies (newer
// grpc and OpenTelemetry instrumentation than Kubernetes v1.37.2's) do
// not change what the e2e module builds the Kubernetes binaries with.
package containerd
