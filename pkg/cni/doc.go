// Package cni is the xdpq CNI plugin's logic: its network configuration
// (NetConf), validated strictly, and — as the issue that builds it goes
// on — the verbs, which talk to the node daemon's local API and never to
// the kernel-facing packages. cmd/cni is a thin main around it.
package cni
