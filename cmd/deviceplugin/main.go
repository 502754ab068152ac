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
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/xdpq/xdpq"
	"github.com/xdpq/xdpq/internal/dsowner"
	"github.com/xdpq/xdpq/internal/kubeclient"
	"github.com/xdpq/xdpq/pkg/daemon"
	"github.com/xdpq/xdpq/pkg/nri"
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
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server, where the daemon keeps its node's XdpqNode and records Events (default: the in-cluster config when KUBERNETES_SERVICE_HOST is set, else no API server)")
	daemonSet := flag.String("daemonset", "", "the DaemonSet that runs this daemon, in -namespace: when it is deleted (helm uninstall) the daemon removes everything it put on the node as it stops; on any other stop (a restart, an update) everything stays. Needs an API server")
	namespace := flag.String("namespace", os.Getenv("POD_NAMESPACE"), "the namespace of -daemonset")
	draOn := flag.Bool("dra", false, "run the DRA driver xdpq.io for the pools served by DRA (needs an API server and kubelet 1.34+)")
	flag.StringVar(&o.ServedBy, "served-by", "", `how a pool whose config does not say is served: "dra" or "devicePlugin" (default)`)
	draPluginDir := flag.String("dra-plugin-dir", "", "the DRA driver's socket directory (default /var/lib/kubelet/plugins/xdpq.io)")
	cdiDir := flag.String("cdi-dir", "", "where the DRA driver writes the claims' CDI specs (default /var/run/cdi)")
	uninstallWait := flag.Duration("dra-uninstall-wait", 10*time.Minute, "on uninstall (-daemonset deleted), how long to wait for kubelet to unprepare the claims still prepared before freeing them; the pod's terminationGracePeriodSeconds must exceed it by 30 s")
	nriSocket := flag.String("nri-socket", "", "the container runtime's NRI socket, through which DRA moves netdev-mode pools' netdevs into pods ("+nri.DefaultSocket+"; empty: DRA serves no netdev-mode pool)")
	debug := flag.Bool("debug", false, "log at debug level")
	showVersion := flag.Bool("version", false, "print the release and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println("deviceplugin", xdpq.Version())
		return
	}
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
	restCfg, err := kubeClients(&o, *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "deviceplugin:", err)
		os.Exit(1)
	}
	if *draOn {
		if restCfg == nil {
			fmt.Fprintln(os.Stderr, "deviceplugin: -dra needs an API server (-kubeconfig, or in a pod)")
			os.Exit(2)
		}
		// The kubeletplugin helper takes client-go's clientset.
		cs, err := kubernetes.NewForConfig(restCfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, "deviceplugin:", err)
			os.Exit(1)
		}
		// POD_UID (the downward API) lets a new daemon register beside
		// the old one in a rolling update with maxSurge.
		o.DRA = &daemon.DRA{Kube: cs, RegistryDir: o.RegistryDir, PluginDir: *draPluginDir, CDIDir: *cdiDir, RollingUpdate: os.Getenv("POD_UID"),
			NRISocket: *nriSocket, UninstallWait: *uninstallWait}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *daemonSet != "" {
		if restCfg == nil || *namespace == "" {
			fmt.Fprintln(os.Stderr, "deviceplugin: -daemonset needs an API server (-kubeconfig, or in a pod) and -namespace (or POD_NAMESPACE)")
			os.Exit(2)
		}
		owner, err := daemonSetOwner(restCfg, *namespace, *daemonSet, o.Logger)
		if err != nil {
			fmt.Fprintln(os.Stderr, "deviceplugin:", err)
			os.Exit(1)
		}
		// Followed from the start: by the time the pod is told to stop,
		// helm uninstall has deleted the service account that could ask.
		go owner.Run(ctx)
		o.Uninstalling = owner.Uninstalling
	}
	d, err := daemon.New(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "deviceplugin:", err)
		os.Exit(1)
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			o.Logger.Info("SIGHUP: reloading the config")
			_ = d.Reload(ctx) // the outcome is logged by Reload
		}
	}()
	if err := d.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "deviceplugin:", err)
		os.Exit(1)
	}
}

// kubeClients sets the daemon's API server clients from a kubeconfig, or
// the pod's service account in a cluster; neither means no API server.
func kubeClients(o *daemon.Options, kubeconfig string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	switch {
	case kubeconfig != "":
		if cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
			return nil, fmt.Errorf("-kubeconfig: %w", err)
		}
	case os.Getenv("KUBERNETES_SERVICE_HOST") != "":
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("in-cluster API server config: %w", err)
		}
	default:
		return nil, nil
	}
	cfg.UserAgent = "xdpq-daemon"
	// kubeclient, not client-go's clientset: see its doc.
	kc, err := kubeclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("API server client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("API server client: %w", err)
	}
	o.Kube = &daemon.Kube{Pods: kc.Pods(""), Nodes: kc.Nodes(), Events: kc.EventSink(), Dynamic: dyn}
	return cfg, nil
}

// daemonSetOwner follows the DaemonSet namespace/name through the API
// server cfg reaches, with cfg's credentials.
func daemonSetOwner(cfg *rest.Config, namespace, name string, log *slog.Logger) (*dsowner.Owner, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("API server client: %w", err)
	}
	return &dsowner.Owner{API: &dsowner.API{Server: cfg.Host, Client: hc}, Namespace: namespace, Name: name, Log: log}, nil
}
