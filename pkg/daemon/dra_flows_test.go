package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/dra"
)

// TestPrepareRefusesNodeAddressFlow: a queue claim whose config steers
// a flow to the node's own address (tcp <node>:22) is refused at
// Prepare, naming the flow and the node's netdev, before anything is
// held: no allocation, the pool's queues free. The CNI path refused it
// already; before, Prepare held the queues, the lease, the record and
// the CDI spec, and only a FlowsRefused event said the flow was dropped.
// A flow to another address prepares.
func TestPrepareRefusesNodeAddressFlow(t *testing.T) {
	pair := testnet.NewPair(t, 4)
	dir := t.TempDir()
	o := standaloneOpts(t, pair, dir, testPins(t), "pools: [{name: upf, servedBy: dra, steering: software, devices: {netdevs: ['xa#0-1']}}]\n")
	o.Standalone, o.NodeName = false, "node-a"
	o.PodResourcesSocket = filepath.Join(dir, "no-kubelet.sock")
	o.DRA = &DRA{Kube: fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", UID: "9f0c1e2d-3b4a-4c5d-8e6f-7a8b9c0d1e2f"}}),
		RegistryDir: filepath.Join(dir, "registry"), PluginDir: filepath.Join(dir, "dra"), CDIDir: filepath.Join(dir, "cdi")}
	for _, dir := range []string{o.DRA.RegistryDir, o.DRA.PluginDir, o.DRA.CDIDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	d, _ := runDaemon(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	claim := func(uid, dst string) dra.Claim {
		return dra.Claim{UID: uid, Namespace: "default", Name: "c-" + uid, Pool: "upf", Devices: []string{"xa-q0"},
			Pods: []string{"pod-" + uid}, Flows: []byte(fmt.Sprintf(`[{"protocol": "tcp", "destination": %q, "destinationPort": "22"}]`, dst))}
	}
	_, err := d.dra.PrepareClaim(ctx, claim("1", pair.A.Addr.String()))
	if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "claim config: flows:") ||
		!strings.Contains(err.Error(), fmt.Sprintf("destination %s is an address of the node (xa)", pair.A.Addr)) {
		t.Fatalf("prepare with a flow to the node's address: %v; want it refused, naming the flow", err)
	}
	if _, ok := d.core.ledger.ByClaim("1"); ok {
		t.Error("the refused claim holds an allocation")
	}
	st, err := d.core.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p := st.Pools[0]; p.Free != 2 {
		t.Errorf("pool after the refusal: %+v; want both queues free", p)
	}
	if _, err := d.dra.PrepareClaim(ctx, claim("2", "192.0.2.99")); err != nil {
		t.Fatalf("prepare with a flow to an address not the node's: %v", err)
	}
	if err := d.dra.UnprepareClaim(ctx, "2"); err != nil {
		t.Fatal(err)
	}
}
