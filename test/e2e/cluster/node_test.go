package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/test/e2e/images"
)

// TestNodeRunsPod starts a control plane and a node, runs a pod of the
// hello image (imported with ctr, never pulled) to completion, reads its
// log with kubectl, does the same with xdpq's image (make image's), and
// tears the node down, checking it left nothing:
// no process, mount, cgroup, bridge, shim or directory of its own, and
// the sysctls the kubelet changed back at their values.
func TestNodeRunsPod(t *testing.T) {
	testnet.RequireRoot(t)
	testnet.RequireTool(t, "runc", "runc")
	testnet.RequireTool(t, "containernetworking-plugins", filepath.Join(DefaultCNIPluginDir, "bridge"))
	sysctls := readSysctls(t)

	cp := StartControlPlaneForTest(t, Options{})
	n := StartNodeForTest(t, cp, NodeOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	runHello(ctx, t, cp, n)

	// xdpq's image, as make image builds it: the daemon's -h in a pod.
	archive, ref, err := images.Xdpq(ctx, "v0.0.0-e2e", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := n.ImportImage(ctx, archive); err != nil {
		t.Fatal(err)
	}
	pod := helloPod("xdpq")
	pod.Spec.Containers[0].Image = ref
	pod.Spec.Containers[0].Command = []string{"/usr/local/bin/xdpq-deviceplugin", "-h"}
	if _, err := cp.Client.CoreV1().Pods("e2e-node").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.WaitPod(ctx, "e2e-node", pod.Name, PodSucceeded); err != nil {
		t.Fatal(err)
	}
	out, err := cp.Kubectl(ctx, "logs", "-n", "e2e-node", pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "-standalone") {
		t.Errorf("kubectl logs of the xdpq image's daemon -h:\n%s", out)
	}

	if err := n.Stop(); err != nil {
		t.Fatal(err)
	}
	assertNodeGone(t, n)
	if after := readSysctls(t); !slices.Equal(after, sysctls) {
		t.Errorf("sysctls after Stop %q, before StartNode %q", after, sysctls)
	}
}

// assertNodeGone checks that a stopped node left nothing behind.
func assertNodeGone(t *testing.T, n *Node) {
	t.Helper()
	for _, d := range []string{n.Dir, n.KubeletRootDir} {
		mps, err := mountsUnder(d)
		if err != nil {
			t.Fatal(err)
		}
		if len(mps) > 0 {
			t.Errorf("mounts left under %s: %q", d, mps)
		}
	}
	if _, err := os.Stat(n.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after Stop: %v, want removed", n.Dir, err)
	}
	if entries, err := os.ReadDir(n.KubeletRootDir); err == nil {
		for _, e := range entries {
			if e.Name() != "device-plugins" {
				t.Errorf("%s left in the kubelet's root directory", e.Name())
			}
		}
	}
	if _, err := os.Stat(filepath.Join(n.KubeletRootDir, "device-plugins", "kubelet.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the kubelet's device plugin socket after Stop: %v, want removed", err)
	}
	if _, err := netlink.LinkByName(Bridge); err == nil {
		t.Errorf("bridge %s left", Bridge)
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods"); len(m) > 0 {
		t.Errorf("pod cgroups left: %q", m)
	}
	if m, _ := filepath.Glob(filepath.Join(cniCacheDir, CNINetwork+"-*")); len(m) > 0 {
		t.Errorf("CNI cache entries left: %q", m)
	}
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), n.Dir) {
			t.Errorf("process %s left: %q", e.Name(), strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}

func readSysctls(t *testing.T) []string {
	t.Helper()
	var vals []string
	for _, s := range kubeletSysctls() {
		b, err := os.ReadFile(filepath.Join("/proc/sys", s))
		if err != nil {
			t.Fatal(err)
		}
		vals = append(vals, s+"="+strings.TrimSpace(string(b)))
	}
	return vals
}

// helloPod is a pod of the hello image with args, never pulled, never
// restarted, with the restricted Pod Security profile's settings.
func helloPod(name string, args ...string) *corev1.Pod {
	no, yes := false, true
	uid := int64(65534)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64),
			AutomountServiceAccountToken:  &no,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   &yes,
				RunAsUser:      &uid,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            "hello",
				Image:           images.Hello().Ref,
				ImagePullPolicy: corev1.PullNever,
				Args:            args,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: &no,
					ReadOnlyRootFilesystem:   &yes,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

// BenchmarkPodStartup measures the time from a pod's creation to its
// Running phase on a warm node (the hello image, -wait), one pod at a
// time; it reports the median and the 90th percentile.
//
//	flock -o /tmp/xdpq-kernel.lock go test -run '^$' -bench PodStartup -benchtime 10x ./cluster
func BenchmarkPodStartup(b *testing.B) {
	testnet.RequireRoot(b)
	cp := StartControlPlaneForTest(b, Options{})
	n := StartNodeForTest(b, cp, NodeOptions{})
	ctx := context.Background()
	ns := "e2e-bench"
	helloOn(ctx, b, cp, ns, n)
	var took []time.Duration
	b.ResetTimer()
	for i := range b.N {
		pod := helloPod(fmt.Sprintf("bench-%d", i), "-wait")
		start := time.Now()
		if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		if _, err := cp.WaitPod(ctx, ns, pod.Name, PodRunning); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Milliseconds()), "ms-p50")
	b.ReportMetric(float64(took[len(took)*9/10].Milliseconds()), "ms-p90")
	b.Logf("pod create to Running, %d pods: %v", len(took), took)
}

// killedEnv makes the test binary run nodeKilledChild for
// TestNodeAfterKill instead of skipping it.
const killedEnv = "XDPQ_E2E_KILLED_HELPER"

// TestNodeAfterKill kills (SIGKILL: no teardown runs) a child test
// process whose node runs a pod, then starts a node in the same
// directories: StartNode removes what the killed one left (its shim and
// pod still running, mounts, cgroups, bridge) and the new node runs a
// pod; its Stop leaves nothing.
func TestNodeAfterKill(t *testing.T) {
	testnet.RequireRoot(t)
	testnet.RequireTool(t, "containerd runc", "containerd")
	sysctls := readSysctls(t)
	killChild(t, "1")
	// What the killed run left: its pod's shim.
	ctdSocket := filepath.Join(DefaultNodeDir, "run", "containerd.sock")
	if shims := shimPids(t, ctdSocket); len(shims) == 0 {
		t.Fatal("the killed node left no shim: the test would prove nothing")
	}

	cp := StartControlPlaneForTest(t, Options{})
	n := StartNodeForTest(t, cp, NodeOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if shims := shimPids(t, ctdSocket); len(shims) != 0 {
		t.Errorf("shims of the killed node's containerd after StartNode: %v", shims)
	}
	runHello(ctx, t, cp, n)
	if err := n.Stop(); err != nil {
		t.Fatal(err)
	}
	assertNodeGone(t, n)
	if after := readSysctls(t); !slices.Equal(after, sysctls) {
		t.Errorf("sysctls after Stop %q, before the killed run %q", after, sysctls)
	}
}

// killChild runs the test binary as nodeKilledChild with killedEnv set
// to mode, waits until it says its pods run, and kills it (SIGKILL: no
// teardown runs). The killed control plane's directory goes when the
// test ends.
func killChild(t *testing.T, mode string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.v")
	cmd.Env = append(os.Environ(), killedEnv+"="+mode)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	var cpDir string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "RUNNING "); ok {
			cpDir = d
			break
		}
	}
	if cpDir == "" {
		t.Fatalf("the child did not run its pods (scan: %v)", sc.Err())
	}
	t.Cleanup(func() { os.RemoveAll(cpDir) })
	cmd.Process.Kill()
	go io.Copy(io.Discard, stdout)
}

