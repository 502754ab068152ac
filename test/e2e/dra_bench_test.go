package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/test/e2e/cluster"
	"github.com/xdpq/xdpq/test/e2e/images"
)

// The pool the DRA bench serves by the device plugin, beside the
// scenario's pool served by DRA: queues 4-5 of the scenario's NIC.
const benchDPPool = "dp"

// BenchmarkPodStartupDRA measures, side by side in one run on the
// scenario's node (containerd 2, xdpq installed with pool upf served by
// DRA and pool dp by the device plugin), the time from a restricted
// pod's creation to its Running phase, with its sockets for xdpqperf
// pods, for: a pod with a ResourceClaimTemplate of one queue; a pod
// asking xdpq.io/upf: 1 in its limits (the extended resource served by
// DRA); a pod asking xdpq.io/dp: 1 (the device plugin); and the pause
// image without a resource. One pod at a time, the four kinds in turn,
// each deleted before the next. It reports p50 and p99 of each and the
// ratio of the DRA claim's p50 to the plain pod's (goal ≤ 1.05), then
// the API writes the driver made: ResourceSlice writes and claim-status
// writes, during 60 s idle (goal 0) and during the churn (ResourceSlice
// writes a second, goal ≤ 0.2; claim-status writes per claim).
//
//	cd test/e2e && flock -o /tmp/xdpq-kernel.lock go test -run '^$' -bench PodStartupDRA -benchtime 20x -timeout 30m .
func BenchmarkPodStartupDRA(b *testing.B) {
	testnet.RequireRoot(b)
	ctx := context.Background()
	e := newScenarioEnv(ctx, b)
	e.install(ctx, b, "--set", "config.pools[0].devices.netdevs[0]="+scenarioNIC+"#0-3",
		"--set", "config.pools[1].name="+benchDPPool, "--set", "config.pools[1].servedBy=devicePlugin",
		"--set", "config.pools[1].devices.netdevs[0]="+scenarioNIC+"#4-5", "--set", "config.pools[1].steering=software")
	waitAllocatableOf(ctx, b, e.cp, e.node.Name, "xdpq.io/"+benchDPPool, 2)
	const ns = "bench"
	if err := e.cp.CreateNamespace(ctx, ns, map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}); err != nil {
		b.Fatal(err)
	}
	tpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "one-queue"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "queues", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: scenarioClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}}}}}
	if _, err := e.cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tpl, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	w := watchDriverWrites(ctx, b, e.cp)
	// Idle: the slices published, nothing changes.
	waitSlices(ctx, b, e.cp, 1)
	idle0 := w.counts()
	time.Sleep(60 * time.Second) // the measurement's window, not a synchronisation
	idle := w.counts().minus(idle0)

	pods := e.cp.Client.CoreV1().Pods(ns)
	kinds := []string{"dra-claim", "dra-extended", "device-plugin", "plain"}
	run := func(kind string, i int) time.Duration {
		name := fmt.Sprintf("%s-%d", kind, i)
		p := perfPod(ns, name, e.ref, 6000)
		p.Annotations = nil
		c := &p.Spec.Containers[0]
		switch kind {
		case "dra-claim":
			delete(c.Resources.Limits, scenarioResource)
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "queues", ResourceClaimTemplateName: ptr.To("one-queue")}}
			c.Resources.Claims = []corev1.ResourceClaim{{Name: "queues"}}
		case "dra-extended":
			c.Resources.Limits[scenarioResource] = resource.MustParse("1")
		case "device-plugin":
			delete(c.Resources.Limits, scenarioResource)
			c.Resources.Limits["xdpq.io/"+benchDPPool] = resource.MustParse("1")
		case "plain":
			delete(c.Resources.Limits, scenarioResource)
			c.Image, c.Command = images.Pause().Ref, nil
		}
		start := time.Now()
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		if kind == "plain" {
			if _, err := e.cp.WaitPod(ctx, ns, name, cluster.PodRunning); err != nil {
				b.Fatal(err)
			}
		} else {
			r := followPerfPod(ctx, b, e.cp, ns, name, 6000) // Running, and its sockets bound
			if len(r.queues) != 1 {
				b.Fatalf("%s: queues %v", name, r.queues)
			}
		}
		took := time.Since(start)
		deletePodNow(ctx, b, e.cp, ns, name)
		return took
	}
	took := map[string][]time.Duration{}
	churn0, churnStart := w.counts(), time.Now()
	b.ResetTimer()
	for i := range b.N {
		for _, k := range kinds {
			took[k] = append(took[k], run(k, i))
		}
	}
	b.StopTimer()
	churnTime := time.Since(churnStart)
	churn := w.counts().minus(churn0)
	pct := func(d []time.Duration, p int) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[min(len(s)-1, len(s)*p/100)]
	}
	table := fmt.Sprintf("create to Running (xdpqperf: and its sockets), %d pods of each kind, this machine:\n%-14s %8s %8s %8s\n", b.N, "kind", "p50 ms", "p99 ms", "vs plain")
	for _, k := range kinds {
		table += fmt.Sprintf("%-14s %8d %8d %8.2f\n", k, pct(took[k], 50).Milliseconds(), pct(took[k], 99).Milliseconds(),
			float64(pct(took[k], 50))/float64(pct(took["plain"], 50)))
		b.ReportMetric(float64(pct(took[k], 50).Milliseconds()), "ms-p50-"+k)
	}
	claims := b.N * 2 // a claim per DRA pod: the template's, and the scheduler's for the extended resource
	table += fmt.Sprintf("\nthe driver's API writes:\n%-32s %8s %14s\n", "", "slices", "claim status")
	table += fmt.Sprintf("%-32s %8d %14d\n", "idle 60 s", idle.slices, idle.claimStatus)
	table += fmt.Sprintf("%-32s %8d %14d\n", fmt.Sprintf("churn %s, %d pods", churnTime.Round(time.Second), b.N*len(kinds)), churn.slices, churn.claimStatus)
	table += fmt.Sprintf("%-32s %8.3f %14.2f\n", "churn: slices/s, status/claim", float64(churn.slices)/churnTime.Seconds(), float64(churn.claimStatus)/float64(claims))
	b.ReportMetric(float64(idle.slices+idle.claimStatus), "idle-writes")
	b.ReportMetric(float64(churn.slices)/churnTime.Seconds(), "slice-writes/s")
	b.Log("\n" + table)
}

