package cluster

import (
	"context"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/xdpq/xdpq/test/e2e/images"
	"github.com/xdpq/xdpq/test/e2e/kubebin"
)

// Defaults of NodeOptions.
const (
	// DefaultNodeDir holds a node's state. A fixed directory: a run
	// killed before its teardown leaves its state where the next run
	// finds and removes it.
	DefaultNodeDir = "/var/lib/xdpq-e2e/node"
	// DefaultKubeletRootDir is the kubelet's --root-dir, where device
	// plugins and the pod-resources socket are on any node.
	DefaultKubeletRootDir = "/var/lib/kubelet"
	// DefaultPodCIDR is the range the node's bridge network gives pods.
	DefaultPodCIDR = "10.244.0.0/24"
	// DefaultCNIPluginDir is where Debian's containernetworking-plugins
	// installs bridge, host-local and loopback.
	DefaultCNIPluginDir = "/usr/lib/cni"
	// Bridge is the node's pod bridge.
	Bridge = "xdpqe2e0"
	// CNINetwork is the name of the node's CNI network (its conflist).
	CNINetwork = "xdpq-e2e"
	// CRINamespace is the containerd namespace of the CRI plugin: images
	// for pods are imported into it.
	CRINamespace = "k8s.io"
	// KubeletPort is the kubelet's port on 127.0.0.1.
	KubeletPort = 10250
)

// NodeOptions configure StartNode.
type NodeOptions struct {
	// Dir holds the node's state: containerd's root, state and socket,
	// the CNI plugins and configuration, the kubelet's configuration and
	// the pods' logs, every component's log. "" is DefaultNodeDir.
	Dir string
	// KubeletRootDir is the kubelet's --root-dir; "" is
	// DefaultKubeletRootDir. (The kubelet's device plugin directory is
	// /var/lib/kubelet/device-plugins whatever it is.)
	KubeletRootDir string
	// PodCIDR is the pods' address range; "" is DefaultPodCIDR.
	PodCIDR string
	// CNIPluginDir is where the bridge, host-local and loopback plugins
	// are copied from; "" is DefaultCNIPluginDir.
	CNIPluginDir string
	// Log receives a line per step; nil is the control plane's.
	Log io.Writer
	// Name is the Node's name; "" is the control plane's NodeName, the
	// first node's. An isolated node needs a name of its own.
	Name string
	// Isolated runs the node in network and mount namespaces of its own
	// (see nodeNS), as kind runs a node in a container, joined to the
	// cluster's network (Options.Network, which it needs) at the next
	// address free, with cgroups under a root of its own. The control
	// plane's controllers run with the first node, which is not
	// isolated: an isolated node joins a cluster that has one.
	Isolated bool
	// AliasDir, for an isolated node, is a path at which the node sees
	// its own Dir as well: the first node's Dir, so that the host paths
	// of one DaemonSet (an NRI socket, a CNI bin directory in Dir) mean
	// each node's own files.
	AliasDir string
}

// Node is a kubelet with containerd and a bridge network, registered
// with a ControlPlane, and the control plane's kube-controller-manager
// and kube-scheduler (the first node's). There is one at a time in a
// Dir (its lock says so); an isolated node (NodeOptions.Isolated) joins
// beside the first.
type Node struct {
	// Name is the Node's name.
	Name string
	// Dir holds the node's state (NodeOptions.Dir).
	Dir string
	// KubeletRootDir is the kubelet's --root-dir.
	KubeletRootDir string
	// ContainerdSocket is the path of containerd's socket.
	ContainerdSocket string
	// NRISocket is where containerd listens for NRI plugins.
	NRISocket string
	// CNIBinDir and CNIConfDir are the CNI plugin and configuration
	// directories of the node's containerd: a CNI plugin installed on
	// the node goes into them.
	CNIBinDir, CNIConfDir string
	// CNIConfList is the path of the node's network configuration.
	CNIConfList string
	// IP is the node's address on the cluster's network (its
	// InternalIP, where its kubelet listens); invalid without one.
	IP netip.Addr
	// HostKubeletRootDir is KubeletRootDir as the host sees it: an
	// isolated node's is Dir/nsroot/var_lib_kubelet.
	HostKubeletRootDir string
	// CgroupRoot is the kubelet's cgroupRoot: "/" for the first node, the
	// pods' cgroups under /kubepods; an isolated node's own otherwise.
	CgroupRoot string

	cp          *ControlPlane
	podCIDR     string
	kubelet     string // its binary
	kubeletArgs []string
	log         io.Writer
	lock        *os.File // Dir's lock, held until Stop
	containerd  *process
	bins        kubebin.Paths // the node's programs, kubebin's
	mu          sync.Mutex    // guards procs and stopped: Stop may run during a start (Ctrl-C)
	procs       []*process
	stopped     bool
	stopOnce    sync.Once
	stopErr     error
	cancel      func()  // the signal handler's
	ns          *nodeNS // an isolated node's namespaces, nil for the first node
	nw          *Network
}

