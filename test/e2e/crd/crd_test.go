package crd

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
	"github.com/xdpq/xdpq/pkg/nodestatus"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/test/e2e/cluster"
)

const (
	nodeName = "xdpq-e2e-node"
	crdFile  = "../../../charts/xdpq/crds/xdpq.io_xdpqnodes.yaml"
	// operatorObj is an operator's own XDP program (XDP_PASS), named
	// operator_pass.
	operatorObj = "../../../pkg/agent/testdata/operator.o"
)

// env is a control plane with the CRD installed and a Node, and a
// standalone daemon on a veth pair that reports to it.
type env struct {
	t    testing.TB
	cp   *cluster.ControlPlane
	dyn  dynamic.Interface
	pair *testnet.Pair
	dir  string
	node *corev1.Node
	api  *api.Client
}

func setup(t testing.TB, config string) *env {
	t.Helper()
	testnet.RequireRoot(t)
	e := &env{t: t, cp: cluster.StartControlPlaneForTest(t, cluster.Options{}), dir: t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var err error
	if e.dyn, err = dynamic.NewForConfig(e.cp.Config); err != nil {
		t.Fatal(err)
	}
	if out, err := e.cp.Kubectl(ctx, "apply", "--server-side", "-f", crdFile); err != nil {
		t.Fatalf("install the CRD: %v\n%s", err, out)
	}
	if out, err := e.cp.Kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s", "crd/xdpqnodes.xdpq.io"); err != nil {
		t.Fatalf("CRD not established: %v\n%s", err, out)
	}
	// The Node kubelet would register: the XdpqNode's owner.
	if e.node, err = e.cp.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.pair = testnet.NewPair(t, 4)
	bin := filepath.Join(e.dir, "deviceplugin")
	build := exec.Command("go", "build", "-o", bin, "./cmd/deviceplugin")
	build.Dir = "../../.." // the main module's, as make build builds it
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the daemon: %v\n%s", err, out)
	}
	if err := xdp.MountBPFFS(xdp.DefaultBPFFS); err != nil {
		t.Fatal(err)
	}
	pins, err := os.MkdirTemp(xdp.DefaultBPFFS, "xdpq-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pins) })
	cfg := filepath.Join(e.dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(e.dir, "api.sock")
	daemon := exec.Command(bin, "-standalone", "-netns", e.pair.NSPath(), "-kubeconfig", e.cp.Kubeconfig, "-node-name", nodeName,
		"-config", cfg, "-pin-dir", filepath.Join(pins, "xdpq"), "-state-dir", filepath.Join(e.dir, "state"),
		"-alloc-dir", filepath.Join(e.dir, "alloc"), "-api-socket", sock, "-metrics-addr", "")
	logPath := filepath.Join(e.dir, "daemon.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	daemon.Stdout, daemon.Stderr = logf, logf
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- daemon.Wait() }()
	t.Cleanup(func() {
		daemon.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			daemon.Process.Kill()
			<-exited
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("daemon log:\n%s", b)
		}
	})
	e.api = api.NewClient(sock)
	return e
}

// watchNode watches the XdpqNode, the events converted.
func (e *env) watchNode(ctx context.Context) <-chan *v1alpha1.XdpqNode {
	e.t.Helper()
	w, err := e.dyn.Resource(v1alpha1.Resource).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + nodeName})
	if err != nil {
		e.t.Fatal(err)
	}
	out := make(chan *v1alpha1.XdpqNode, 100)
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			var o v1alpha1.XdpqNode
			u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ev.Object)
			if err == nil {
				err = runtime.DefaultUnstructuredConverter.FromUnstructured(u, &o)
			}
			if err != nil {
				e.t.Errorf("xdpqnode event: %v", err)
				continue
			}
			out <- &o
		}
		close(out)
	}()
	return out
}

// until reads objects from ch until ok holds for one.
func until(t testing.TB, ch <-chan *v1alpha1.XdpqNode, timeout time.Duration, what string, ok func(*v1alpha1.XdpqNode) bool) *v1alpha1.XdpqNode {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case o, open := <-ch:
			if !open {
				t.Fatalf("watch ended before %s", what)
			}
			if ok(o) {
				return o
			}
		case <-deadline:
			t.Fatalf("XdpqNode never showed %s in %v", what, timeout)
		}
	}
}

