package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/yaml"

	"github.com/xdpq/xdpq"
	"github.com/xdpq/xdpq/internal/kubeclient"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
	"github.com/xdpq/xdpq/pkg/nodestatus"
	"github.com/xdpq/xdpq/test/e2e/cluster"
	"github.com/xdpq/xdpq/test/e2e/kubebin"
)

// repoRoot is the main module's directory, from test/e2e.
const repoRoot = "../.."

// TestKubectlXdpq runs the real kubectl with the kubectl-xdpq plugin on
// its PATH against a real kube-apiserver: first without xdpq's CRD, then
// with it and the XdpqNodes of two nodes written by xdpq's own status
// writer (pkg/nodestatus: server-side apply on the status subresource,
// Events through events.k8s.io), as two daemons would. It checks
// `kubectl xdpq status`, `pods`, `describe node` and their -o json and
// -o yaml, the errors for a node without an XdpqNode and one that does
// not exist, and the CRD's printer columns in `kubectl get xdpqnodes`.
func TestKubectlXdpq(t *testing.T) {
	cp := cluster.StartControlPlaneForTest(t, cluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	k := kubectl{path: cp.Binaries[kubebin.Kubectl], kubeconfig: cp.Kubeconfig, pluginDir: buildPlugin(ctx, t)}

	out, _ := k.must(ctx, t, "plugin", "list")
	if !strings.Contains(out, filepath.Join(k.pluginDir, "kubectl-xdpq")) {
		t.Errorf("kubectl plugin list does not list kubectl-xdpq:\n%s", out)
	}

	// No CRD: every command says to install xdpq.
	for _, args := range [][]string{{"xdpq", "status"}, {"xdpq", "pods", "-A"}, {"xdpq", "describe", "node", "worker-1"}} {
		_, stderr, err := k.run(ctx, args...)
		if want := "error: the XdpqNode CRD is not installed: helm install xdpq"; err == nil || !strings.Contains(stderr, want) {
			t.Errorf("kubectl %s without the CRD: %v, stderr %q; want an error saying %q", strings.Join(args, " "), err, stderr, want)
		}
	}

	k.must(ctx, t, "apply", "--server-side", "-f", filepath.Join(repoRoot, "charts/xdpq/crds/xdpq.io_xdpqnodes.yaml"))
	k.must(ctx, t, "wait", "--for=condition=Established", "crd/xdpqnodes.xdpq.io", "--timeout=60s")

	if out, stderr := k.must(ctx, t, "xdpq", "status"); out != "" || !strings.Contains(stderr, "No XdpqNodes found") {
		t.Errorf("kubectl xdpq status with no XdpqNode: stdout %q, stderr %q", out, stderr)
	}

	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"worker-1", "worker-2", "worker-3"} {
		if _, err := cp.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	s1, l1 := worker1()
	s2, l2 := worker2()
	w1, stop1 := startWriter(t, cp, dyn, "worker-1", s1, l1, true)
	startWriter(t, cp, dyn, "worker-2", s2, l2, false) // still starting: Ready False
	waitStatus(ctx, t, dyn, "worker-1", 2)
	waitStatus(ctx, t, dyn, "worker-2", 1)
	w1.NetdevOverridden("ens1f1", "xdp_firewall", 97)
	waitEvent(ctx, t, cp, "worker-1", nodestatus.EventNetdevOverridden)

	t.Run("status", func(t *testing.T) {
		out, _ := k.must(ctx, t, "xdpq", "status")
		t.Logf("kubectl xdpq status:\n%s", out)
		want := `NODE      NETDEV  STATE       PROGRAM       MODE     QUEUES  POOLS             READY             CONFIG
worker-1  ens1f0  Direct      xdpq_direct   native   2/64    dns 1/8,upf 2/16  True              3f2a9c1d8e7b
worker-1  ens1f1  Overridden  xdp_firewall  native   1/64    dns 1/8,upf 2/16  True              3f2a9c1d8e7b
worker-2  veth0   Filter      xdpq_filter   generic  1/4     upf 1/4           False (Starting)  0badc0ffee00 (refused newer)
`
		if out != want {
			t.Errorf("kubectl xdpq status:\n%s\nwant:\n%s", out, want)
		}
		// A list in chunks of one XdpqNode has them all.
		if out, _ = k.must(ctx, t, "xdpq", "status", "--chunk-size", "1"); out != want {
			t.Errorf("kubectl xdpq status --chunk-size 1:\n%s\nwant:\n%s", out, want)
		}
		out, _ = k.must(ctx, t, "xdpq", "status", "worker-2", "-o", "wide")
		for _, w := range []string{"PROGRAM-ID", "software", "PoolLimited", "worker-2  veth0"} {
			if !strings.Contains(out, w) {
				t.Errorf("kubectl xdpq status worker-2 -o wide lacks %q:\n%s", w, out)
			}
		}
		if strings.Contains(out, "worker-1") {
			t.Errorf("kubectl xdpq status worker-2 shows worker-1:\n%s", out)
		}
		out, stderr, err := k.run(ctx, "xdpq", "status", "worker-1", "nosuch")
		if err == nil || !strings.Contains(stderr, `no XdpqNode "nosuch": the cluster has no node of that name`) || !strings.Contains(out, "worker-1  ens1f0") {
			t.Errorf("kubectl xdpq status worker-1 nosuch: %v, stdout:\n%s\nstderr: %s", err, out, stderr)
		}
	})

	t.Run("status -o json", func(t *testing.T) {
		out, _ := k.must(ctx, t, "xdpq", "status", "-o", "json")
		var list struct {
			APIVersion, Kind string
			Items            []v1alpha1.XdpqNode
		}
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		if list.Kind != "List" || len(list.Items) != 2 || list.Items[0].Name != "worker-1" || list.Items[1].Name != "worker-2" {
			t.Fatalf("kubectl xdpq status -o json: %s with %d items:\n%s", list.Kind, len(list.Items), out)
		}
		n := list.Items[0]
		if n.Kind != v1alpha1.Kind || len(n.Status.Netdevs) != 2 || n.Status.Netdevs[1].ForeignProgram != "xdp_firewall" || n.Status.Summary.Queues != "3/24" {
			t.Errorf("worker-1 in -o json: %+v", n)
		}
		if strings.Contains(out, "managedFields") {
			t.Errorf("-o json shows managedFields")
		}
		out, _ = k.must(ctx, t, "xdpq", "status", "worker-2", "-o", "yaml")
		var one v1alpha1.XdpqNode
		if err := yaml.UnmarshalStrict([]byte(out), &one); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		if one.Kind != v1alpha1.Kind || one.Name != "worker-2" || one.Status.Netdevs[0].State != v1alpha1.StateFilter || one.OwnerReferences[0].Kind != "Node" {
			t.Errorf("kubectl xdpq status worker-2 -o yaml:\n%s", out)
		}
	})

	t.Run("pods", func(t *testing.T) {
		out, _ := k.must(ctx, t, "xdpq", "pods", "-A")
		t.Logf("kubectl xdpq pods -A:\n%s", out)
		want := `NAMESPACE  POD            NODE      NETDEV  POOL  QUEUES  FLOWS                                                             LEASE
<none>     uid 77aa       worker-2  veth0   upf   0       udp 10.30.0.2:9000                                                connected
dns        resolver-5d8f  worker-1  ens1f1  dns   4       udp 10.20.0.9:53                                                  not connected
telco      upf-0          worker-1  ens1f0  upf   8-9     udp 10.20.0.5:2152, udp 10.20.0.5:8805 from 10.9.0.0/16 vlan 100  connected
`
		if out != want {
			t.Errorf("kubectl xdpq pods -A:\n%s\nwant:\n%s", out, want)
		}
		out, _ = k.must(ctx, t, "xdpq", "pods", "-n", "telco", "-o", "wide")
		want = `POD    NODE      NETDEV  POOL  QUEUES  FLOWS                                                             LEASE      ALLOCATION  UID
upf-0  worker-1  ens1f0  upf   8-9     udp 10.20.0.5:2152, udp 10.20.0.5:8805 from 10.9.0.0/16 vlan 100  connected  a7f3        6f1c
`
		if out != want {
			t.Errorf("kubectl xdpq pods -n telco -o wide:\n%s\nwant:\n%s", out, want)
		}
		// The kubeconfig's namespace (default) when no -n.
		if out, stderr := k.must(ctx, t, "xdpq", "pods"); out != "" || !strings.Contains(stderr, "No pods hold xdpq queues in namespace default.") {
			t.Errorf("kubectl xdpq pods: stdout %q, stderr %q", out, stderr)
		}
		out, _ = k.must(ctx, t, "xdpq", "pods", "-A", "--node", "worker-1", "-o", "json")
		var rows struct {
			Items []struct {
				Pod            *v1alpha1.PodRef
				Node, Netdev   string
				Queues         []int32
				Flows          []string
				LeaseConnected bool
			}
		}
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		if len(rows.Items) != 2 || rows.Items[1].Pod == nil || rows.Items[1].Pod.Name != "upf-0" || !rows.Items[1].LeaseConnected ||
			len(rows.Items[1].Flows) != 2 || rows.Items[0].Node != "worker-1" {
			t.Errorf("kubectl xdpq pods -A --node worker-1 -o json:\n%s", out)
		}
	})

	t.Run("describe", func(t *testing.T) {
		out, _ := k.must(ctx, t, "xdpq", "describe", "node", "worker-1")
		t.Logf("kubectl xdpq describe node worker-1:\n%s", out)
		for _, w := range []string{
			"Name:               worker-1\n",
			"Owner:              Node/worker-1\n",
			"Summary:            2 netdevs (1 overridden), 3 of 24 queues allocated, 2 allocations\n",
			"  Ready        True    ",
			"  Degraded     True    ",
			"NetdevOverridden  netdev ens1f1: foreign program \"xdp_firewall\" has precedence\n",
			"  Hash:              3f2a9c1d8e7b6a5f4e3d2c1b0a998877\n",
			"  ens1f1:\n    State:            Overridden\n    Program:          xdp_firewall (foreign), id 97\n",
			"    PCI Address:      0000:3b:00.0\n",
			"  a7f3  upf   ens1f0  8-9     telco/upf-0        connected      udp 10.20.0.5:2152, udp 10.20.0.5:8805 from 10.9.0.0/16 vlan 100\n",
			"  Warning  NetdevOverridden  ",
			"xdpq.io/daemon  netdev ens1f1: foreign XDP program \"xdp_firewall\" (id 97) has precedence",
		} {
			if !strings.Contains(out, w) {
				t.Errorf("kubectl xdpq describe node worker-1 lacks %q:\n%s", w, out)
			}
		}
		out, _ = k.must(ctx, t, "xdpq", "describe", "nodes")
		if strings.Count("\n"+out, "\nName:") != 2 || !strings.Contains(out, "Name:               worker-2\n") {
			t.Errorf("kubectl xdpq describe nodes, want both nodes:\n%s", out)
		}
		_, stderr, err := k.run(ctx, "xdpq", "describe", "node", "worker-3")
		if want := `error: no XdpqNode for node "worker-3": xdpq's daemon has not reported from it`; err == nil || !strings.Contains(stderr, want) {
			t.Errorf("describe a node without an XdpqNode: %v, stderr %q, want %q", err, stderr, want)
		}
		_, stderr, err = k.run(ctx, "xdpq", "describe", "node", "nosuch")
		if want := `error: no XdpqNode "nosuch": the cluster has no node of that name`; err == nil || !strings.Contains(stderr, want) {
			t.Errorf("describe a node that does not exist: %v, stderr %q, want %q", err, stderr, want)
		}
	})

	// What the README says a user needs: get and list on xdpqnodes; list on
	// events for describe's Events; get on nodes for a sharper error.
	t.Run("rbac", func(t *testing.T) {
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "xdpqnode-reader"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupName}, Resources: []string{"xdpqnodes"}, Verbs: []string{"get", "list"}}}}
		if _, err := cp.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "xdpqnode-reader"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "viewer"}}}
		if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// RBAC's authorizer learns of the binding from its informer, and
		// tells no one when it has: ask it, as Kubernetes' own e2e
		// framework does (WaitForAuthorizationUpdate).
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: "viewer",
			ResourceAttributes: &authorizationv1.ResourceAttributes{Group: v1alpha1.GroupName, Resource: "xdpqnodes", Verb: "list"}}}
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			r, err := cp.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			return err == nil && r.Status.Allowed, err
		}); err != nil {
			t.Fatalf("viewer never allowed to list xdpqnodes: %v", err)
		}
		out, _ := k.must(ctx, t, "xdpq", "status", "--as", "viewer")
		if !strings.Contains(out, "worker-1  ens1f1  Overridden") {
			t.Errorf("kubectl xdpq status --as viewer:\n%s", out)
		}
		out, _ = k.must(ctx, t, "xdpq", "describe", "node", "worker-1", "--as", "viewer")
		if want := `Events:  <cannot read: list events: events is forbidden: User "viewer" cannot list resource "events"`; !strings.Contains(out, want) ||
			!strings.Contains(out, "State:            Overridden") {
			t.Errorf("kubectl xdpq describe node worker-1 --as viewer, want the node and %q:\n%s", want, out)
		}
		_, stderr, err := k.run(ctx, "xdpq", "describe", "node", "nosuch", "--as", "viewer")
		if want := `error: no XdpqNode for node "nosuch": xdpq's daemon has not reported from it`; err == nil || !strings.Contains(stderr, want) {
			t.Errorf("describe a node that does not exist, without get on nodes: %v, stderr %q, want %q", err, stderr, want)
		}
		_, stderr, err = k.run(ctx, "xdpq", "status", "--as", "nobody")
		if want := `error: list XdpqNodes: xdpqnodes.xdpq.io is forbidden: User "nobody" cannot list resource "xdpqnodes"`; err == nil || !strings.Contains(stderr, want) {
			t.Errorf("kubectl xdpq status --as nobody: %v, stderr %q, want %q", err, stderr, want)
		}
	})

	t.Run("get xdpqnodes", func(t *testing.T) {
		// Each row's fields but AGE, which varies.
		for _, tc := range []struct {
			args []string
			age  int // AGE's field from the end
			want [][]string
		}{
			{[]string{"get", "xdpqnodes"}, 1, [][]string{
				{"NAME", "NETDEVS", "QUEUES", "OVERRIDDEN", "READY", "CONFIG"},
				{"worker-1", "2", "3/24", "1", "True", "3f2a9c1d8e7b"},
				{"worker-2", "1", "1/4", "0", "False", "0badc0ffee00", "(refused", "newer)"},
			}},
			{[]string{"get", "xqn", "-o", "wide"}, 4, [][]string{
				{"NAME", "NETDEVS", "QUEUES", "OVERRIDDEN", "READY", "CONFIG", "DEGRADED", "ALLOCATIONS", "VERSION"},
				{"worker-1", "2", "3/24", "1", "True", "3f2a9c1d8e7b", "NetdevOverridden", "2", xdpq.Version()},
				{"worker-2", "1", "1/4", "0", "False", "0badc0ffee00", "(refused", "newer)", "PoolLimited", "1", xdpq.Version()},
			}},
		} {
			out, _ := k.must(ctx, t, tc.args...)
			t.Logf("kubectl %s:\n%s", strings.Join(tc.args, " "), out)
			var got [][]string
			for l := range strings.Lines(strings.TrimSpace(out)) {
				f := strings.Fields(l)
				if len(f) >= tc.age {
					f = append(f[:len(f)-tc.age:len(f)-tc.age], f[len(f)-tc.age+1:]...)
				}
				got = append(got, f)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("kubectl %s: %q, want %q:\n%s", strings.Join(tc.args, " "), got, tc.want, out)
			}
		}
	})

	// The daemon stops: its writer's last write says so.
	t.Run("stopped", func(t *testing.T) {
		stop1()
		out, _ := k.must(ctx, t, "xdpq", "status", "worker-1")
		if !strings.Contains(strings.Join(strings.Fields(out), " "), "worker-1 ens1f0 Direct xdpq_direct native 2/64 dns 1/8,upf 2/16 False (DaemonStopped) 3f2a9c1d8e7b") {
			t.Errorf("kubectl xdpq status worker-1 after its daemon stopped:\n%s", out)
		}
	})
}

