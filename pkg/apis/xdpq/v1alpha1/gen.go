package v1alpha1

// The deepcopy functions and the CRD of the Helm chart (a chart's crds/
// directory: installed before its templates, never templated).
//go:generate go tool controller-gen object crd:crdVersions=v1 paths=. output:crd:dir=../../../../charts/xdpq/crds
