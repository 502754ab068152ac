package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/xsk"
	"github.com/xdpq/xdpq/test/e2e/cluster"
	"github.com/xdpq/xdpq/test/e2e/images"
	"github.com/xdpq/xdpq/test/e2e/kubebin"
)

// The scenario's pool, its resource and the NIC's name and queues.
const (
	scenarioPool     = "upf"
	scenarioResource = "xdpq.io/" + scenarioPool
	scenarioNIC      = "xdpqnic0"
	scenarioQueues   = 4
	// pinDir is the chart's daemon's pin directory (hostPaths.bpffs/xdpq).
	pinDir = "/sys/fs/bpf/xdpq"
)

// TestScenario is issue 14's scenario on a real node: xdpq installed by
// its Helm chart on a kubelet with containerd, a pool on a veth "NIC"'s
// four queues (software steering: veth has no ntuple filters), pods of
// a restricted namespace receiving the frames of their flows annotation
// through a real container runtime, and kubectl's view of them.
//
// xdpq's CNI plugin is installed by the chart but not in the node's
// conflist: the pods' flows come from their xdpq.io/flows annotation,
// their addresses from bridge.
func TestScenario(t *testing.T) {
	testnet.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute) // a fresh build included
	defer cancel()
	sharedMounts(t) // undone after the node's teardown
	if _, err := os.Stat(pinDir); err == nil {
		t.Fatalf("%s exists: a daemon or a killed run left it; remove it first", pinDir)
	}
	clearHostState(t)
	t.Cleanup(func() {
		if err := os.RemoveAll(pinDir); err != nil {
			t.Errorf("remove the daemon's pins: %v", err)
		}
	})
	cp := cluster.StartControlPlaneForTest(t, cluster.Options{})
	node := cluster.StartNodeForTest(t, cp, cluster.NodeOptions{})
	nic := cluster.AddNICForTest(t, scenarioNIC, scenarioQueues)
	archive, ref, err := images.Xdpq(ctx, "0.0.0-e2e", node.Dir+"/images")
	if err != nil {
		t.Fatal(err)
	}
	if err := node.ImportImage(ctx, archive); err != nil {
		log, _ := os.ReadFile(filepath.Join(node.Dir, "containerd.log"))
		t.Fatalf("%v; containerd's log ends:\n%s", err, tail(log, 4000))
	}
	k := kubectl{path: cp.Binaries[kubebin.Kubectl], kubeconfig: cp.Kubeconfig, pluginDir: buildPlugin(ctx, t)}
	repo, tag, _ := strings.Cut(ref, ":")
	api, err := url.Parse(cp.URL)
	if err != nil {
		t.Fatal(err)
	}

	// 1. helm install: the DaemonSet Ready, the node advertising the
	// pool's 4 queues, the XdpqNode showing the netdev and the pool.
	installed := time.Now()
	out, err := cp.Helm(ctx, "install", "xdpq", repoRoot+"/charts/xdpq", "-n", "kube-system",
		"--set", "image.repository="+repo, "--set", "image.tag="+tag, "--set", "image.pullPolicy=Never",
		"--set", "cni.binDir="+node.CNIBinDir,
		"--set", "kubelet.rootDir="+node.KubeletRootDir,
		// /var/run is a symlink to /run; containerd looks for the mount
		// of the path as given and finds this machine's private root
		// (on a systemd node / is shared and /var/run/netns works).
		"--set", "hostPaths.netns=/run/netns",
		// No kube-proxy on this node: the kubernetes Service's address
		// leads nowhere from the host network.
		"--set", "apiServer.host="+api.Hostname(), "--set-string", "apiServer.port="+api.Port(),
		"--set", "config.pools[0].name="+scenarioPool,
		"--set", "config.pools[0].devices.netdevs[0]="+scenarioNIC+"#0-3",
		"--set", "config.pools[0].steering=software",
		"--set", "debug=true")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, args := range [][]string{
				{"-n", "kube-system", "describe", "pods"},
				{"-n", "kube-system", "logs", "daemonset/xdpq", "--all-containers", "--tail=200"},
			} {
				out, _ := cp.Kubectl(context.Background(), args...)
				t.Logf("kubectl %s:\n%s", strings.Join(args, " "), out)
			}
		}
	})
	if out, err := cp.Kubectl(ctx, "-n", "kube-system", "rollout", "status", "daemonset/xdpq", "--timeout=150s"); err != nil {
		t.Fatalf("the DaemonSet never became Ready: %v\n%s", err, out)
	}
	t.Logf("helm install to DaemonSet Ready: %s", time.Since(installed).Round(time.Millisecond))
	waitAllocatable(ctx, t, cp, node.Name, scenarioQueues)
	out, err = cp.Kubectl(ctx, "get", "xdpqnodes", "-o", "wide")
	if err != nil || !strings.Contains(string(out), node.Name) {
		t.Fatalf("kubectl get xdpqnodes: %v\n%s", err, out)
	}
	t.Logf("kubectl get xdpqnodes -o wide:\n%s", out)
	out, err = cp.Kubectl(ctx, "get", "xdpqnode", node.Name, "-o", "yaml")
	if err != nil || !strings.Contains(string(out), "name: "+scenarioNIC) || !strings.Contains(string(out), "name: "+scenarioPool) {
		t.Errorf("the XdpqNode lacks netdev %s or pool %s: %v\n%s", scenarioNIC, scenarioPool, err, out)
	}

	// 2. Pods of a restricted namespace, two queues each.
	const ns = "telco"
	if err := cp.CreateNamespace(ctx, ns, map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}); err != nil {
		t.Fatal(err)
	}
	a := startPerfPod(ctx, t, cp, ns, "rx-a", ref, 5000)
	b := startPerfPod(ctx, t, cp, ns, "rx-b", ref, 5001)
	t.Logf("helm install to the first pod's sockets: %s", a.ready.Sub(installed).Round(time.Millisecond))
	if got := append(append([]int(nil), a.queues...), b.queues...); len(a.queues) != 2 || len(b.queues) != 2 || !distinct(got, scenarioQueues) {
		t.Fatalf("queues: rx-a %v, rx-b %v; want two each, all four distinct", a.queues, b.queues)
	}
	third := perfPod(ns, "rx-c", ref, 5002)
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, third, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.WaitPod(ctx, ns, "rx-c", podUnschedulable); err != nil {
		t.Errorf("a third pod asking for 2 of no free queue: %v", err)
	}

	// Each pod's flow, sent on its queues from the NIC's peer, and a
	// frame of no pod's flow on each queue.
	for _, p := range []*perfRun{a, b} {
		waitFlowsApplied(ctx, t, cp, ns, p.name)
	}
	const perQueue = 1000
	firstFrame := time.Now()
	sendTo(t, nic, a, perQueue)
	t.Logf("helm install to the first frames sent to a pod: %s", firstFrame.Sub(installed).Round(time.Millisecond))
	sendTo(t, nic, b, perQueue)

	// 3. kubectl shows both pods' queues.
	out, err = cp.Kubectl(ctx, "get", "xdpqnodes")
	t.Logf("kubectl get xdpqnodes:\n%s", out)
	if err != nil || !strings.Contains(string(out), "4/4") {
		t.Errorf("kubectl get xdpqnodes, want 4/4 queues allocated: %v\n%s", err, out)
	}
	// The daemon writes its XdpqNode a little after a pod binds its
	// allocation: wait for both rows (the API's state, no notification
	// of it to wait on but a watch of the same object).
	var pods string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var stderr string
		pods, stderr, err = k.run(ctx, "xdpq", "pods", "-n", ns)
		if err != nil {
			return false, fmt.Errorf("kubectl xdpq pods: %w: %s", err, stderr)
		}
		for _, p := range []*perfRun{a, b} {
			want := fmt.Sprintf(`(?m)^%s\s+%s\s+%s\s+%s\s+%s\s+udp %s:%d\s+connected`, p.name, node.Name, scenarioNIC, scenarioPool,
				queueList(p.queues), regexp.QuoteMeta(p.ip.String()), p.port)
			if !regexp.MustCompile(want).MatchString(pods) {
				return false, nil
			}
		}
		return true, nil
	})
	t.Logf("kubectl xdpq pods -n %s:\n%s", ns, pods)
	if err != nil {
		t.Errorf("kubectl xdpq pods never showed both pods' queues, flows and leases: %v", err)
	}

	// The pods stop (SIGTERM) and report what they received: every frame
	// of their flow, nothing else.
	for _, p := range []*perfRun{a, b} {
		if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, p.name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []*perfRun{a, b} {
		rx := p.totals(t)
		t.Logf("%s: sent %d frames of its flow and 1 of another on each of queues %v; xdpqperf received %v", p.name, perQueue, p.queues, rx)
		for _, q := range p.queues {
			if rx[q] != perQueue {
				t.Errorf("%s: queue %d received %d frames, sent %d of its flow (and 1 of another)", p.name, q, rx[q], perQueue)
			}
		}
		if len(rx) != len(p.queues) {
			t.Errorf("%s reported queues %v, want %v", p.name, rx, p.queues)
		}
	}

	// 8. The pods gone, their queues are free: the Pending pod gets two.
	if _, err := cp.WaitPod(ctx, ns, "rx-c", cluster.PodRunning); err != nil {
		t.Errorf("the third pod, once the others are gone: %v", err)
	}
	if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, "rx-c", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	if out, err := cp.Kubectl(ctx, "-n", ns, "wait", "--for=delete", "pod/rx-c", "--timeout=60s"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// helm uninstall: no program on the NIC, no pin, no CNI plugin left.
	if out, err := cp.Helm(ctx, "uninstall", "xdpq", "-n", "kube-system", "--wait", "--timeout=2m"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := cp.Kubectl(ctx, "-n", "kube-system", "wait", "--for=delete", "pod", "-l", "app.kubernetes.io/name=xdpq", "--timeout=2m"); err != nil {
		t.Errorf("the daemon's pod after helm uninstall: %v\n%s", err, out)
	}
	// The daemon saw its DaemonSet deleted and removed its datapath.
	if l, err := netlink.LinkByIndex(nic.Index); err != nil {
		t.Error(err)
	} else if x := l.Attrs().Xdp; x != nil && x.Attached {
		t.Errorf("helm uninstall left XDP program %d on %s", x.ProgId, nic.Name)
	}
	for _, dir := range []string{pinDir, "/run/xdpq/agent", "/run/xdpq/alloc"} {
		if ents, err := os.ReadDir(dir); !os.IsNotExist(err) {
			t.Errorf("helm uninstall left %s (%d entries, %v)", dir, len(ents), err)
		}
	}
	if _, err := os.Stat(filepath.Join(node.CNIBinDir, "xdpq")); !os.IsNotExist(err) {
		t.Errorf("helm uninstall left the CNI plugin in %s: %v", node.CNIBinDir, err)
	}
}

// tail is b's last n bytes.
func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// sharedMounts makes the node's bpffs and /run/netns shared mounts, as
// systemd makes every mount on a real node: the chart mounts both
// HostToContainer, which containerd refuses for a private mount ("is
// mounted on ... but it is not a shared or slave mount"). This machine's
// mounts are private. The test's cleanup makes them private again.
func sharedMounts(t *testing.T) {
	t.Helper()
	if err := unix.Mount("", "/sys/fs/bpf", "", unix.MS_SHARED, ""); err != nil {
		t.Fatalf("make /sys/fs/bpf shared: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Mount("", "/sys/fs/bpf", "", unix.MS_PRIVATE, ""); err != nil {
			t.Errorf("make /sys/fs/bpf private again: %v", err)
		}
	})
	const netns = "/run/netns"
	if err := os.MkdirAll(netns, 0o755); err != nil {
		t.Fatal(err)
	}
	// A bind mount of itself, as iproute2's `ip netns add` makes it.
	if err := unix.Mount(netns, netns, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind-mount %s: %v", netns, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(netns, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", netns, err)
		}
	})
	if err := unix.Mount("", netns, "", unix.MS_SHARED, ""); err != nil {
		t.Fatalf("make %s shared: %v", netns, err)
	}
}