// kubectl runs the real kubectl with the plugin's directory first on
// its PATH.
type kubectl struct {
	path, kubeconfig, pluginDir string
}

// run runs kubectl with args and then --kubeconfig: kubectl finds a
// plugin by the arguments before the first flag.
func (k kubectl) run(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	cmd := exec.CommandContext(ctx, k.path, append(args, "--kubeconfig", k.kubeconfig)...)
	cmd.Env = append(os.Environ(), "PATH="+k.pluginDir+string(os.PathListSeparator)+os.Getenv("PATH"), "HOME="+k.pluginDir)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// must is run, failing the test on an error.
func (k kubectl) must(ctx context.Context, t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	stdout, stderr, err := k.run(ctx, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v: %s", strings.Join(args, " "), err, stderr)
	}
	return stdout, stderr
}

// buildPlugin builds cmd/kubectl-xdpq into bin/ of a new directory, as
// make build does into the repository's, puts it on kubectl's PATH as
// docs/operating.md says, `install bin/kubectl-xdpq <dir>/` from there
// (a directory of its own instead of /usr/local/bin), and returns that
// directory.
func buildPlugin(ctx context.Context, t *testing.T) string {
	t.Helper()
	work, dir := t.TempDir(), t.TempDir()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(work, "bin")+"/", "./cmd/kubectl-xdpq")
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build kubectl-xdpq: %v\n%s", err, out)
	}
	cmd = exec.CommandContext(ctx, "install", "bin/kubectl-xdpq", dir+"/")
	cmd.Dir = work
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("install bin/kubectl-xdpq %s/: %v\n%s", dir, err, out)
	}
	return dir
}