// nodeKilledChild is TestNodeAfterKill's child (TestMain runs it when
// killedEnv is set): it starts a node (and a second, isolated one when
// killedEnv is "two"), runs a pod on each, prints its control plane's
// directory and waits to be killed.
func nodeKilledChild() error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "xdpq-e2e-")
	if err != nil {
		return err
	}
	two := os.Getenv(killedEnv) == "two"
	cp, err := StartControlPlane(ctx, dir, Options{Network: two})
	if err != nil {
		return err
	}
	n, err := StartNode(ctx, cp, NodeOptions{})
	if err != nil {
		return err
	}
	nodes := []*Node{n}
	if two {
		w, err := StartNode(ctx, cp, workerOptions())
		if err != nil {
			return err
		}
		nodes = append(nodes, w)
	}
	tmp, err := os.MkdirTemp("", "xdpq-e2e-image-")
	if err != nil {
		return err
	}
	hello, err := images.Build(ctx, images.Hello(), tmp)
	if err != nil {
		return err
	}
	if err := cp.CreateNamespace(ctx, "e2e-killed", nil); err != nil {
		return err
	}
	for i, n := range nodes {
		if err := n.ImportImage(ctx, hello); err != nil {
			return err
		}
		pod := helloPod(fmt.Sprintf("waits-%d", i), "-wait")
		pod.Spec.NodeName = n.Name
		if _, err := cp.Client.CoreV1().Pods("e2e-killed").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return err
		}
		if _, err := cp.WaitPod(ctx, "e2e-killed", pod.Name, PodRunning); err != nil {
			return err
		}
	}
	fmt.Printf("RUNNING %s\n", cp.Dir)
	select {}
}

// shimPids returns the shims serving the containerd at socket.
func shimPids(t *testing.T, socket string) []string {
	t.Helper()
	var pids []string
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), "containerd-shim") && strings.Contains(string(b), "\x00"+socket+"\x00") {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// runHello runs a pod of the hello image to completion on n and reads
// its log with kubectl.
func runHello(ctx context.Context, t *testing.T, cp *ControlPlane, n *Node) {
	t.Helper()
	ns := "e2e-node"
	helloOn(ctx, t, cp, ns, n)
	pod := helloPod("hello", "from", "e2e")
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := cp.WaitPod(ctx, ns, pod.Name, PodSucceeded)
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.NodeName != n.Name || got.Status.PodIP == "" {
		t.Errorf("pod on node %q with IP %q, want on %s with an address of %s", got.Spec.NodeName, got.Status.PodIP, n.Name, DefaultPodCIDR)
	}
	out, err := cp.Kubectl(ctx, "logs", "-n", ns, pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != "hello from e2e\n" {
		t.Errorf("kubectl logs: %q, want %q", out, "hello from e2e\n")
	}
}

// helloOn builds the hello image, imports it into each of nodes and
// creates the namespace ns; it returns the image's archive, for a node
// that starts later.
func helloOn(ctx context.Context, tb testing.TB, cp *ControlPlane, ns string, nodes ...*Node) string {
	tb.Helper()
	hello, err := images.Build(ctx, images.Hello(), tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	for _, n := range nodes {
		if err := n.ImportImage(ctx, hello); err != nil {
			tb.Fatal(err)
		}
	}
	if err := cp.CreateNamespace(ctx, ns, nil); err != nil {
		tb.Fatal(err)
	}
	return hello
}
