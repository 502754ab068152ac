package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/xdpq/xdpq/internal/kubectlxdpq"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/test/e2e/cluster"
	"github.com/xdpq/xdpq/test/e2e/kubebin"
)

// topScreen is where TestKubectlXdpqTop leaves the last screen it
// captured, for a reader to see what top shows.
const topScreen = "/tmp/top-screen.txt"

// TestKubectlXdpqTop runs `kubectl xdpq top` in a real terminal (a tmux
// pane of 200x50) on a real node, xdpq installed by its chart (its pool
// served by DRA), while frames flow to a pod's two queues: the screen, redrawn every second,
// shows the pod's rows with their receive rates. `top -o json` gives the
// same, and the RBAC the plugin's help names is what it needs: a user
// with view and the chart's xdpq-top Role reads the rates; one with view
// alone sees the daemon unreachable, forbidden, and the pod's rows still.
// The same traffic serves checkPrometheusThroughService: a Prometheus
// scraping the daemon through the chart's metrics Service, as its
// ServiceMonitor says, sees the pod receive on the dashboard's panels.
func TestKubectlXdpqTop(t *testing.T) {
	testnet.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute) // a fresh build included
	defer cancel()
	e := newScenarioEnv(ctx, t)
	cp, node := e.cp, e.node
	k := kubectl{path: cp.Binaries[kubebin.Kubectl], kubeconfig: cp.Kubeconfig, pluginDir: buildPlugin(ctx, t)}
	// The pool served by DRA (the chart's default on this cluster): the
	// pod asks for the extended resource, and the daemon prepares its
	// claim (the dashboard's DRA panels).
	e.install(ctx, t)
	waitSlices(ctx, t, cp, 1)

	const ns = "top"
	if err := cp.CreateNamespace(ctx, ns, map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}); err != nil {
		t.Fatal(err)
	}
	pod := startPerfPod(ctx, t, cp, ns, "rx-top", e.ref, 5000)
	waitFlowsApplied(ctx, t, cp, ns, pod.name)
	waitPodRows(ctx, t, k, node.Name, ns, pod)
	stop := sendWhile(openPeerSender(t, e.nic, pod))
	stopped := false
	defer func() {
		if !stopped {
			_, _ = stop() // the test failed first; its error is the one to tell
		}
	}()

	// A row of the pod's queue q: its rate of received frames.
	row := func(q int) *regexp.Regexp {
		return regexp.MustCompile(fmt.Sprintf(`(?m)^%s/%s\s+%s\s+%s\s+%d\s+Filter/\w+\s+(\S+)\s+\S+\s+\S+\s+\S+\s+\S+\s*$`,
			ns, pod.name, regexp.QuoteMeta(node.Name), scenarioNIC, q))
	}
	receiving := func(screen string) bool {
		for _, q := range pod.queues {
			m := row(q).FindStringSubmatch(screen)
			if m == nil || m[1] == "0" || m[1] == "-" {
				return false
			}
		}
		return true
	}

	t.Run("terminal", func(t *testing.T) {
		screen, err := topInTmux(ctx, t, k, receiving)
		if werr := os.WriteFile(topScreen, []byte(screen), 0o644); werr != nil {
			t.Error(werr)
		}
		t.Logf("kubectl xdpq top in tmux (saved to %s):\n%s", topScreen, screen)
		if err != nil {
			t.Fatalf("the screen never showed %s receiving on queues %v: %v", pod.name, pod.queues, err)
		}
		checkTopScreen(t, screen, node.Name, "Filter")
	})

	// -o json: one sample pair, for scripts.
	topJSON := func(t *testing.T, as string) kubectlxdpq.TopList {
		t.Helper()
		out, _ := k.must(ctx, t, "xdpq", "top", "-o", "json", "--interval", "1s", "--as", as)
		var list kubectlxdpq.TopList
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("kubectl xdpq top -o json --as %s: %v\n%s", as, err, out)
		}
		return list
	}
	podRates := func(list kubectlxdpq.TopList) map[int32]*float64 {
		out := map[int32]*float64{}
		for _, q := range list.Items {
			if q.Pod != nil && q.Pod.Namespace == ns && q.Pod.Name == pod.name && q.Node == node.Name && q.Netdev == scenarioNIC {
				out[q.Queue] = q.RXFramesPerSecond
			}
		}
		return out
	}

	t.Run("rbac", func(t *testing.T) {
		// carol: view and the chart's Role for top; dave: view alone.
		for _, u := range []string{"carol", "dave"} {
			if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: u + "-view"},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
				Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: u}},
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if out, err := cp.Kubectl(ctx, "-n", "kube-system", "create", "rolebinding", "carol-xdpq-top", "--role=xdpq-top", "--user=carol"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		waitAllowed(ctx, t, cp, "carol", authorizationv1.ResourceAttributes{Namespace: "kube-system", Resource: "pods", Subresource: "proxy", Verb: "get"})
		// The aggregation controller puts xdpqnodes into view a moment
		// after the chart's role appears.
		for _, u := range []string{"carol", "dave"} {
			waitAllowed(ctx, t, cp, u, authorizationv1.ResourceAttributes{Group: "xdpq.io", Resource: "xdpqnodes", Verb: "list"})
		}

		list := topJSON(t, "carol")
		rates := podRates(list)
		for _, q := range pod.queues {
			if r := rates[int32(q)]; r == nil || *r <= 0 {
				t.Errorf("top -o json as carol: queue %d of %s at %v frames/s, want > 0: %+v", q, pod.name, r, list)
			}
		}

		list = topJSON(t, "dave")
		if len(list.Nodes) != 1 || !strings.Contains(list.Nodes[0].Unreachable, `User "dave" cannot get resource "pods/proxy"`) {
			t.Errorf("top -o json as dave (no pods/proxy): nodes %+v, want the node unreachable, forbidden", list.Nodes)
		}
		rates = podRates(list)
		if len(rates) != len(pod.queues) {
			t.Errorf("top -o json as dave: the pod's rows %v, want its queues %v", rates, pod.queues)
		}
		for q, r := range rates {
			if r != nil {
				t.Errorf("top -o json as dave: queue %d at %v frames/s, want unknown", q, *r)
			}
		}
	})

	t.Run("prometheus", func(t *testing.T) {
		// A second pod comes and goes: the daemon prepares and
		// unprepares its claim.
		events := func(t *testing.T) {
			startPerfPod(ctx, t, cp, ns, "rx-top2", e.ref, 5001)
			if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, "rx-top2", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
				t.Fatal(err)
			}
			if out, err := cp.Kubectl(ctx, "-n", ns, "wait", "--for=delete", "pod/rx-top2", "--timeout=60s"); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		}
		checkPrometheusThroughService(ctx, t, cp, node.Name, ns, pod, events)
	})

	t.Run("hostNetwork", func(t *testing.T) {
		// A hostNetwork pod's addresses are the node's: its annotated
		// flow to its "own" address (port 22, the node's SSH) is
		// refused as the node's, and nothing of the node's traffic is
		// steered; the other pod receives on.
		const hns = "hostnet" // privileged: hostNetwork is beyond baseline
		if err := cp.CreateNamespace(ctx, hns, nil); err != nil {
			t.Fatal(err)
		}
		p := perfPod(hns, "rx-host", e.ref, 22)
		p.Annotations["xdpq.io/flows"] = `[{"protocol":"tcp","destination":"ipam","destinationPort":"22"}]`
		p.Spec.HostNetwork = true
		if _, err := cp.Client.CoreV1().Pods(hns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		running, err := cp.WaitPod(ctx, hns, p.Name, cluster.PodRunning)
		if err != nil {
			t.Fatal(err)
		}
		note := waitFlowsRefused(ctx, t, cp, hns, p.Name)
		t.Logf("FlowsRefused on %s/%s: %s", hns, p.Name, note)
		want := fmt.Sprintf("flow tcp %s:22: destination %s is an address of the node (", running.Status.PodIP, running.Status.PodIP)
		if !strings.Contains(note, want) || !strings.Contains(note, "sharedDestinations") {
			t.Errorf("the refusal says %q; want it to name %q and the pool's sharedDestinations", note, want)
		}
		// kubectl shows its allocation with no flow (the XdpqNode is
		// written a moment after the claim's prepare).
		row := regexp.MustCompile(fmt.Sprintf(`(?m)^%s\s+%s\s+%s\s+%s\s+\S+\s+(\S+)`, p.Name, regexp.QuoteMeta(node.Name), scenarioNIC, scenarioPool))
		var pods string
		err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			pods, _ = k.must(ctx, t, "xdpq", "pods", "-n", hns)
			return row.MatchString(pods), nil
		})
		t.Logf("kubectl xdpq pods -n %s:\n%s", hns, pods)
		if m := row.FindStringSubmatch(pods); err != nil || m[1] != "<none>" {
			t.Errorf("kubectl xdpq pods -n %s: want %s's allocation with no flow: %v", hns, p.Name, err)
		}
		if err := cp.Client.CoreV1().Pods(hns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
		if out, err := cp.Kubectl(ctx, "-n", hns, "wait", "--for=delete", "pod/"+p.Name, "--timeout=60s"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	})

	stopped = true
	if _, err := stop(); err != nil {
		t.Fatal(err)
	}
}