// perfPod is a restricted pod of the xdpq image running xdpqperf on two
// queues of the pool, its flows annotation UDP to its own address and
// port.
func perfPod(ns, name, image string, port int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Annotations: map[string]string{"xdpq.io/flows": fmt.Sprintf(`[{"protocol":"udp","destinationPort":"%d"}]`, port)}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](30),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				RunAsUser:      ptr.To[int64](65534),
				RunAsGroup:     ptr.To[int64](65534),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            "xdpqperf",
				Image:           image,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"/usr/local/bin/xdpqperf", "-mode", "rxdrop"},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					scenarioResource: resource.MustParse("2"),
				}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

// perfRun is a running xdpqperf pod: its queues, address and port, and
// its log, followed.
type perfRun struct {
	name   string
	ip     netip.Addr
	port   int
	queues []int
	ready  time.Time // when it said it had its sockets
	lines  chan string
}

var perfStart = regexp.MustCompile(`^xdpqperf rxdrop: allocation \S+, (\S+) queues \[([0-9 ]*)\]`)

// startPerfPod creates a perfPod, waits until it runs and has its
// sockets (its first line says so), and follows its log.
func startPerfPod(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns, name, image string, port int) *perfRun {
	t.Helper()
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, perfPod(ns, name, image, port), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	pod, err := cp.WaitPod(ctx, ns, name, cluster.PodRunning)
	if err != nil {
		t.Fatal(err)
	}
	r := &perfRun{name: name, port: port, lines: make(chan string, 64)}
	if r.ip, err = netip.ParseAddr(pod.Status.PodIP); err != nil {
		t.Fatalf("pod %s's IP %q: %v", name, pod.Status.PodIP, err)
	}
	logs, err := cp.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Follow: true}).Stream(ctx)
	if err != nil {
		t.Fatalf("follow pod %s's log: %v", name, err)
	}
	go func() {
		defer close(r.lines)
		defer logs.Close()
		s := bufio.NewScanner(logs)
		for s.Scan() {
			r.lines <- s.Text()
		}
	}()
	var m []string
	var before []string
	for m == nil {
		select {
		case l, ok := <-r.lines:
			if !ok {
				t.Fatalf("pod %s ended before it said it had its sockets; its log:\n%s", name, strings.Join(before, "\n"))
			}
			if m = perfStart.FindStringSubmatch(l); m == nil {
				before = append(before, l)
			}
		case <-ctx.Done():
			t.Fatalf("pod %s never said it had its sockets", name)
		}
	}
	r.ready = time.Now()
	for _, f := range strings.Fields(m[2]) {
		q, _ := strconv.Atoi(f)
		r.queues = append(r.queues, q)
	}
	if m[1] != scenarioNIC {
		t.Errorf("pod %s's queues are on %s, want %s", name, m[1], scenarioNIC)
	}
	return r
}

