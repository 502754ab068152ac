package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/test/e2e/cluster"
	"github.com/xdpq/xdpq/test/e2e/images"
)

// BenchmarkPodStartupXdpq measures, side by side in one run on the
// scenario's node with xdpq installed, the time from a pod's creation to
// its Running phase for a restricted xdpqperf pod with one queue of the
// pool (its sockets included: until it says it has them) and for the
// same restricted pod of the pause image without the resource (Running),
// alternating, one pod
// at a time, each deleted before the next. It reports the medians and
// their ratio.
//
//	cd test/e2e && flock -o /tmp/xdpq-kernel.lock go test -run '^$' -bench PodStartupXdpq -benchtime 20x .
func BenchmarkPodStartupXdpq(b *testing.B) {
	testnet.RequireRoot(b)
	ctx := context.Background()
	e := newScenarioEnv(ctx, b)
	e.install(ctx, b, "--set", "dra.servedBy=devicePlugin")
	waitAllocatable(ctx, b, e.cp, e.node.Name, scenarioQueues)
	const ns = "bench"
	if err := e.cp.CreateNamespace(ctx, ns, map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}); err != nil {
		b.Fatal(err)
	}
	pods := e.cp.Client.CoreV1().Pods(ns)
	run := func(name string, xdpq bool) time.Duration {
		p := perfPod(ns, name, e.ref, 6000)
		c := &p.Spec.Containers[0]
		if xdpq {
			c.Resources.Limits[scenarioResource] = resource.MustParse("1")
		} else {
			// The node's pause image: no xdpq resource, nothing to wait for
			// but Running.
			delete(c.Resources.Limits, scenarioResource)
			c.Image, c.Command = images.Pause().Ref, nil
		}
		start := time.Now()
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		if xdpq {
			followPerfPod(ctx, b, e.cp, ns, name, 6000) // Running, and its sockets bound
		} else if _, err := e.cp.WaitPod(ctx, ns, name, cluster.PodRunning); err != nil {
			b.Fatal(err)
		}
		took := time.Since(start)
		deletePodNow(ctx, b, e.cp, ns, name)
		return took
	}
	var with, without []time.Duration
	b.ResetTimer()
	for i := range b.N {
		with = append(with, run(fmt.Sprintf("with-%d", i), true))
		without = append(without, run(fmt.Sprintf("without-%d", i), false))
	}
	b.StopTimer()
	p50 := func(d []time.Duration) time.Duration { s := slices.Clone(d); slices.Sort(s); return s[len(s)/2] }
	b.ReportMetric(float64(p50(with).Milliseconds()), "ms-p50-xdpq")
	b.ReportMetric(float64(p50(without).Milliseconds()), "ms-p50-plain")
	b.ReportMetric(float64(p50(with))/float64(p50(without)), "ratio")
	b.Logf("create to Running (xdpq: and its sockets), %d pods each:\nxdpq  %v\nplain %v", b.N, with, without)
}

// deletePodNow deletes the pod at once (grace period 0) and waits until
// the API server has it no more.
func deletePodNow(ctx context.Context, tb testing.TB, cp *cluster.ControlPlane, ns, name string) {
	tb.Helper()
	if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		tb.Fatal(err)
	}
	if out, err := cp.Kubectl(ctx, "-n", ns, "wait", "--for=delete", "pod/"+name, "--timeout=60s"); err != nil {
		tb.Fatalf("%v\n%s", err, out)
	}
}