// StartNode starts the node's containerd, imports the pause image,
// starts kube-controller-manager and kube-scheduler against cp, then the
// kubelet, and waits until the Node is Ready. First it removes what a
// killed run left in the node's directories. It needs root and runc
// (containerd 2, its shim and ctr are kubebin's, built from their Go
// module), and the bridge, host-local and loopback CNI plugins. On
// error nothing it started is left running.
func StartNode(ctx context.Context, cp *ControlPlane, opts NodeOptions) (n *Node, err error) {
	t0 := time.Now()
	if opts.Dir == "" {
		opts.Dir = DefaultNodeDir
	}
	if opts.KubeletRootDir == "" {
		opts.KubeletRootDir = DefaultKubeletRootDir
	}
	if opts.PodCIDR == "" {
		opts.PodCIDR = DefaultPodCIDR
	}
	if opts.CNIPluginDir == "" {
		opts.CNIPluginDir = DefaultCNIPluginDir
	}
	if opts.Log == nil {
		opts.Log = cp.log
	}
	if opts.Name == "" {
		opts.Name = cp.NodeName
	}
	if opts.Isolated && (cp.Network == nil || opts.Name == cp.NodeName) {
		return nil, fmt.Errorf("node %s: an isolated node needs the cluster's network (Options.Network) and a name other than the first node's, %s", opts.Name, cp.NodeName)
	}
	if err := checkTools(opts.CNIPluginDir); err != nil {
		return nil, err
	}
	if cp.Network == nil { // else the apiserver reaches kubelets at their InternalIP
		if err := checkResolves(cp.NodeName); err != nil {
			return nil, err
		}
	}
	bins, err := nodeBinaries(ctx, cp)
	if err != nil {
		return nil, err
	}
	n = &Node{
		Name:               opts.Name,
		Dir:                opts.Dir,
		KubeletRootDir:     opts.KubeletRootDir,
		HostKubeletRootDir: opts.KubeletRootDir,
		CgroupRoot:         "/",
		nw:                 cp.Network,
		ContainerdSocket:   filepath.Join(opts.Dir, "run", "containerd.sock"),
		NRISocket:          filepath.Join(opts.Dir, "run", "nri.sock"),
		CNIBinDir:          filepath.Join(opts.Dir, "cni", "bin"),
		CNIConfDir:         filepath.Join(opts.Dir, "cni", "net.d"),
		cp:                 cp,
		bins:               bins,
		podCIDR:            opts.PodCIDR,
		log:                opts.Log,
	}
	n.CNIConfList = filepath.Join(n.CNIConfDir, "10-"+CNINetwork+".conflist")
	if cp.Network != nil {
		n.IP = cp.Network.Host
	}
	if opts.Isolated {
		n.KubeletRootDir = DefaultKubeletRootDir
		n.HostKubeletRootDir = filepath.Join(n.Dir, "nsroot", "var_lib_kubelet")
		n.CgroupRoot = "/xdpq-e2e-" + filepath.Base(n.Dir)
	}
	if err := os.MkdirAll(n.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	if n.lock, err = lockDir(ctx, n.Dir, "node", opts.Log); err != nil {
		return nil, err
	}
	if opts.Isolated {
		if n.IP, err = cp.Network.take(); err != nil {
			_ = n.lock.Close() // a lock file, never written
			return nil, err
		}
		// Before anything can fail into Stop: an isolated node's
		// clean-up must never be the first node's.
		n.ns = nsNames(n.Dir, n.IP)
	}
	n.cancel = onSignal(func() {
		if err := n.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
		}
	})
	started := n
	defer func() {
		if err != nil {
			err = errors.Join(err, started.Stop())
		}
	}()
	if err := n.cleanHost(true); err != nil {
		return nil, fmt.Errorf("node: clean up what a killed run left: %w", err)
	}
	if opts.Isolated {
		if err := makeCgroupRoot(n.CgroupRoot); err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
		if _, err := newNodeNS(ctx, n.Dir, cp.Network, n.IP, opts.AliasDir); err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
	} else if err := saveSysctls(n.path("sysctls.json")); err != nil { // an isolated node's are its namespace's, or the machine's
		return nil, fmt.Errorf("node: %w", err)
	}
	if err := n.writeCNI(opts.CNIPluginDir); err != nil {
		return nil, fmt.Errorf("node: CNI: %w", err)
	}
	if err := n.startContainerd(ctx); err != nil {
		return nil, err
	}
	pause, err := images.Build(ctx, images.Pause(), n.path("images"))
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	if err := n.ImportImage(ctx, pause); err != nil {
		return nil, err
	}
	if !opts.Isolated { // the first node runs them for the cluster
		if err := n.startControllers(bins); err != nil {
			return nil, err
		}
	}
	if err := n.startKubelet(ctx, bins[kubebin.Kubelet]); err != nil {
		return nil, err
	}
	if err := n.waitReady(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(n.log, "node: %s Ready in %s\n", n.Name, time.Since(t0).Round(time.Millisecond))
	return n, nil
}

// StartNodeForTest starts a node registered with cp and stops it when
// the test ends, before cp (t.Cleanup runs in reverse order).
func StartNodeForTest(tb testing.TB, cp *ControlPlane, opts NodeOptions) *Node {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout+20*time.Minute) // a fresh build included
	defer cancel()
	n, err := StartNode(ctx, cp, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := n.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return n
}

func (n *Node) path(elem ...string) string { return filepath.Join(append([]string{n.Dir}, elem...)...) }

// CDISpecDirs are where the node's containerd reads CDI specs: a DRA
// driver writes a claim's into the second (containerd's defaults).
var CDISpecDirs = []string{"/etc/cdi", "/var/run/cdi"}

// quoteList is a TOML list of strings.
func quoteList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, ", ")
}