var perfTotal = regexp.MustCompile(`^total q(\d+): rx (\d+) tx \d+$`)

// totals reads the pod's log to its end and returns its per-queue rx
// totals.
func (r *perfRun) totals(t *testing.T) map[int]uint64 {
	t.Helper()
	rx := map[int]uint64{}
	var all []string
	for l := range r.lines {
		all = append(all, l)
		if m := perfTotal.FindStringSubmatch(l); m != nil {
			q, _ := strconv.Atoi(m[1])
			rx[q], _ = strconv.ParseUint(m[2], 10, 64)
		}
	}
	if len(rx) == 0 {
		t.Errorf("pod %s reported no totals; its log:\n%s", r.name, strings.Join(all, "\n"))
	}
	return rx
}

// sendTo sends n frames of r's flow from each of the peer's tx queues
// that arrive on r's queues, and one frame to another port on each.
func sendTo(t *testing.T, nic *cluster.NIC, r *perfRun, n int) {
	t.Helper()
	qs := make([]uint32, len(r.queues))
	for i, q := range r.queues {
		qs[i] = uint32(q)
	}
	dev := xsk.Netdev{Name: nic.Peer, NetNS: nic.PeerNS.Path()}
	if err := nic.PeerNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(nic.Peer)
		if err == nil {
			dev.Ifindex = l.Attrs().Index
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	umem, socks, err := xsk.Open(dev, qs, 1024*len(qs), xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048},
		Rings: xsk.Rings{Fill: 64, Completion: 512, TX: 512}})
	if err != nil {
		t.Fatalf("open the peer's queues %v: %v", qs, err)
	}
	defer umem.Close()
	src := netip.MustParseAddr("10.9.0.1")
	for i, s := range socks {
		defer s.Close()
		var frames [][]byte
		for j := range n + 1 {
			port := uint16(r.port)
			if j == n {
				port = 9 // discard: no pod's flow
			}
			f, err := frame.Spec{SrcMAC: nic.PeerMAC, DstMAC: nic.MAC, Src: src, Dst: r.ip, Protocol: 17,
				SrcPort: 4000, DstPort: port, Payload: frame.Payload(uint32(i), uint64(j), 40)}.Build()
			if err != nil {
				t.Fatal(err)
			}
			frames = append(frames, f)
		}
		addrs := make([]uint64, 1024)
		for j := range addrs {
			addrs[j] = umem.FrameAddr(i*1024 + j)
		}
		if err := traffic.NewSender(s, addrs, 0).Send(frames, time.Now().Add(10*time.Second)); err != nil {
			t.Fatalf("send on the peer's queue %d: %v", qs[i], err)
		}
	}
}

