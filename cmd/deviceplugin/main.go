// Command deviceplugin is the xdpq node daemon: device plugin, node agent
// and socket broker in one process. In Kubernetes it registers one device
// plugin per pool with kubelet; with --standalone it serves a local API
// for xdpqctl instead.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/xdpq/xdpq/pkg/daemon"
)

func main() {
	var o daemon.Options
	flag.StringVar(&o.ConfigPath, "config", "/etc/xdpq/config.yaml", "pool configuration (YAML or JSON); reloaded on change and on SIGHUP")
	flag.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name, for per-node overrides")
	labels := flag.String("node-labels", "", "this node's labels, k=v,k=v, for per-node overrides")
	flag.StringVar(&o.NetNS, "netns", "", "network namespace of the NICs (default: the daemon's own)")
	flag.StringVar(&o.PinDir, "pin-dir", "", "bpffs directory for pins (default /sys/fs/bpf/xdpq)")
	flag.StringVar(&o.StateDir, "state-dir", "", "state directory (default /run/xdpq/agent)")
	flag.StringVar(&o.AllocDir, "alloc-dir", "", "directory of the allocations' sockets (default /run/xdpq/alloc)")
	flag.StringVar(&o.PluginDir, "plugin-dir", "", "kubelet's device plugin directory (default /var/lib/kubelet/device-plugins)")
	flag.StringVar(&o.RegistryDir, "registry-dir", "/var/lib/kubelet/plugins_registry", "kubelet's plugin watcher directory; used when it exists, else plugins register on kubelet.sock")
	flag.BoolVar(&o.Standalone, "standalone", false, "run without kubelet: serve the local API for xdpqctl")
	flag.StringVar(&o.APISocket, "api-socket", daemon.DefaultAPISocket, "the local API's socket (xdpqctl and the CNI plugin's daemonSocket use it)")
	flag.StringVar(&o.MetricsAddr, "metrics-addr", ":9476", `address of /metrics (Prometheus), /healthz and /readyz; "" serves none`)
	debug := flag.Bool("debug", false, "log at debug level")
	flag.Parse()
	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	o.Logger = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if *labels != "" {
		o.NodeLabels = map[string]string{}
		for _, kv := range strings.Split(*labels, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				fmt.Fprintf(os.Stderr, "deviceplugin: -node-labels: %q is not k=v\n", kv)
				os.Exit(2)
			}
			o.NodeLabels[k] = v
		}
	}
	d, err := daemon.New(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "deviceplugin:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			o.Logger.Info("SIGHUP: reloading the config")
			d.Reload(ctx) // the outcome is logged
		}
	}()
	if err := d.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "deviceplugin:", err)
		os.Exit(1)
	}
}
