package kubectlxdpq_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/xdpq/xdpq/internal/kubectlxdpq"
	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
)

// metricsBody is a daemon's /metrics as it serves them (the series top
// reads, and others), with worker-1's queues' counters: what ens1f0's
// queues 8 and 9 (telco/upf-0) and 10 (no pod) redirected, and queue 8's
// and 9's socket statistics. ens1f1 is Overridden: no count of its own.
func metricsBody(rx8, rx9, rx10, ringFull8, fillEmpty8, invalid8, dropped9 float64) string {
	var b strings.Builder
	b.WriteString(`# HELP xdpq_agent_netdev_state 1 for the netdev's current XDP program state.
# TYPE xdpq_agent_netdev_state gauge
xdpq_agent_netdev_state{netdev="ens1f0",state="Direct"} 1
xdpq_agent_netdev_state{netdev="ens1f1",state="Overridden"} 1
# HELP xdpq_agent_program_packets_total Frames xdpq's program saw, per queue and result.
# TYPE xdpq_agent_program_packets_total counter
`)
	for q, v := range map[int]float64{8: rx8, 9: rx9, 10: rx10} {
		fmt.Fprintf(&b, "xdpq_agent_program_packets_total{netdev=\"ens1f0\",queue=\"%d\",result=\"redirected\"} %g\n", q, v)
		fmt.Fprintf(&b, "xdpq_agent_program_packets_total{netdev=\"ens1f0\",queue=\"%d\",result=\"passed\"} 7\n", q)
	}
	for _, m := range []struct {
		name   string
		q8, q9 float64
	}{
		{"xdpq_socket_rx_dropped_frames_total", 0, dropped9},
		{"xdpq_socket_rx_ring_full_frames_total", ringFull8, 0},
		{"xdpq_socket_fill_ring_empty_total", fillEmpty8, 0},
		{"xdpq_socket_rx_invalid_descriptors_total", invalid8, 0},
		{"xdpq_socket_tx_invalid_descriptors_total", 99, 99},
	} {
		fmt.Fprintf(&b, "# HELP %s A socket statistic.\n# TYPE %s counter\n", m.name, m.name)
		fmt.Fprintf(&b, "%s{netdev=\"ens1f0\",queue=\"8\"} %g\n%s{netdev=\"ens1f0\",queue=\"9\"} %g\n", m.name, m.q8, m.name, m.q9)
	}
	b.WriteString("# HELP xdpq_pool_leases Leases.\n# TYPE xdpq_pool_leases gauge\nxdpq_pool_leases{pool=\"upf\"} 1\n")
	return b.String()
}

// daemonPod is the chart's daemon pod on node.
func daemonPod(name, node string, ready bool) *corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name,
			Labels: map[string]string{"app.kubernetes.io/name": "xdpq", "app.kubernetes.io/instance": "xdpq"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "daemon",
			Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9476, HostPort: 9476}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}},
	}
}

// proxied is a pod proxy's answer.
type proxied struct {
	body []byte
	err  error
}

func (p proxied) DoRaw(context.Context) ([]byte, error) { return p.body, p.err }
func (p proxied) Stream(context.Context) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(p.body)), p.err
}

// topCluster is a fake API server with fixture's XdpqNodes and the
// daemons' pods: worker-1's daemon serves its metrics, worker-2's
// pods/proxy is forbidden, worker-3 has no daemon pod (a pod of another
// app runs there). The metrics worker-1's daemon serves are the first
// sample's until next is called, then the second's; each wait of top's
// moves the clock an interval on.
type topCluster struct {
	c        *kubectlxdpq.Client
	interval time.Duration
	mu       sync.Mutex
	at       time.Time
	sample   int
	bodies   []string
	proxied  []string // pods/proxy requests: namespace/name:port/path
}