// waitAllocatable waits until the node's allocatable has want of the
// scenario's resource.
func waitAllocatable(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, node string, want int64) {
	t.Helper()
	var got resource.Quantity
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := cp.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got = n.Status.Allocatable[scenarioResource]
		return got.Value() == want, nil
	})
	if err != nil {
		t.Fatalf("node %s's allocatable %s is %s, want %d: %v", node, scenarioResource, got.String(), want, err)
	}
}

// waitFlowsApplied waits for the daemon's FlowsApplied Event on the pod.
func waitFlowsApplied(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns, pod string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		evs, err := cp.Client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == pod && e.Reason == "FlowsRefused" {
				return false, fmt.Errorf("flows refused: %s", e.Note)
			}
			if e.Regarding.Name == pod && e.Reason == "FlowsApplied" {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		out, _ := cp.Kubectl(ctx, "-n", ns, "get", "events")
		t.Fatalf("pod %s's flows never applied: %v\n%s", pod, err, out)
	}
}

// podUnschedulable is true when the scheduler found no node for the pod.
func podUnschedulable(p *corev1.Pod) (bool, error) {
	if p.Status.Phase != corev1.PodPending {
		return false, fmt.Errorf("pod %s is %s, want Pending", p.Name, p.Status.Phase)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true, nil
		}
	}
	return false, nil
}

