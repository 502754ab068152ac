package e2e_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/xsk"
	"github.com/xdpq/xdpq/test/e2e/cluster"
)

// operatorObj is an operator's own XDP program (XDP_PASS).
const operatorObj = repoRoot + "/pkg/agent/testdata/operator.o"

// peerSender sends a pod's flow from the NIC's peer on the peer's tx
// queues that arrive on the pod's queues, from sockets open for the
// whole scenario (a queue is busy for a while after its socket closes),
// and counts what it sent that xdpq should deliver.
type peerSender struct {
	r       *perfRun
	nic     *cluster.NIC
	socks   []*xsk.Socket
	senders []*traffic.Sender
	seq     uint64
	// counted is the frames of the flow sent per queue while xdpq's
	// program held the hook: what the pod must report.
	counted uint64
	// close closes the peer's sockets (at the test's end if not before):
	// their queues are another sender's to open then.
	close func()
}

func openPeerSender(t *testing.T, nic *cluster.NIC, r *perfRun) *peerSender {
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
	const frames = 1024
	umem, socks, err := xsk.Open(dev, qs, frames*len(qs), xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048},
		Rings: xsk.Rings{Fill: 64, Completion: 512, TX: 512}})
	if err != nil {
		t.Fatalf("open the peer's queues %v: %v", qs, err)
	}
	s := &peerSender{r: r, nic: nic, socks: socks}
	var once sync.Once
	s.close = func() {
		once.Do(func() {
			for _, s := range socks {
				s.Close()
			}
			umem.Close()
		})
	}
	t.Cleanup(s.close)
	for i, sock := range socks {
		addrs := make([]uint64, frames)
		for j := range addrs {
			addrs[j] = umem.FrameAddr(i*frames + j)
		}
		s.senders = append(s.senders, traffic.NewSender(sock, addrs, 0))
	}
	return s
}

// send sends n frames of the pod's flow and one to another port on each
// of its queues. counted says whether xdpq should deliver them (its
// program holds the hook). It returns an error rather than failing the
// test: it runs in goroutines too.
func (s *peerSender) send(n int, counted bool) error {
	src := netip.MustParseAddr("10.9.0.1")
	for i, snd := range s.senders {
		frames := make([][]byte, 0, n+1)
		for j := range n + 1 {
			port := uint16(s.r.port)
			if j == n {
				port = 9 // discard: no pod's flow
			}
			f, err := frame.Spec{SrcMAC: s.nic.PeerMAC, DstMAC: s.nic.MAC, Src: src, Dst: s.r.ip, Protocol: 17,
				SrcPort: 4000, DstPort: port, Payload: frame.Payload(uint32(i), s.seq+uint64(j), 40)}.Build()
			if err != nil {
				return err
			}
			frames = append(frames, f)
		}
		if err := snd.Send(frames, time.Now().Add(10*time.Second)); err != nil {
			return fmt.Errorf("send to %s on the peer's queue %d: %w", s.r.name, s.r.queues[i], err)
		}
	}
	s.seq += uint64(n + 1)
	if counted {
		s.counted += uint64(n)
	}
	return nil
}

// sendWhile sends batches of 100 frames of each sender's flow on each of
// its queues, counted, every 5 ms (a rate) until the returned stop is
// called; stop says how many batches were sent, or why sending failed.
func sendWhile(senders ...*peerSender) (stop func() (int, error)) {
	return sendWhileEvery(5*time.Millisecond, senders...)
}

// sendWhileEvery is sendWhile with a batch every interval.
func sendWhileEvery(interval time.Duration, senders ...*peerSender) (stop func() (int, error)) {
	done := make(chan struct{})
	result := make(chan error, 1)
	var batches int
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			for _, s := range senders {
				if err := s.send(100, true); err != nil {
					result <- err
					return
				}
			}
			batches++
			select {
			case <-done:
				result <- nil
				return
			case <-tick.C:
			}
		}
	}()
	return func() (int, error) {
		close(done)
		err := <-result
		return batches, err
	}
}

