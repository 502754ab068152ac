package e2e_test

import (
	"context"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/test/e2e/cluster"
)

// queueClaim is a ResourceClaim of one queue of class upf.xdpq.io with
// the xdpq.io parameters given.
func queueClaim(name, params string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "queues", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: "upf.xdpq.io", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}},
			Config: []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
				Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "xdpq.io", Parameters: runtime.RawExtension{Raw: []byte(params)}}}}}}}}
}

// TestAdmissionPolicy: with the chart installed, the API server itself
// (the chart's ValidatingAdmissionPolicy, CEL, no webhook) refuses a
// claim, a claim template or a DeviceClass whose xdpq.io config is not
// valid, saying which field (an unknown one by its name: before, "a
// field QueueConfig does not have"); a valid one, and another driver's
// config, are accepted.
func TestAdmissionPolicy(t *testing.T) {
	testnet.RequireRoot(t)
	cp := cluster.StartControlPlaneForTest(t, cluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute) // a fresh build of helm included
	defer cancel()
	if out, err := cp.Helm(ctx, "install", "xdpq", "../../charts/xdpq", "-n", "kube-system",
		"--set", "config.pools[0].name=upf", "--set", "config.pools[0].devices.netdevs[0]=eth1#0-3"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	claims := cp.Client.ResourceV1().ResourceClaims("default")
	const head = `{"apiVersion": "xdpq.io/v1alpha1", "kind": "QueueConfig"`
	// The policy applies once the API server has loaded it.
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := claims.Create(ctx, queueClaim("probe", head+`, "flows": [{"protocol": "icmp"}]}`), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), "protocol") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a claim with protocol icmp is still accepted a minute after helm install: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, c := range []struct{ name, params, refusal string }{
		{"good", head + `, "flows": [{"protocol": "udp", "destinationPort": "2152"}, {"protocol": "tcp", "destination": "ipam", "destinationPort": "80-81", "sourcePort": "5", "vlan": 7}], "interface": {"name": "net1", "mtu": 9000, "addresses": ["192.0.2.7/24", "2001:db8::7/64"]}}`, ""},
		{"version", `{"apiVersion": "xdpq.io/v1", "kind": "QueueConfig"}`, "apiVersion must be xdpq.io/v1alpha1"},
		{"case", head + `, "Flows": []}`, "QueueConfig has no field Flows (it has apiVersion, kind, flows, interface; names are case-sensitive)"},
		{"flows-object", head + `, "flows": {"protocol": "udp"}}`, "flows must be a list"},
		{"flow-field", head + `, "flows": [{"protocol": "udp", "port": "53"}]}`, "flows must be a list"},
		{"protocol", head + `, "flows": [{"protocol": "sctp"}]}`, "flows[].protocol"},
		{"port", head + `, "flows": [{"protocol": "udp", "destinationPort": "70000"}]}`, "flows[].destinationPort"},
		{"port-number", head + `, "flows": [{"protocol": "udp", "destinationPort": 53}]}`, "flows[].destinationPort"},
		{"source-range", head + `, "flows": [{"protocol": "udp", "sourcePort": "1-2"}]}`, "flows[].sourcePort"},
		{"vlan", head + `, "flows": [{"protocol": "udp", "vlan": 4095}]}`, "flows[].vlan"},
		{"ifname", head + `, "interface": {"name": "a/b"}}`, "interface.name"},
		{"ifname-long", head + `, "interface": {"name": "abcdefghijklmnop"}}`, "interface.name"},
		{"mtu", head + `, "interface": {"mtu": 40}}`, "interface.mtu"},
		{"address", head + `, "interface": {"addresses": ["192.0.2.7"]}}`, "interface.addresses"},
		{"iface-field", head + `, "interface": {"ips": []}}`, "interface has no field ips (it has name, mtu and addresses)"},
		{"iface-string", head + `, "interface": "net1"}`, "interface has name, mtu and addresses"},
	} {
		_, err := claims.Create(ctx, queueClaim(c.name, c.params), metav1.CreateOptions{})
		switch {
		case c.refusal == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.refusal != "" && (err == nil || !strings.Contains(err.Error(), c.refusal)):
			t.Errorf("%s: %v, want a refusal saying %q", c.name, err, c.refusal)
		}
	}
	// More than one queue: one netdev, which only the claim can say.
	two := func(name, class string, constrained bool) *resourceapi.ResourceClaim {
		c := queueClaim(name, head+"}")
		c.Spec.Devices.Requests[0].Exactly.Count, c.Spec.Devices.Requests[0].Exactly.DeviceClassName = 2, class
		if constrained {
			c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{Requests: []string{"queues"}, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName("xdpq.io/netdev"))}}
		}
		return c
	}
	if _, err := claims.Create(ctx, two("two", "upf.xdpq.io", false), metav1.CreateOptions{}); err == nil ||
		!strings.Contains(err.Error(), "devices.requests queues: more than one device of xdpq.io needs the constraint matchAttribute: xdpq.io/netdev") {
		t.Errorf("a claim of 2 queues without matchAttribute: %v", err)
	}
	for _, c := range []*resourceapi.ResourceClaim{two("two-on-one", "upf.xdpq.io", true), two("two-extended", "upf.extended.xdpq.io", false)} {
		if _, err := claims.Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Errorf("%s: %v", c.Name, err)
		}
	}
	// Another driver's config is not xdpq's to judge.
	other := queueClaim("other", `{"anything": true}`)
	other.Spec.Devices.Config[0].Opaque.Driver = "gpu.example.com"
	if _, err := claims.Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Errorf("another driver's config: %v", err)
	}
	// A template and a class are checked the same way.
	bad := head + `, "flows": [{"protocol": "udp", "destinationPort": "0"}]}`
	tpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "bad"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: queueClaim("", bad).Spec}}
	if _, err := cp.Client.ResourceV1().ResourceClaimTemplates("default").Create(ctx, tpl, metav1.CreateOptions{}); err == nil ||
		!strings.Contains(err.Error(), "flows[].destinationPort") {
		t.Errorf("a template with port 0: %v", err)
	}
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "bad.example.com"},
		Spec: resourceapi.DeviceClassSpec{Config: []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "xdpq.io", Parameters: runtime.RawExtension{Raw: []byte(bad)}}}}}}}
	if _, err := cp.Client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err == nil ||
		!strings.Contains(err.Error(), "flows[].destinationPort") {
		t.Errorf("a class with port 0: %v", err)
	}
	out, _ := cp.Kubectl(ctx, "get", "validatingadmissionpolicy", "xdpq-queueconfig", "-o", "jsonpath={.status}")
	t.Logf("the policy's status (type checking): %s", out)
}