// startWriter runs xdpq's status writer of node, as its daemon does,
// with status and list as the daemon's, until stop is called or the test
// ends.
// stop returns when the writer has, having written Ready False.
func startWriter(t *testing.T, cp *cluster.ControlPlane, dyn dynamic.Interface, node string, status *api.Status, list *api.AllocationList, serving bool) (w *nodestatus.Writer, stop func()) {
	kc, err := kubeclient.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	w = nodestatus.New(nodestatus.Config{Node: node, Nodes: kc.Nodes(), Events: kc.EventSink(), Dynamic: dyn,
		Source:  func(context.Context) (*api.Status, *api.AllocationList, error) { return status, list, nil },
		Serving: func() bool { return serving }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("status writer of %s: %v", node, err)
			}
		})
	}
	t.Cleanup(stop)
	return w, stop
}

// waitStatus waits until node's XdpqNode reports netdevs netdevs.
func waitStatus(ctx context.Context, t *testing.T, dyn dynamic.Interface, node string, netdevs int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	sel := fields.OneTermEqualSelector("metadata.name", node).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return dyn.Resource(v1alpha1.Resource).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return dyn.Resource(v1alpha1.Resource).Watch(ctx, o)
		},
	}
	_, err := watchtools.UntilWithSync(ctx, lw, &unstructured.Unstructured{}, nil, func(e watch.Event) (bool, error) {
		u, ok := e.Object.(*unstructured.Unstructured)
		if !ok {
			return false, nil
		}
		n, found, err := unstructured.NestedInt64(u.Object, "status", "summary", "netdevs")
		return err == nil && found && n == int64(netdevs), nil
	})
	if err != nil {
		t.Fatalf("XdpqNode %s with %d netdevs: %v", node, netdevs, err)
	}
}

