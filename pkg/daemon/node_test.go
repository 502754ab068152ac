package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
	"github.com/xdpq/xdpq/pkg/nodestatus"
)

// TestNodeStatusFakeAPIServer: a standalone daemon on a veth pair, with
// client-go's fake clients as its API server (test/e2e runs it against a
// real kube-apiserver), writes its XdpqNode's status (Ready once it
// serves) and records the Events of what the kernel and its config file
// do: an operator's program taking the netdev's hook over and leaving,
// a config refused.
func TestNodeStatusFakeAPIServer(t *testing.T) {
	p := testnet.NewPair(t, 4)
	dir := t.TempDir()
	o := standaloneOpts(t, p, dir, testPins(t), "pools: [{name: rx, attach: always, devices: {netdevs: ['xa#0-3']}}]\n")
	o.NodeName = "node-a"
	kube := kubefake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", UID: "node-uid"}})
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{v1alpha1.Resource: "XdpqNodeList"})
	statuses := make(chan v1alpha1.XdpqNodeStatus, 100)
	dyn.PrependReactor("patch", "xdpqnodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		var u unstructured.Unstructured
		if err := u.UnmarshalJSON(a.(k8stesting.PatchAction).GetPatch()); err != nil {
			return true, nil, err
		}
		if a.GetSubresource() == "status" {
			var x v1alpha1.XdpqNode
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &x); err != nil {
				return true, nil, err
			}
			statuses <- x.Status
		}
		u.SetUID("xdpqnode-uid")
		return true, &u, nil
	})
	evs := make(chan *eventsv1.Event, 100)
	kube.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		evs <- a.(k8stesting.CreateAction).GetObject().(*eventsv1.Event)
		return false, nil, nil
	})
	o.Kube = &Kube{Pods: kube.CoreV1().Pods(""), Nodes: kube.CoreV1().Nodes(), Events: &events.EventSinkImpl{Interface: kube.EventsV1()}, Dynamic: dyn}
	runDaemon(t, o)

	waitWritten := func(what string, ok func(v1alpha1.XdpqNodeStatus) bool) v1alpha1.XdpqNodeStatus {
		t.Helper()
		timeout := time.After(15 * time.Second)
		for {
			select {
			case s := <-statuses:
				if ok(s) {
					return s
				}
			case <-timeout:
				t.Fatalf("status never showed %s", what)
			}
		}
	}
	waitEvent := func(reason string) *eventsv1.Event {
		t.Helper()
		timeout := time.After(15 * time.Second)
		for {
			select {
			case e := <-evs:
				if e.Reason == reason {
					return e
				}
			case <-timeout:
				t.Fatalf("no %s event", reason)
			}
		}
	}
	netdev := func(s v1alpha1.XdpqNodeStatus) v1alpha1.Netdev {
		for _, n := range s.Netdevs {
			if n.Name == "xa" {
				return n
			}
		}
		return v1alpha1.Netdev{}
	}
	s := waitWritten("Ready and xa", func(s v1alpha1.XdpqNodeStatus) bool {
		return meta.IsStatusConditionTrue(s.Conditions, v1alpha1.ConditionReady) && netdev(s).State == v1alpha1.StateFilter
	})
	if n := netdev(s); n.Queues != 4 || n.ProgramName != "xdpq_filter" || n.ProgramID == 0 || n.XDPMode == "" || s.Summary.Queues != "0/4" {
		t.Errorf("xa: %+v, summary %+v", n, s.Summary)
	}

	if err := foreign(p, true); err != nil {
		t.Fatal(err)
	}
	took := time.Now()
	s = waitWritten("xa Overridden", func(s v1alpha1.XdpqNodeStatus) bool { return netdev(s).State == v1alpha1.StateOverridden })
	t.Logf("Overridden written %v after the operator's program", time.Since(took))
	if n := netdev(s); n.ForeignProgram != "operator_pass" || s.Summary.Overridden != 1 || !meta.IsStatusConditionTrue(s.Conditions, v1alpha1.ConditionDegraded) {
		t.Errorf("overridden: %+v, summary %+v", n, s.Summary)
	}
	if e := waitEvent(nodestatus.EventNetdevOverridden); e.Regarding.Kind != v1alpha1.Kind || e.Regarding.Name != "node-a" || !strings.Contains(e.Note, "operator_pass") {
		t.Errorf("event %+v", e)
	}
	if err := foreign(p, false); err != nil {
		t.Fatal(err)
	}
	waitWritten("xa back to Filter", func(s v1alpha1.XdpqNodeStatus) bool { return netdev(s).State == v1alpha1.StateFilter })
	if e := waitEvent(nodestatus.EventNetdevReclaimed); !strings.Contains(e.Note, "Filter") {
		t.Errorf("event %+v", e)
	}

	os.WriteFile(filepath.Join(dir, "config.yaml"), []byte("pools: [{name: rx, devices: {netdevs: 7}}]\n"), 0o644)
	waitEvent(nodestatus.EventConfigRefused)
	s = waitWritten("ConfigValid False", func(s v1alpha1.XdpqNodeStatus) bool {
		return meta.IsStatusConditionFalse(s.Conditions, v1alpha1.ConditionConfigValid)
	})
	if !strings.HasSuffix(s.Summary.Config, " (refused newer)") || s.Config.LastError == "" {
		t.Errorf("config %+v, summary %q", s.Config, s.Summary.Config)
	}
}