// checkTools says which of the programs the node runs are missing.
func checkTools(cniDir string) error {
	var missing []string
	for _, t := range []string{"runc"} {
		if _, err := exec.LookPath(t); err != nil {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("node: no %s on PATH (Debian: apt-get install runc)", strings.Join(missing, ", "))
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(cniDir, p)); err != nil {
			return fmt.Errorf("node: CNI plugin %s: %w (Debian: apt-get install containernetworking-plugins)", p, err)
		}
	}
	return nil
}

// checkResolves checks that the node's name resolves to 127.0.0.1, the
// address the apiserver reaches the kubelet at.
func checkResolves(name string) error {
	addrs, err := net.LookupHost(name)
	if err == nil && slices.Contains(addrs, "127.0.0.1") {
		return nil
	}
	return fmt.Errorf("node: its name %s resolves to %v (%v), not 127.0.0.1: the apiserver reaches the kubelet by it (add \"127.0.0.1 %s\" to /etc/hosts)", name, addrs, err, name)
}

// nodeBinaries returns the control plane's binaries with the kubelet,
// kube-controller-manager and kube-scheduler, building those missing.
func nodeBinaries(ctx context.Context, cp *ControlPlane) (kubebin.Paths, error) {
	bins := kubebin.Paths{}
	var missing []string
	for _, b := range []string{kubebin.Kubelet, kubebin.KubeControllerManager, kubebin.KubeScheduler, kubebin.Containerd, kubebin.ContainerdShim, kubebin.Ctr} {
		if p, ok := cp.Binaries[b]; ok {
			bins[b] = p
		} else {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		built, err := kubebin.Ensure(ctx, kubebin.Options{Progress: cp.log}, missing...)
		if err != nil {
			return nil, err
		}
		for b, p := range built {
			bins[b] = p
		}
	}
	return bins, nil
}

// lockDir takes dir's lock, waiting while another holds it (one node
// per directory: a node uses its directory, the kubelet's port and, for
// the first node, the host's directories; go test runs packages in
// parallel) until ctx ends. what names the holder in errors: "node",
// "network".
func lockDir(ctx context.Context, dir, what string, log io.Writer) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(filepath.Dir(dir), "."+filepath.Base(dir)+".lock"), os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: lock: %w", what, err)
	}
	said := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close() // a lock file, never written
			return nil, fmt.Errorf("%s: lock %s: %w", what, dir, err)
		}
		if !said {
			fmt.Fprintf(log, "%s: another e2e %s holds %s; waiting for it to stop\n", what, what, dir)
			said = true
		}
		select {
		case <-ctx.Done():
			_ = f.Close() // a lock file, never written
			return nil, fmt.Errorf("%s: another e2e %s holds %s: %w", what, what, dir, ctx.Err())
		case <-time.After(500 * time.Millisecond): // no notification of another process's unlock to wait on
		}
	}
}