// topInTmux runs `kubectl xdpq top --interval 1s` in a shell in a tmux
// pane of 200x50 (a tmux server of its own, gone when the test ends)
// and captures the pane until done holds for the screen, or a minute
// passed. It returns the last screen captured.
func topInTmux(ctx context.Context, t *testing.T, k kubectl, done func(screen string) bool) (string, error) {
	t.Helper()
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		t.Fatalf("tmux runs top in a terminal: apt-get install tmux (%v)", err)
	}
	server := fmt.Sprintf("xdpq-e2e-%d", os.Getpid())
	tm := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, tmux, append([]string{"-L", server}, args...)...).CombinedOutput()
		return string(out), err
	}
	// A shell in a 200x50 terminal; top is typed into it, so that an
	// error it ends with stays on the screen.
	if out, err := tm("new-session", "-d", "-x", "200", "-y", "50", "-s", "top", "sh"); err != nil {
		t.Fatalf("tmux new-session: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		// Not under ctx: the test's deferred cancel runs before cleanups.
		if out, err := exec.Command(tmux, "-L", server, "kill-server").CombinedOutput(); err != nil {
			t.Errorf("tmux kill-server: %v\n%s", err, out)
		}
	})
	cmd := fmt.Sprintf("HOME=%s PATH=%s:$PATH %s xdpq top --interval 1s --kubeconfig %s", k.pluginDir, k.pluginDir, k.path, k.kubeconfig)
	if out, err := tm("send-keys", "-t", "top", cmd, "Enter"); err != nil {
		t.Fatalf("tmux send-keys: %v\n%s", err, out)
	}
	var screen string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err := tm("capture-pane", "-p", "-t", "top")
		if err != nil {
			return false, fmt.Errorf("tmux capture-pane: %w: %s", err, out)
		}
		screen = strings.TrimRight(out, "\n") + "\n"
		return done(screen), nil
	})
	return screen, err
}