func netdev(o *v1alpha1.XdpqNode, name string) v1alpha1.Netdev {
	for _, n := range o.Status.Netdevs {
		if n.Name == name {
			return n
		}
	}
	return v1alpha1.Netdev{}
}

// foreign attaches (on) or removes the operator's program on xa.
func foreign(t testing.TB, p *testnet.Pair, on bool) {
	t.Helper()
	obj := ""
	if on {
		obj = operatorObj
	}
	if err := cluster.OperatorXDP(p.NSPath(), "xa", obj); err != nil {
		t.Fatal(err)
	}
}

// waitEvent waits for an event of reason regarding kind in namespace
// (cluster-scoped objects' events are in default).
func (e *env) waitEvent(ctx context.Context, namespace, kind, reason string) eventsv1.Event {
	e.t.Helper()
	w, err := e.cp.Client.EventsV1().Events(namespace).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	defer w.Stop()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				e.t.Fatalf("event watch ended before a %s event", reason)
			}
			if x, isEvent := ev.Object.(*eventsv1.Event); isEvent && x.Reason == reason && x.Regarding.Kind == kind {
				return *x
			}
		case <-deadline:
			e.t.Fatalf("no %s event on a %s", reason, kind)
		}
	}
}

// TestXdpqNode: the daemon creates its node's XdpqNode, owned by the
// Node, and its status appears (Ready, the netdev, the pool); an
// operator's program taking the netdev over shows within 2 s, with an
// Event, and so does its leaving; `kubectl get xdpqnodes` shows the
// columns; an allocation shows with its queues; a refused config shows
// as ConfigValid False with an Event.
func TestXdpqNode(t *testing.T) {
	e := setup(t, "pools: [{name: rx, attach: always, devices: {netdevs: ['xa#0-3']}}]\n")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	nodes := e.watchNode(ctx)
	o := until(t, nodes, time.Minute, "Ready and xa in Filter", func(o *v1alpha1.XdpqNode) bool {
		return meta.IsStatusConditionTrue(o.Status.Conditions, v1alpha1.ConditionReady) && netdev(o, "xa").State == v1alpha1.StateFilter
	})
	if refs := o.OwnerReferences; len(refs) != 1 || refs[0].Kind != "Node" || refs[0].UID != e.node.UID {
		t.Errorf("owners %+v, want the Node %s", refs, e.node.UID)
	}
	if n := netdev(o, "xa"); n.Queues != 4 || n.ProgramID == 0 || n.ProgramName != "xdpq_filter" || n.XDPMode != "native" || n.Steering != "software" || !n.LinkUp {
		t.Errorf("xa: %+v", n)
	}
	if p := o.Status.Pools; len(p) != 1 || p[0].Resource != "xdpq.io/rx" || p[0].Capacity != 4 || p[0].Allocated != 0 {
		t.Errorf("pools %+v", p)
	}
	if mf := o.ManagedFields; len(mf) == 0 || mf[len(mf)-1].Manager != nodestatus.FieldManager || mf[len(mf)-1].Operation != metav1.ManagedFieldsOperationApply {
		t.Errorf("managed fields %+v, want applies by %s", mf, nodestatus.FieldManager)
	}

	// kubectl's columns.
	out, err := e.cp.Kubectl(ctx, "get", "xdpqnodes")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl get xdpqnodes:\n%s", out)
	header, row := columns(t, out)
	wantHeader := []string{"NAME", "NETDEVS", "QUEUES", "OVERRIDDEN", "READY", "CONFIG", "AGE"}
	if strings.Join(header, " ") != strings.Join(wantHeader, " ") {
		t.Errorf("columns %q, want %q", header, wantHeader)
	}
	if len(row) == len(wantHeader) {
		if got := strings.Join(row[:6], " "); got != fmt.Sprintf("%s 1 0/4 0 True %s", nodeName, o.Status.Config.Hash[:12]) {
			t.Errorf("row %q", got)
		}
	}
	if out, err := e.cp.Kubectl(ctx, "get", "xqn", "-o", "wide"); err != nil || !strings.Contains(string(out), "DEGRADED") {
		t.Errorf("kubectl get xqn -o wide: %v\n%s", err, out)
	}

	// An operator's program takes the netdev over, and leaves.
	foreign(t, e.pair, true)
	took := time.Now()
	o = until(t, nodes, 30*time.Second, "xa Overridden", func(o *v1alpha1.XdpqNode) bool { return netdev(o, "xa").State == v1alpha1.StateOverridden })
	shown := time.Since(took)
	t.Logf("Overridden shown %v after the operator's program was attached", shown)
	if shown > 2*time.Second {
		t.Errorf("Overridden shown after %v, want within 2 s", shown)
	}
	if n := netdev(o, "xa"); n.ForeignProgram != "operator_pass" || o.Status.Summary.Overridden != 1 ||
		!meta.IsStatusConditionTrue(o.Status.Conditions, v1alpha1.ConditionDegraded) {
		t.Errorf("overridden: %+v %+v", n, o.Status.Summary)
	}
	ev := e.waitEvent(ctx, "default", v1alpha1.Kind, nodestatus.EventNetdevOverridden)
	if ev.Regarding.Name != nodeName || ev.Regarding.UID != o.UID || !strings.Contains(ev.Note, "operator_pass") || ev.Type != corev1.EventTypeWarning {
		t.Errorf("event %+v", ev)
	}
	out, _ = e.cp.Kubectl(ctx, "get", "xdpqnodes", "--no-headers")
	if _, row := columns(t, append([]byte("H H H H H H H\n"), out...)); len(row) < 4 || row[3] != "1" {
		t.Errorf("kubectl while overridden: %s", out)
	}
	foreign(t, e.pair, false)
	took = time.Now()
	until(t, nodes, 30*time.Second, "xa back in Filter", func(o *v1alpha1.XdpqNode) bool { return netdev(o, "xa").State == v1alpha1.StateFilter })
	t.Logf("Filter shown %v after the operator's program went", time.Since(took))
	e.waitEvent(ctx, "default", v1alpha1.Kind, nodestatus.EventNetdevReclaimed)

	// An allocation.
	a, err := e.api.Alloc("rx", 2, 65534)
	if err != nil {
		t.Fatal(err)
	}
	o = until(t, nodes, 30*time.Second, "the allocation", func(o *v1alpha1.XdpqNode) bool { return len(o.Status.Allocations) == 1 })
	if al := o.Status.Allocations[0]; al.ID != a.ID || len(al.Queues) != 2 || al.LeaseConnected || o.Status.Summary.Queues != "2/4" {
		t.Errorf("allocation %+v, summary %+v", al, o.Status.Summary)
	}

	// A refused config.
	if err := os.WriteFile(filepath.Join(e.dir, "config.yaml"), []byte("pools: [{name: rx, devices: {netdevs: 7}}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o = until(t, nodes, 30*time.Second, "ConfigValid False", func(o *v1alpha1.XdpqNode) bool {
		return meta.IsStatusConditionFalse(o.Status.Conditions, v1alpha1.ConditionConfigValid)
	})
	if !strings.Contains(o.Status.Config.LastError, "netdevs") {
		t.Errorf("config %+v", o.Status.Config)
	}
	e.waitEvent(ctx, "default", v1alpha1.Kind, nodestatus.EventConfigRefused)
	out, _ = e.cp.Kubectl(ctx, "get", "xdpqnodes")
	if !strings.Contains(string(out), "(refused newer)") {
		t.Errorf("kubectl after a refused config:\n%s", out)
	}
}

// columns splits kubectl's table into its header and first row.
func columns(t testing.TB, out []byte) (header, row []string) {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(out))
	if sc.Scan() {
		header = splitColumns(sc.Text())
	}
	if sc.Scan() {
		row = splitColumns(sc.Text())
	}
	return header, row
}

// splitColumns splits a table line at runs of two or more spaces (a
// cell may hold one: "abc (refused newer)").
func splitColumns(line string) []string {
	var out []string
	for _, f := range strings.Split(line, "  ") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