// writeCNI copies the plugins into the node's CNI bin directory and
// writes its network: a bridge with host-local addresses, the bridge the
// pods' gateway, nothing masqueraded.
func (n *Node) writeCNI(pluginDir string) error {
	for _, d := range []string{n.CNIBinDir, n.CNIConfDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if err := copyFile(filepath.Join(pluginDir, p), filepath.Join(n.CNIBinDir, p), 0o755); err != nil {
			return err
		}
	}
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       CNINetwork,
		"plugins": []any{map[string]any{
			"type":        "bridge",
			"bridge":      Bridge,
			"isGateway":   true,
			"ipMasq":      false,
			"hairpinMode": false,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": n.podCIDR}}},
				"dataDir": n.path("cni", "ipam"),
			},
		}},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(n.CNIConfList, b, 0o644)
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, mode)
}

// startContainerd starts a containerd of the node's own (root, state,
// socket and runc root in Dir, the CRI plugin with the node's CNI
// directories and the e2e pause image) and waits until its CRI answers.
func (n *Node) startContainerd(ctx context.Context) error {
	// containerd 2's configuration, version 3: the CRI plugin is split
	// into images and runtime. CDI is always on in containerd 2; NRI too,
	// its socket in the node's directory.
	config := fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q

[plugins.'io.containerd.internal.v1.opt']
  path = %[5]q

[plugins.'io.containerd.nri.v1.nri']
  socket_path = %[12]q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[6]q

[plugins.'io.containerd.cri.v1.runtime']
  # root cannot lower its oom_score_adj here: without this runc fails
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = [%[11]s]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      # The shim built with this containerd, not one on PATH.
      runtime_path = %[10]q
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[7]q
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[8]q]
    conf_dir = %[9]q