// distinct reports whether qs are distinct queues below n.
func distinct(qs []int, n int) bool {
	seen := map[int]bool{}
	for _, q := range qs {
		if q < 0 || q >= n || seen[q] {
			return false
		}
		seen[q] = true
	}
	return true
}

// queueList is kubectl xdpq's QUEUES cell of consecutive or listed
// queues.
func queueList(qs []int) string {
	if len(qs) == 2 && qs[1] == qs[0]+1 {
		return fmt.Sprintf("%d-%d", qs[0], qs[1])
	}
	s := make([]string, len(qs))
	for i, q := range qs {
		s[i] = strconv.Itoa(q)
	}
	return strings.Join(s, ",")
}

// clearHostState removes what a previous run's daemon left in /run/xdpq
// (the chart's host path for its state and sockets), unless a daemon runs
// there: then the test cannot run.
func clearHostState(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile("/run/xdpq/agent/daemon.lock", os.O_RDWR, 0)
	if err == nil {
		defer f.Close()
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			t.Fatalf("an xdpq daemon runs on /run/xdpq/agent (%v): stop it first", err)
		}
	}
	for _, dir := range []string{"/run/xdpq/agent", "/run/xdpq/alloc"} {
		if _, err := os.Stat(dir); err == nil {
			t.Logf("removing %s, left by an earlier daemon", dir)
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
		}
	}
}
