// Package kubepods tests pkg/kubepods against a real API server.
package kubepods

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/xdpq/xdpq/internal/kubeclient"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/kubepods"
	"github.com/xdpq/xdpq/test/e2e/cluster"
)

// TestDirectory: the directory of node n1 finds n1's pods by UID, from
// its informer and, for a pod created a moment ago, from one fresh list;
// a pod of another node is not found, and never reaches the informer (it
// watches with the field selector spec.nodeName, as kubelet does).
func TestDirectory(t *testing.T) {
	testnet.RequireRoot(t)
	cp := cluster.StartControlPlaneForTest(t, cluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	create := func(name, node string) *corev1.Pod {
		t.Helper()
		p, err := cp.Client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "xdpq.io/none"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// No controller manager runs: the namespace's service account is
	// made here.
	if _, err := cp.Client.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a, b := create("a", "n1"), create("b", "n2")

	d := runDirectory(ctx, t, cp, "n1")
	for !d.Synced() {
		select {
		case <-ctx.Done():
			t.Fatal("the directory never synced")
		case <-time.After(10 * time.Millisecond):
		}
	}

	if p, ok := d.Cached(string(a.UID)); !ok || p.Namespace != "default" || p.Name != "a" {
		t.Errorf("n1's pod from the informer: %+v %v", p, ok)
	}
	if _, ok := d.Cached(string(b.UID)); ok {
		t.Error("the informer has a pod of another node")
	}
	if _, err := d.PodByUID(ctx, string(b.UID)); err == nil || !strings.Contains(err.Error(), "no pod "+string(b.UID)+" on node n1") {
		t.Errorf("a pod of another node: %v", err)
	}
	// Created after the sync: found whether or not the informer has
	// seen it yet.
	c := create("c", "n1")
	if p, err := d.PodByUID(ctx, string(c.UID)); err != nil || p.Namespace != "default" || p.Name != "c" {
		t.Errorf("a pod created a moment ago: %+v %v", p, err)
	}
	if p, err := d.PodByUID(ctx, string(a.UID)); err != nil || p.Namespace != "default" || p.Name != "a" {
		t.Errorf("PodByUID of n1's pod: %+v %v", p, err)
	}
	// Next gives the pods that changed: n1's a (listed) and c (added),
	// never n2's b.
	seen := map[string]bool{}
	for !seen[string(a.UID)] || !seen[string(c.UID)] {
		uid, ok := d.Next(ctx)
		if !ok {
			t.Fatalf("Next ended having given %v", seen)
		}
		if uid == string(b.UID) {
			t.Fatal("Next gave a pod of another node")
		}
		seen[uid] = true
		d.Done(uid)
	}
}

// TestByIP: the directory finds n1's pods by the addresses they hold as
// their own (status.podIPs, both families), as the daemon asks when a
// network configuration names an address as a pod's: not a hostNetwork
// pod's (the node's), nor a pod's that ended (a new pod holds its
// address now), nor another node's; a pod that ends leaves the index.
func TestByIP(t *testing.T) {
	testnet.RequireRoot(t)
	cp := cluster.StartControlPlaneForTest(t, cluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cp.Client.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// pod is created on node and given phase and ips, as kubelet would.
	pod := func(name, node string, host bool, phase corev1.PodPhase, ips ...string) *corev1.Pod {
		t.Helper()
		p, err := cp.Client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.PodSpec{NodeName: node, HostNetwork: host, Containers: []corev1.Container{{Name: "c", Image: "xdpq.io/none"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.Phase = phase
		for _, ip := range ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		if p, err = cp.Client.CoreV1().Pods("default").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	web := pod("web-0", "n1", false, corev1.PodRunning, "10.244.0.5", "fd00:244::5")
	pod("host", "n1", true, corev1.PodRunning, "192.0.2.2")
	pod("job-old", "n1", false, corev1.PodSucceeded, "10.244.0.6")
	pod("job-new", "n1", false, corev1.PodRunning, "10.244.0.6")
	pod("elsewhere", "n2", false, corev1.PodRunning, "10.244.1.5")

	d := runDirectory(ctx, t, cp, "n1")
	names := func(a string) string {
		var out []string
		for _, p := range d.ByIP(netip.MustParseAddr(a)) {
			out = append(out, p.Name)
		}
		slices.Sort(out)
		return strings.Join(out, ",")
	}
	// The informer has them all once job-new is in.
	if err := wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(context.Context) (bool, error) {
		return d.Synced() && names("10.244.0.6") != "", nil
	}); err != nil {
		t.Fatal("the directory never synced")
	}
	for addr, want := range map[string]string{
		"10.244.0.5": "web-0", "fd00:244::5": "web-0", "::ffff:10.244.0.5": "web-0",
		"192.0.2.2": "", "10.244.0.6": "job-new", "10.244.1.5": "", "10.244.0.7": "",
	} {
		if got := names(addr); got != want {
			t.Errorf("ByIP(%s) = %q; want %q", addr, got, want)
		}
	}
	web.Status.Phase = corev1.PodFailed
	if _, err := cp.Client.CoreV1().Pods("default").UpdateStatus(ctx, web, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(context.Context) (bool, error) {
		return names("10.244.0.5") == "", nil
	}); err != nil {
		t.Errorf("a pod that ended still holds its address: %q", names("10.244.0.5"))
	}
}

// runDirectory runs node's pod directory until the test ends, with the
// daemon's own client (internal/kubeclient), as cmd/deviceplugin makes
// it.
func runDirectory(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, node string) *kubepods.Directory {
	t.Helper()
	kc, err := kubeclient.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	d, err := kubepods.New(kc.Pods(""), node)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	return d
}