func newTopCluster(t *testing.T, interval time.Duration) *topCluster {
	t.Helper()
	tc := &topCluster{interval: interval, at: t0, bodies: []string{
		metricsBody(1000, 500, 0, 10, 3, 0, 0),
		// Queue 9's counter went back: the daemon restarted and counted
		// 100 since.
		metricsBody(21000, 100, 0, 50, 7, 1, 4),
	}}
	var objs []runtime.Object
	for _, n := range fixture(t) {
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&n)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, &unstructured.Unstructured{Object: u})
	}
	scheme := runtime.NewScheme()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme,
		map[schema.GroupVersionResource]string{v1alpha1.Resource: v1alpha1.Kind + "List"}, objs...)
	other := daemonPod("coredns-1", "worker-3", true)
	other.Labels = map[string]string{"app.kubernetes.io/name": "coredns"}
	cs := fake.NewClientset(daemonPod("xdpq-w1", "worker-1", true), daemonPod("xdpq-w2", "worker-2", true), other)
	cs.PrependProxyReactor("pods", func(a k8stesting.Action) (bool, rest.ResponseWrapper, error) {
		g := a.(k8stesting.ProxyGetAction)
		tc.mu.Lock()
		defer tc.mu.Unlock()
		tc.proxied = append(tc.proxied, fmt.Sprintf("%s/%s:%s/%s", g.GetNamespace(), g.GetName(), g.GetPort(), g.GetPath()))
		switch g.GetName() {
		case "xdpq-w1":
			return true, proxied{body: []byte(tc.bodies[tc.sample])}, nil
		case "xdpq-w2":
			return true, proxied{err: apierrors.NewForbidden(corev1.Resource("pods/proxy"), "xdpq-w2",
				errors.New(`User "alice" cannot get resource "pods/proxy" in API group "" in the namespace "kube-system"`))}, nil
		}
		return true, proxied{err: errors.New("no such pod")}, nil
	})
	// Discovery serves XdpqNodes: a missing one is a node's, not the CRD's.
	cs.Resources = []*metav1.APIResourceList{{GroupVersion: v1alpha1.SchemeGroupVersion.String(),
		APIResources: []metav1.APIResource{{Name: v1alpha1.Resource.Resource, Kind: v1alpha1.Kind}}}}
	tc.c = kubectlxdpq.NewClientFrom(dyn, cs.Discovery(), cs.CoreV1())
	return tc
}

func (tc *topCluster) now() time.Time {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return tc.at
}

// wait is a refresh: an interval later, the daemon's next sample.
func (tc *topCluster) wait(ctx context.Context) error {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.sample+1 >= len(tc.bodies) {
		return context.Canceled // no more samples: the user quits
	}
	tc.sample++
	tc.at = tc.at.Add(tc.interval)
	return ctx.Err()
}

func (tc *topCluster) run(t *testing.T, mode string, nodes ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := kubectlxdpq.RunTop(context.Background(), &out, tc.c, nodes, tc.interval, mode, tc.now, tc.wait)
	return out.String(), err
}

// TestTopJSON: -o json is the rates between two scrapes an interval
// apart: frames redirected per second, a counter that went back counted
// from zero, the losses by reason; unknown (null) where a queue has no
// socket statistics, and for the nodes whose daemon cannot be read,
// which say why.
func TestTopJSON(t *testing.T) {
	tc := newTopCluster(t, 2*time.Second)
	out, err := tc.run(t, "json")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "top.json.golden", []byte(out))
	var list kubectlxdpq.TopList
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	rates := map[string]string{}
	for _, q := range list.Items {
		l := q.LossesPerSecond
		rates[fmt.Sprintf("%s/%s/%d", q.Node, q.Netdev, q.Queue)] = fmt.Sprint(f(q.RXFramesPerSecond), " ", f(l.RXDropped), " ",
			f(l.RXRingFull), " ", f(l.FillRingEmpty), " ", f(l.RXInvalidDescriptors))
	}
	for q, want := range map[string]string{
		"worker-1/ens1f0/8":  "10000 0 20 2 0.5",
		"worker-1/ens1f0/9":  "50 2 0 0 0", // reset: 100 counted in 2 s
		"worker-1/ens1f0/10": "0 - - - -",  // no socket: no statistics
		"worker-1/ens1f1/4":  "- - - - -",  // Overridden: not counted
		"worker-2/veth0/0":   "- - - - -",  // unreachable
	} {
		if rates[q] != want {
			t.Errorf("%s: rx, dropped, ring full, fill empty, invalid per second %q, want %q", q, rates[q], want)
		}
	}
	why := map[string]string{}
	for _, n := range list.Nodes {
		why[n.Node] = n.Unreachable
	}
	if why["worker-1"] != "" || !strings.Contains(why["worker-2"], `cannot get resource "pods/proxy"`) ||
		!strings.Contains(why["worker-3"], "no running xdpq daemon pod") {
		t.Errorf("unreachable: %q", why)
	}
	// Two scrapes of each reachable daemon, through the port named
	// metrics.
	if got := strings.Join(tc.proxied, " "); strings.Count(got, "kube-system/xdpq-w1:9476/metrics") != 2 || strings.Contains(got, "coredns") {
		t.Errorf("pod proxy requests: %s", got)
	}
}