// driverWrites counts, from the API server's watch, the writes of the
// DRA driver: ResourceSlices made, changed or deleted (only the driver
// writes its node's), and changes of a claim's driver entries in
// status.devices (the driver's alone).
type driverWrites struct {
	mu sync.Mutex
	n  writeCounts
}

type writeCounts struct{ slices, claimStatus int }

func (c writeCounts) minus(o writeCounts) writeCounts {
	return writeCounts{c.slices - o.slices, c.claimStatus - o.claimStatus}
}

func (w *driverWrites) counts() writeCounts {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

func watchDriverWrites(ctx context.Context, tb testing.TB, cp *cluster.ControlPlane) *driverWrites {
	tb.Helper()
	ctx, cancel := context.WithCancel(ctx)
	tb.Cleanup(cancel)
	w := &driverWrites{}
	sw, err := cp.Client.ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	cw, err := cp.Client.ResourceV1().ResourceClaims("").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	go func() {
		for ev := range sw.ResultChan() {
			if ev.Type == watch.Added || ev.Type == watch.Modified || ev.Type == watch.Deleted {
				w.mu.Lock()
				w.n.slices++
				w.mu.Unlock()
			}
		}
	}()
	go func() {
		last := map[string]string{}
		for ev := range cw.ResultChan() {
			c, ok := ev.Object.(*resourceapi.ResourceClaim)
			if !ok {
				continue
			}
			var ours []resourceapi.AllocatedDeviceStatus
			for _, d := range c.Status.Devices {
				if d.Driver == "xdpq.io" {
					ours = append(ours, d)
				}
			}
			b, _ := json.Marshal(ours)
			if ev.Type == watch.Deleted {
				delete(last, string(c.UID))
				continue
			}
			// Entries gone are the claim's deallocation (the API server's
			// controller), not the driver's write.
			if prev, seen := last[string(c.UID)]; len(ours) > 0 && (!seen || prev != string(b)) {
				w.mu.Lock()
				w.n.claimStatus++
				w.mu.Unlock()
			}
			last[string(c.UID)] = string(b)
		}
	}()
	return w
}

// waitSlices waits until the node has n ResourceSlices.
func waitSlices(ctx context.Context, tb testing.TB, cp *cluster.ControlPlane, n int) {
	tb.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		l, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err == nil && len(l.Items) == n {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("not %d ResourceSlices after 2 min: %v", n, err)
		}
	}
}