// checkTotals stops the pods and checks that each reports, on each of its
// queues, exactly the frames of its flow sent while xdpq held the hook.
func checkTotals(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, namespace string, senders ...*peerSender) {
	t.Helper()
	for _, s := range senders {
		if err := cp.Client.CoreV1().Pods(namespace).Delete(ctx, s.r.name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range senders {
		rx := s.r.totals(t)
		t.Logf("%s: sent %d frames of its flow on each of queues %v (and frames xdpq must not deliver); xdpqperf received %v",
			s.r.name, s.counted, s.r.queues, rx)
		for _, q := range s.r.queues {
			if rx[q] != s.counted {
				t.Errorf("%s: queue %d received %d frames, want %d (lost %d); its own counters:\n%s", s.r.name, q, rx[q], s.counted,
					int64(s.counted)-int64(rx[q]), strings.Join(s.r.counters, "\n"))
			}
		}
		if len(rx) != len(s.r.queues) {
			t.Errorf("%s reported queues %v, want %v", s.r.name, rx, s.r.queues)
		}
	}
}

// scrape reads the daemon's /metrics (host network) and returns the
// samples of the metric name as label sets with their values.
func scrape(ctx context.Context, t *testing.T, name string) []sample {
	t.Helper()
	return scrapeAt(ctx, t, "127.0.0.1", name)
}

// scrapeAt is scrape of the daemon of the node at addr.
func scrapeAt(ctx context.Context, t *testing.T, addr, name string) []sample {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(addr, strconv.Itoa(metricsPort))+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape the daemon: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape the daemon: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	var out []sample
	for _, m := range fams[name].GetMetric() {
		sm := sample{labels: map[string]string{}}
		for _, l := range m.GetLabel() {
			sm.labels[l.GetName()] = l.GetValue()
		}
		switch {
		case m.Counter != nil:
			sm.value = m.GetCounter().GetValue()
		case m.Gauge != nil:
			sm.value = m.GetGauge().GetValue()
		}
		out = append(out, sm)
	}
	return out
}

type sample struct {
	labels map[string]string
	value  float64
}

// redirected is what xdpq's program redirected to sockets per queue of
// netdev, from /metrics.
func redirected(ctx context.Context, t *testing.T, netdev string) map[int]uint64 {
	t.Helper()
	out := map[int]uint64{}
	for _, sm := range scrape(ctx, t, "xdpq_agent_program_packets_total") {
		if sm.labels["netdev"] != netdev || sm.labels["result"] != "redirected" {
			continue
		}
		q, err := strconv.Atoi(sm.labels["queue"])
		if err != nil {
			t.Fatalf("queue label %q", sm.labels["queue"])
		}
		out[q] = uint64(sm.value)
	}
	return out
}

// waitFreed waits until the pool has no allocation and no lease and the
// NIC no steered flow (the daemon's /metrics), and the XdpqNode shows no
// allocation.
func waitFreed(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, node string) {
	t.Helper()
	waitFreedAt(ctx, t, cp, node, "127.0.0.1")
}

// waitFreedAt is waitFreed of the node whose daemon is at addr.
func waitFreedAt(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, node, addr string) {
	t.Helper()
	var left string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		left = ""
		for _, m := range []string{"xdpq_pool_allocations", "xdpq_pool_leases", "xdpq_pool_allocated_devices", "xdpq_agent_steered_flows"} {
			for _, sm := range scrapeAt(ctx, t, addr, m) {
				if sm.value != 0 {
					left += fmt.Sprintf("%s%v %v; ", m, sm.labels, sm.value)
				}
			}
		}
		out, err := cp.Kubectl(ctx, "get", "xdpqnode", node, "-o", "jsonpath={.status.allocations[*].id}")
		if err != nil || strings.TrimSpace(string(out)) != "" {
			left += fmt.Sprintf("XdpqNode allocations %q (%v); ", out, err)
		}
		return left == "", nil
	})
	if err != nil {
		t.Errorf("with every pod gone, left: %s", left)
	}
}

// waitCondition waits until the XdpqNode's condition typ has status.
func waitCondition(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, node, typ, status string) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err := cp.Kubectl(ctx, "get", "xdpqnode", node, "-o", fmt.Sprintf(`jsonpath={.status.conditions[?(@.type=="%s")].status}`, typ))
		last = strings.TrimSpace(string(out))
		return err == nil && last == status, nil
	})
	if err != nil {
		t.Fatalf("the XdpqNode's %s never became %s (last %q): %v", typ, status, last, err)
	}
}

// waitPodRows waits until `kubectl xdpq pods` shows each pod's row: its
// node, netdev, pool, queues, flow and a connected lease. The daemon
// writes its XdpqNode a little after a pod binds (or resumes) its
// allocation.
func waitPodRows(ctx context.Context, t *testing.T, k kubectl, node, namespace string, runs ...*perfRun) {
	t.Helper()
	waitPodRowsOn(ctx, t, k, node, scenarioNIC, namespace, runs...)
}