// checkTopScreen checks what top's screen shows besides the rows: its
// title, the node's daemon and netdev state, one table (redrawn in
// place, not tables one after another).
func checkTopScreen(t *testing.T, screen, node, state string) {
	t.Helper()
	if n := strings.Count(screen, "NAMESPACE/POD"); n != 1 {
		t.Errorf("the screen shows %d tables, want 1 (redrawn in place)", n)
	}
	words := strings.Join(strings.Fields(screen), " ")
	for _, w := range []string{"Every 1s: kubectl xdpq top", node + " kube-system/xdpq-", scenarioNIC + " " + state + "/"} {
		if !strings.Contains(words, w) {
			t.Errorf("the screen lacks %q", w)
		}
	}
}

// TestKubectlXdpqTopDirect is TestKubectlXdpqTop's terminal in direct
// mode: the pool steers in hardware (on veth, which has no ntuple
// filters, a pod without flows gets every frame of its queues), so the
// rates are the direct program's own counts.
func TestKubectlXdpqTopDirect(t *testing.T) {
	testnet.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	e := newScenarioEnv(ctx, t)
	cp, node := e.cp, e.node
	k := kubectl{path: cp.Binaries[kubebin.Kubectl], kubeconfig: cp.Kubeconfig, pluginDir: buildPlugin(ctx, t)}
	e.install(ctx, t, "--set", "dra.servedBy=devicePlugin", "--set", "config.pools[0].steering=hardware")
	waitAllocatable(ctx, t, cp, node.Name, scenarioQueues)
	const ns = "top-direct"
	if err := cp.CreateNamespace(ctx, ns, map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}); err != nil {
		t.Fatal(err)
	}
	p := perfPod(ns, "rx-direct", e.ref, 5000)
	delete(p.Annotations, "xdpq.io/flows") // no ntuple filter on veth: no flow
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := followPerfPod(ctx, t, cp, ns, p.Name, 5000)
	stop := sendWhile(openPeerSender(t, e.nic, pod))
	defer func() { _, _ = stop() }() // a send's error shows as the rates staying at 0

	screen, err := topInTmux(ctx, t, k, func(screen string) bool {
		for _, q := range pod.queues {
			re := regexp.MustCompile(fmt.Sprintf(`(?m)^%s/%s\s+%s\s+%s\s+%d\s+Direct/\w+\s+(\S+)\s`, ns, pod.name,
				regexp.QuoteMeta(node.Name), scenarioNIC, q))
			if m := re.FindStringSubmatch(screen); m == nil || m[1] == "0" || m[1] == "-" {
				return false
			}
		}
		return true
	})
	t.Logf("kubectl xdpq top in tmux, direct mode:\n%s", screen)
	if err != nil {
		t.Fatalf("the screen never showed %s receiving on queues %v in direct mode: %v", pod.name, pod.queues, err)
	}
	checkTopScreen(t, screen, node.Name, "Direct")
}

// waitAllowed waits until RBAC's authorizer lets user do what attrs say:
// it learns of a binding from its informer, and tells no one when it has.
func waitAllowed(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, user string, attrs authorizationv1.ResourceAttributes) {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: &attrs}}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		r, err := cp.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		return err == nil && r.Status.Allowed, err
	}); err != nil {
		t.Fatalf("%s never allowed to %s %s/%s in %q: %v", user, attrs.Verb, attrs.Resource, attrs.Subresource, attrs.Namespace, err)
	}
}
