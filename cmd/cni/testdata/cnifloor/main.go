// Command cnifloor is the least a plugin built on containernetworking/cni
// links: skel for the verbs and invoke for the IPAM plugin (which brings
// OpenTelemetry's propagation).
package main

import (
	"context"
	"os"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"
)

func main() {
	if len(os.Args) > 1 { // never: only links the IPAM delegate
		_, _ = invoke.DelegateAdd(context.TODO(), os.Args[1], nil, nil)
	}
	skel.PluginMainFuncs(skel.CNIFuncs{Add: func(*skel.CmdArgs) error { return nil }}, version.All, "cnifloor")
}