// waitPodRowsOn is waitPodRows of pods on netdev of node.
func waitPodRowsOn(ctx context.Context, t *testing.T, k kubectl, node, netdev, namespace string, runs ...*perfRun) {
	t.Helper()
	var pods string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var stderr string
		var err error
		pods, stderr, err = k.run(ctx, "xdpq", "pods", "-n", namespace)
		if err != nil {
			return false, fmt.Errorf("kubectl xdpq pods: %w: %s", err, stderr)
		}
		for _, p := range runs {
			want := fmt.Sprintf(`(?m)^%s\s+%s\s+%s\s+%s\s+%s\s+udp %s:%d\s+connected`, p.name, node, netdev, scenarioPool,
				queueList(p.queues), regexp.QuoteMeta(p.ip.String()), p.port)
			if !regexp.MustCompile(want).MatchString(pods) {
				return false, nil
			}
		}
		return true, nil
	})
	t.Logf("kubectl xdpq pods -n %s:\n%s", namespace, pods)
	if err != nil {
		t.Errorf("kubectl xdpq pods never showed the pods' queues, flows and leases: %v", err)
	}
}

// netdevState is the XdpqNode's state of netdev ("" if not shown).
func netdevState(ctx context.Context, cp *cluster.ControlPlane, node, netdev string) (string, error) {
	out, err := cp.Kubectl(ctx, "get", "xdpqnode", node, "-o", fmt.Sprintf(`jsonpath={.status.netdevs[?(@.name=="%s")].state}`, netdev))
	return strings.TrimSpace(string(out)), err
}

// waitNetdevState waits until the XdpqNode shows netdev in state.
func waitNetdevState(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, node, netdev, state string) time.Duration {
	t.Helper()
	start := time.Now()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		last, err = netdevState(ctx, cp, node, netdev)
		return err == nil && last == state, nil
	})
	if err != nil {
		t.Fatalf("the XdpqNode never showed %s %s (last %q): %v", netdev, state, last, err)
	}
	return time.Since(start)
}

// waitEventReason waits for an Event of reason mentioning netdev.
func waitEventReason(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, reason, netdev string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		evs, err := cp.Client.EventsV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=" + reason})
		if err != nil {
			return false, nil
		}
		return slices.ContainsFunc(evs.Items, func(e eventsv1.Event) bool { return strings.Contains(e.Note, netdev) }), nil
	})
	if err != nil {
		t.Errorf("no %s Event about %s: %v", reason, netdev, err)
	}
}

// daemonPod returns the xdpq DaemonSet's pod on the node.
func daemonPod(ctx context.Context, t *testing.T, cp *cluster.ControlPlane) *corev1.Pod {
	t.Helper()
	pods, err := cp.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=xdpq"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			return &pods.Items[i]
		}
	}
	t.Fatal("no xdpq pod")
	return nil
}

// waitNewDaemonReady waits until an xdpq pod other than old is Ready.
func waitNewDaemonReady(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, old string) *corev1.Pod {
	t.Helper()
	var ready *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=xdpq"})
		if err != nil {
			return false, nil
		}
		for i, p := range pods.Items {
			if p.Name != old && p.DeletionTimestamp == nil && podReady(p.Status.Conditions) {
				ready = &pods.Items[i]
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no new xdpq pod Ready after %s was deleted: %v", old, err)
	}
	return ready
}

// containerIDs returns the pods' container IDs and restart counts, to
// show that they were not touched.
func containerIDs(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, namespace string, names ...string) string {
	t.Helper()
	var b strings.Builder
	for _, n := range names {
		p, err := cp.Client.CoreV1().Pods(namespace).Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, "%s/%s %s restarts=%d; ", n, c.Name, c.ContainerID, c.RestartCount)
		}
	}
	return b.String()
}

// allocationIDs is the XdpqNode's allocations, sorted.
func allocationIDs(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, node string) string {
	t.Helper()
	out, err := cp.Kubectl(ctx, "get", "xdpqnode", node, "-o", "jsonpath={.status.allocations[*].id}")
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	ids := strings.Fields(string(out))
	slices.Sort(ids)
	return strings.Join(ids, " ")
}

// waitFlowsRefused waits for the daemon's FlowsRefused Event on the pod
// and returns its note; FlowsApplied instead fails the test.
func waitFlowsRefused(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns, pod string) string {
	t.Helper()
	return waitFlowsEvent(ctx, t, cp, ns, pod, "FlowsRefused", "FlowsApplied")
}

// waitFlowsEvent waits for the daemon's Event of reason want on the pod
// and returns its note; one of reason not instead fails the test.
func waitFlowsEvent(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns, pod, want, not string) string {
	t.Helper()
	var note string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		evs, err := cp.Client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == pod && e.Reason == not {
				return false, fmt.Errorf("%s: %s", not, e.Note)
			}
			if e.Regarding.Name == pod && e.Reason == want {
				note = e.Note
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		out, _ := cp.Kubectl(ctx, "-n", ns, "get", "events")
		t.Fatalf("pod %s: no %s Event: %v\n%s", pod, want, err, out)
	}
	return note
}
