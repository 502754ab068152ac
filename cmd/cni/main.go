// Command cni is the xdpq CNI plugin (type "xdpq"): it attaches a pod's
// flows to the queues it was given, through the xdpq daemon.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/xdpq/xdpq"
	"github.com/xdpq/xdpq/pkg/cni"
)

func main() {
	skel.PluginMainFuncs(cni.Plugin{CacheDir: cni.DefaultCacheDir}.Funcs(),
		cni.SupportedVersions, "xdpq "+xdpq.Version()+": AF_XDP queues for pods")
}