`, n.path("containerd", "root"), n.path("containerd", "state"), n.ContainerdSocket, n.ContainerdSocket+".ttrpc",
		n.path("containerd", "opt"), images.Pause().Ref, n.path("containerd", "runc"), n.CNIBinDir, n.CNIConfDir,
		n.bins[kubebin.ContainerdShim], quoteList(CDISpecDirs), n.NRISocket)
	if err := os.MkdirAll(filepath.Dir(n.ContainerdSocket), 0o755); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	cfg := n.path("containerd.toml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	p, err := n.start("containerd", n.bins[kubebin.Containerd], []string{"--config", cfg})
	if err != nil {
		return err
	}
	n.containerd = p
	return waitReady(ctx, p, func(ctx context.Context) error {
		_, err := n.Ctr(ctx, "version")
		return err
	})
}

// Ctr runs ctr against the node's containerd in the CRI namespace and
// returns its output; an error includes it.
func (n *Node) Ctr(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, n.bins[kubebin.Ctr], append([]string{"--address", n.ContainerdSocket, "--namespace", CRINamespace}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// ImportImage imports a docker-archive into the node's containerd, for
// pods with imagePullPolicy Never.
func (n *Node) ImportImage(ctx context.Context, archive string) error {
	if _, err := n.Ctr(ctx, "images", "import", archive); err != nil {
		return fmt.Errorf("node: import image: %w", err)
	}
	return nil
}

// startControllers starts kube-controller-manager (service accounts,
// kube-root-ca.crt, the DaemonSet and node lifecycle controllers) and
// kube-scheduler with identities of their own.
func (n *Node) startControllers(bins kubebin.Paths) error {
	kcm, sched := n.path("kube-controller-manager.kubeconfig"), n.path("kube-scheduler.kubeconfig")
	if err := n.cp.writeKubeconfig(kcm, "system:kube-controller-manager"); err != nil {
		return err
	}
	if err := n.cp.writeKubeconfig(sched, "system:kube-scheduler"); err != nil {
		return err
	}
	if _, err := n.start("kube-controller-manager", bins[kubebin.KubeControllerManager], []string{
		"--kubeconfig=" + kcm,
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + n.cp.saKey,
		"--root-ca-file=" + n.cp.CAFile,
		"--leader-elect=false",
		"--secure-port=0",
		"--v=1",
	}); err != nil {
		return err
	}
	_, err := n.start("kube-scheduler", bins[kubebin.KubeScheduler], []string{
		"--kubeconfig=" + sched,
		"--leader-elect=false",
		"--secure-port=0",
		"--v=1",
	})
	return err
}

// startKubelet starts the kubelet with the node's token (an isolated
// node's client certificate), a serving certificate of the cluster's CA,
// webhook authentication and authorization, and cgroupfs on this cgroup
// v1 machine. Without the cluster's network it listens on 127.0.0.1,
// which it refuses as a node IP: the apiserver reaches it by the node's
// Hostname address, its name, which must resolve to 127.0.0.1
// (/etc/hosts); its InternalIP is the address of the host's default
// route. On the cluster's network it listens on the node's address, its
// InternalIP, where the apiserver reaches it.
func (n *Node) startKubelet(ctx context.Context, path string) error {
	addr, hosts := "127.0.0.1", []string{"127.0.0.1", n.Name, "localhost"}
	if n.IP.IsValid() {
		addr = n.IP.String()
		hosts = append(hosts, addr)
	}
	serving, err := n.cp.ca.issue(pkix.Name{CommonName: n.Name}, hosts...)
	if err != nil {
		return fmt.Errorf("node: kubelet certificate: %w", err)
	}
	kubeconfig := n.cp.NodeKubeconfig
	if n.Name != n.cp.NodeName {
		// The token file cannot gain a user once the apiserver runs: a
		// client certificate of the node's identity.
		kubeconfig = n.path("kubelet.kubeconfig")
		if err := n.cp.writeCertKubeconfig(kubeconfig, pkix.Name{CommonName: "system:node:" + n.Name, Organization: []string{"system:nodes"}}); err != nil {
			return fmt.Errorf("node: %w", err)
		}
	}
	if err := serving.write(n.path("kubelet.crt"), n.path("kubelet.key")); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	config := map[string]any{
		"apiVersion":         "kubelet.config.k8s.io/v1beta1",
		"kind":               "KubeletConfiguration",
		"address":            addr,
		"port":               KubeletPort,
		"readOnlyPort":       0,
		"healthzPort":        0,
		"tlsCertFile":        n.path("kubelet.crt"),
		"tlsPrivateKeyFile":  n.path("kubelet.key"),
		"rotateCertificates": false,
		"serverTLSBootstrap": false,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": n.cp.CAFile},
		},
		"authorization": map[string]any{"mode": "Webhook"},
		// ConfigMap volumes are updated at a pod's sync: every 10 s here
		// rather than the default minute, so that a config change shows
		// in a test's time (a real node takes up to a minute or two).
		"syncFrequency":            "10s",
		"cgroupDriver":             "cgroupfs",
		"failCgroupV1":             false,
		"failSwapOn":               false,
		"makeIPTablesUtilChains":   false,
		"containerRuntimeEndpoint": "unix://" + n.ContainerdSocket,
		"podLogsDir":               n.path("pod-logs"),
		"staticPodPath":            "",
		// The machine's disk is shared and may be fuller than a real
		// node's thresholds: no eviction or image GC for disk space.
		"evictionHard": map[string]string{
			"memory.available":  "100Mi",
			"nodefs.available":  "1%",
			"nodefs.inodesFree": "1%",
			"imagefs.available": "1%",
		},
		"cgroupRoot":                  n.CgroupRoot,
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"serializeImagePulls":         false,
	}
	b, err := json.MarshalIndent(config, "", "  ")
	if err != nil {
		return err
	}
	cfg := n.path("kubelet.json")
	if err := os.WriteFile(cfg, b, 0o644); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.kubelet = path
	n.kubeletArgs = []string{
		"--config=" + cfg,
		"--kubeconfig=" + kubeconfig,
		"--root-dir=" + n.KubeletRootDir,
		"--hostname-override=" + n.Name,
		"--v=1",
	}
	if n.IP.IsValid() {
		n.kubeletArgs = append(n.kubeletArgs, "--node-ip="+addr)
	}
	_, err = n.start("kubelet", n.kubelet, n.kubeletArgs)
	return err
}

// RestartKubelet stops the kubelet (SIGTERM), starts it again with the
// same configuration, and waits until the Node is Ready. Containers keep
// running meanwhile, as on a node whose kubelet restarts.
func (n *Node) RestartKubelet(ctx context.Context) error {
	if err := n.StopKubelet(); err != nil {
		return fmt.Errorf("node: restart kubelet: %w", err)
	}
	return n.StartKubelet(ctx)
}

// StopKubelet stops the kubelet (SIGTERM). Containers keep running, the
// Node turns NotReady once the control plane misses its heartbeats.
func (n *Node) StopKubelet() error {
	n.mu.Lock()
	i := slices.IndexFunc(n.procs, func(p *process) bool { return p.name == "kubelet" })
	var old *process
	if i >= 0 {
		old = n.procs[i]
		n.procs = slices.Delete(n.procs, i, i+1)
	}
	n.mu.Unlock()
	if old == nil {
		return errors.New("node: stop kubelet: not running")
	}
	return old.stop()
}

// StartKubelet starts the kubelet StopKubelet stopped, with the same
// configuration, and waits until the Node is Ready.
func (n *Node) StartKubelet(ctx context.Context) error {
	if _, err := n.start("kubelet", n.kubelet, n.kubeletArgs); err != nil {
		return err
	}
	return n.waitReady(ctx)
}

// waitReady watches the Node until it is Ready and untainted (the node
// lifecycle controller removes not-ready), or a component exits.
func (n *Node) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	exited := make(chan *process, 1)
	n.mu.Lock()
	procs := append([]*process(nil), n.procs...)
	n.mu.Unlock()
	for _, p := range procs {
		go func() {
			select {
			case <-p.done:
				exited <- p
			case <-ctx.Done():
			}
		}()
	}
	var last *corev1.Node
	for {
		w, err := n.cp.Client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", n.Name).String()})
		if err != nil {
			return fmt.Errorf("node: watch %s: %w", n.Name, err)
		}
	events:
		for {
			select {
			case p := <-exited:
				w.Stop()
				return fmt.Errorf("node: %w", p.exitError())
			case <-ctx.Done():
				w.Stop()
				return fmt.Errorf("node %s not Ready: %w (last seen: %s)\n%s", n.Name, ctx.Err(), nodeState(last), n.kubeletTail())
			case ev, ok := <-w.ResultChan():
				if !ok {
					break events // the watch ended: watch again
				}
				if ev.Type == watch.Error {
					w.Stop()
					return fmt.Errorf("node: watch %s: %v", n.Name, ev.Object)
				}
				node, ok := ev.Object.(*corev1.Node)
				if !ok {
					continue
				}
				last = node
				if nodeReady(node) {
					w.Stop()
					return nil
				}
			}
		}
	}
}

func (n *Node) kubeletTail() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.procs {
		if p.name == "kubelet" {
			return p.tail(30)
		}
	}
	return ""
}

func nodeReady(node *corev1.Node) bool {
	for _, t := range node.Spec.Taints {
		if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
			return false
		}
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func nodeState(node *corev1.Node) string {
	if node == nil {
		return "not registered"
	}
	var s []string
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			s = append(s, fmt.Sprintf("Ready=%s (%s: %s)", c.Status, c.Reason, c.Message))
		}
	}
	for _, t := range node.Spec.Taints {
		s = append(s, "taint "+t.ToString())
	}
	return strings.Join(s, ", ")
}

// start runs a program of the node, registered for Stop; an isolated
// node's in its namespaces.
func (n *Node) start(name, path string, args []string) (*process, error) {
	if n.ns != nil {
		path, args = n.ns.wrap(path, args)
	}
	p, err := start(name, n.Dir, path, args, nil)
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	n.mu.Lock()
	stopped := n.stopped
	if !stopped {
		n.procs = append(n.procs, p)
	}
	n.mu.Unlock()
	if stopped { // by a Ctrl-C while it started
		return nil, errors.Join(errors.New("node: stopped"), p.stop())
	}
	fmt.Fprintf(n.log, "node: started %s (pid %d), log %s\n", name, p.cmd.Process.Pid, p.log)
	return p, nil
}

// Stop tears the node down: the kubelet stopped, every pod sandbox
// stopped and removed through the CRI (containers killed, CNI DEL run),
// the controllers and containerd stopped; then what may remain removed:
// shims, processes and cgroups of pods, mounts under the node's and the
// kubelet's directories, the bridge, the node's directory and what the
// kubelet wrote in its root directory and /var/log/containers. The
// sysctls the kubelet changed get their values of before StartNode. It
// is safe to call more than once and concurrently; every call returns
// the first one's result.
func (n *Node) Stop() error {
	n.stopOnce.Do(func() {
		if n.cancel != nil {
			n.cancel()
		}
		n.mu.Lock()
		procs := n.procs
		n.procs, n.stopped = nil, true
		n.mu.Unlock()
		var errs []error
		stop := func(name string) {
			for _, p := range procs {
				if p.name == name {
					errs = append(errs, p.stop())
				}
			}
		}
		stop("kubelet")
		if n.containerd != nil {
			select {
			case <-n.containerd.done:
			default:
				errs = append(errs, n.removePods())
			}
		}
		stop("kube-scheduler")
		stop("kube-controller-manager")
		stop("containerd")
		errs = append(errs, n.cleanHost(false))
		if n.ns != nil {
			n.nw.release(n.IP)
		}
		if n.lock != nil {
			// Closing frees the descriptor, and with it the lock, even
			// when it reports an error.
			_ = n.lock.Close()
		}
		n.stopErr = errors.Join(errs...)
	})
	return n.stopErr
}

// removePods stops and removes every pod sandbox of the node's
// containerd through the CRI, as a kubelet would: containers killed, CNI
// DEL run, namespaces and mounts released.
func (n *Node) removePods() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt, err := dialCRI(ctx, n.ContainerdSocket)
	if err != nil {
		return fmt.Errorf("node: remove pods: %w", err)
	}
	defer func() { _ = rt.Close() }() // a connection whose calls were answered or failed
	return rt.removeAllPods(ctx)
}
