// Command xdpq-install-cni puts xdpq's CNI plugin into the node's CNI bin
// directory, and takes it away when xdpq is uninstalled. The chart runs it
// twice in each node's pod, from the xdpq image (which has no shell and no
// cp):
//
//	xdpq-install-cni install -dir /host/cni/bin
//
// as an init container: copies /opt/xdpq/cni/xdpq to <dir>/xdpq
// atomically (a new file renamed over the old, never written in place)
// and exits, before the daemon starts;
//
//	xdpq-install-cni remove-on-uninstall -dir /host/cni/bin -daemonset xdpq
//
// as a sidecar (an init container with restartPolicy Always, stopped
// after the daemon): watches its DaemonSet through the API server and,
// when the pod stops, removes the plugin only if the DaemonSet was
// deleted (helm uninstall), never on a restart or an update.
//
// It is a command of its own, not a flag of the daemon or of the plugin:
// the init container and the sidecar run it with no capability at all
// and only the CNI bin directory mounted, and the plugin, run for every
// pod, stays a thin CNI client.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/xdpq/xdpq/internal/cniinstall"
	"github.com/xdpq/xdpq/internal/dsowner"
)

const usage = `usage:
  xdpq-install-cni install [-src FILE] -dir DIR [-name NAME]
  xdpq-install-cni remove-on-uninstall -dir DIR [-name NAME] -daemonset NAME [-namespace NS]
`

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	fs := flag.NewFlagSet("xdpq-install-cni "+cmd, flag.ExitOnError)
	dir := fs.String("dir", "", "the host's CNI bin directory, as mounted in this container")
	name := fs.String("name", "xdpq", "the plugin's file name (the type of its network configurations)")
	switch cmd {
	case "install":
		src := fs.String("src", "/opt/xdpq/cni/xdpq", "the plugin to install")
		_ = fs.Parse(args) // ExitOnError: a bad flag exits with its usage
		needArgs(fs, *dir != "")
		changed, err := cniinstall.Install(*src, *dir, *name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "xdpq-install-cni:", err)
			os.Exit(1)
		}
		log.Info("CNI plugin installed", "plugin", *dir+"/"+*name, "changed", changed)
	case "remove-on-uninstall":
		ds := fs.String("daemonset", "", "the DaemonSet whose deletion means uninstalling")
		ns := fs.String("namespace", os.Getenv("POD_NAMESPACE"), "the DaemonSet's namespace")
		_ = fs.Parse(args) // ExitOnError: a bad flag exits with its usage
		needArgs(fs, *dir != "" && *ds != "" && *ns != "")
		api, err := dsowner.InCluster()
		if err != nil {
			fmt.Fprintln(os.Stderr, "xdpq-install-cni:", err)
			os.Exit(1)
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		o := &dsowner.Owner{API: api, Namespace: *ns, Name: *ds, Log: log}
		if err := cniinstall.RemoveOnUninstall(ctx, o, 5*time.Second, *dir, *name); err != nil {
			fmt.Fprintln(os.Stderr, "xdpq-install-cni:", err)
			os.Exit(1)
		}
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "xdpq-install-cni: unknown command %q\n%s", cmd, usage)
		os.Exit(2)
	}
}

// needArgs exits with the usage when the flags lack what the command
// needs or arguments follow them.
func needArgs(fs *flag.FlagSet, ok bool) {
	if !ok || fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "%s: missing flags or extra arguments\n", fs.Name())
		fs.Usage()
		os.Exit(2)
	}
}