// waitEvent waits until an Event of reason about node's XdpqNode is
// recorded (the writer's recorder sends them in the background).
func waitEvent(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, node, reason string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	sel := fields.Set{"involvedObject.kind": v1alpha1.Kind, "involvedObject.name": node, "reason": reason}.AsSelector().String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return cp.Client.CoreV1().Events(metav1.NamespaceAll).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return cp.Client.CoreV1().Events(metav1.NamespaceAll).Watch(ctx, o)
		},
	}
	if _, err := watchtools.UntilWithSync(ctx, lw, &corev1.Event{}, nil, func(e watch.Event) (bool, error) {
		_, ok := e.Object.(*corev1.Event)
		return ok, nil
	}); err != nil {
		t.Fatalf("event %s of XdpqNode %s: %v", reason, node, err)
	}
}

// worker1 is a daemon's status and allocations on a node with two E810
// ports: one Direct with two flows of a connected pod, one Overridden by
// an operator's firewall, where a pod holds a queue it has not connected
// to.
func worker1() (*api.Status, *api.AllocationList) {
	return &api.Status{
			Pools: []api.PoolStatus{{Name: "upf", Resource: "xdpq.io/upf", Queues: 16, Free: 14}, {Name: "dns", Resource: "xdpq.io/dns", Queues: 8, Free: 7}},
			Netdevs: []api.NetdevStatus{
				{Netdev: "ens1f0", State: "Direct", Mode: "native", Steering: "hardware", Flows: 2, Sockets: []uint32{8, 9}, LinkUp: true,
					Program: 41, RXQueues: 64, Reserved: []uint32{8, 9, 10, 11, 12, 13, 14, 15}, ZeroCopy: true, Driver: "ice", PCI: "0000:3b:00.0"},
				{Netdev: "ens1f1", State: "Overridden", Mode: "native", Steering: "hardware", LinkUp: true, Program: 97, Foreign: "xdp_firewall",
					RXQueues: 64, Reserved: []uint32{4}, ZeroCopy: true, Driver: "ice", PCI: "0000:3b:00.1"},
			},
			Allocations: 2,
			Attachments: 2,
			Config:      api.ConfigStatus{Hash: "3f2a9c1d8e7b6a5f4e3d2c1b0a998877", Loaded: time.Now().Add(-10 * time.Minute)},
		}, &api.AllocationList{
			Allocations: []api.Allocation{
				{ID: "a7f3", Pool: "upf", Netdev: "ens1f0", Queues: []uint32{8, 9}, PodUID: "6f1c", Pod: "telco/upf-0", Lease: []uint32{8, 9}},
				{ID: "b210", Pool: "dns", Netdev: "ens1f1", Queues: []uint32{4}, PodUID: "9d2e", Pod: "dns/resolver-5d8f"},
			},
			Attachments: []api.AttachmentStatus{
				{Attachment: api.Attachment{AllocationID: "a7f3", CNIAddRequest: api.CNIAddRequest{Flows: []api.CNIFlow{
					{Protocol: "udp", Dst: netip.MustParsePrefix("10.20.0.5/32"), DstPort: 2152},
					{Protocol: "udp", Dst: netip.MustParsePrefix("10.20.0.5/32"), DstPort: 8805, Src: netip.MustParsePrefix("10.9.0.0/16"), VLAN: 100},
				}}}, State: "active"},
				{Attachment: api.Attachment{AllocationID: "b210", CNIAddRequest: api.CNIAddRequest{Flows: []api.CNIFlow{
					{Protocol: "udp", Dst: netip.MustParsePrefix("10.20.0.9/32"), DstPort: 53},
				}}}, State: "active"},
			},
		}
}