func f(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprint(*v)
}

// TestTopOnce: --once is the table of one sample pair: a line per node
// with its daemon and netdevs or why it is unreachable, a row per queue
// with its rates, or "unreachable" in their place.
func TestTopOnce(t *testing.T) {
	tc := newTopCluster(t, 2*time.Second)
	out, err := tc.run(t, "once")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "top-once.golden", []byte(out))
	if strings.Contains(out, kubectlxdpq.ClearScreen) {
		t.Error("--once clears the screen")
	}
	for _, w := range []string{
		"telco/upf-0 worker-1 ens1f0 8 Direct/native 10000 0 20 2 0.5",
		"telco/upf-0 worker-1 ens1f0 9 Direct/native 50 2 0 0 0",
		"<none> worker-1 ens1f0 10 Direct/native (not connected) 0 - - - -",
		"worker-2 kube-system/xdpq-w2 eth9 Missing, veth0 Filter/generic; unreachable: get /metrics of pod kube-system/xdpq-w2 through the API server: pods/proxy \"xdpq-w2\" is forbidden",
		"worker-3 <none> <none>; unreachable: no running xdpq daemon pod",
		"uid 77aa worker-2 veth0 0 Filter/generic unreachable: get /metrics",
	} {
		if !strings.Contains(fields(out), w) {
			t.Errorf("top --once lacks %q:\n%s", w, out)
		}
	}
}

// fields is s with each line's fields one space apart.
func fields(s string) string {
	var b strings.Builder
	for l := range strings.Lines(s) {
		b.WriteString(strings.Join(strings.Fields(l), " ") + "\n")
	}
	return b.String()
}

// TestTopNamedNode: top of a node shows that node only; of a node without
// an XdpqNode, the others and the error.
func TestTopNamedNode(t *testing.T) {
	tc := newTopCluster(t, time.Second)
	out, err := tc.run(t, "once", "worker-1", "nosuch")
	var nx *kubectlxdpq.NoXdpqNodeError
	if !errors.As(err, &nx) || nx.Node != "nosuch" {
		t.Errorf("top worker-1 nosuch: %v, want no XdpqNode nosuch", err)
	}
	if !strings.Contains(out, "telco/upf-0") || strings.Contains(out, "worker-2") {
		t.Errorf("top worker-1 nosuch:\n%s", out)
	}
}

// TestTopLive: live, each refresh redraws the screen with the time and
// the table; it stops, without an error, when the user quits.
func TestTopLive(t *testing.T) {
	tc := newTopCluster(t, 2*time.Second)
	tc.bodies = append(tc.bodies, metricsBody(41000, 300, 0, 50, 7, 1, 4))
	out, err := tc.run(t, "live", "worker-1")
	if err != nil {
		t.Fatal(err)
	}
	frames := strings.Split(out, kubectlxdpq.ClearScreen)
	if len(frames) != 4 || frames[0] != "" {
		t.Fatalf("%d frames, want a first screen and two refreshes:\n%q", len(frames)-1, out)
	}
	if !strings.Contains(frames[1], "sampling: the first rates in 2s") {
		t.Errorf("first screen: %q", frames[1])
	}
	for i, want := range map[int]string{2: "10000", 3: "10000"} {
		title := fmt.Sprintf("Every 2s: kubectl xdpq top worker-1    %s\n", t0.Add(time.Duration(i-1)*2*time.Second).Format(time.DateTime))
		if !strings.HasPrefix(frames[i], title) || !strings.Contains(fields(frames[i]), "worker-1 ens1f0 8 Direct/native "+want+" ") {
			t.Errorf("frame %d, want title %q and queue 8 at %s/s:\n%s", i-1, title, want, frames[i])
		}
	}
	if !strings.Contains(fields(frames[3]), "telco/upf-0 worker-1 ens1f0 9 Direct/native 100 0 0 0 0") {
		t.Errorf("second refresh, want queue 9 at 100/s:\n%s", frames[3])
	}
}