// worker2 is a daemon's status and allocations on a node with a veth in
// Filter mode, a pod bound by its UID alone, a missing netdev's pool and
// a refused newer config.
func worker2() (*api.Status, *api.AllocationList) {
	return &api.Status{
			Pools: []api.PoolStatus{{Name: "upf", Resource: "xdpq.io/upf", Queues: 4, Free: 3, Reason: "netdev eth9 is missing"}},
			Netdevs: []api.NetdevStatus{
				{Netdev: "veth0", State: "Filter", Mode: "generic", Steering: "software", Flows: 1, LinkUp: true, Program: 12, RXQueues: 4, NUMANode: -1},
			},
			Allocations: 1,
			Attachments: 1,
			ConfigError: "config /etc/xdpq/config.yaml: pools[0].queues: \"9-2\": empty range",
			Config:      api.ConfigStatus{Hash: "0badc0ffee0012345678", Loaded: time.Now().Add(-2 * time.Hour)},
		}, &api.AllocationList{
			Allocations: []api.Allocation{{ID: "d4e5", Pool: "upf", Netdev: "veth0", Queues: []uint32{0}, PodUID: "77aa", Lease: []uint32{0}}},
			Attachments: []api.AttachmentStatus{{Attachment: api.Attachment{AllocationID: "d4e5", CNIAddRequest: api.CNIAddRequest{Flows: []api.CNIFlow{
				{Protocol: "udp", Dst: netip.MustParsePrefix("10.30.0.2/32"), DstPort: 9000},
			}}}, State: "active"}},
		}
}
