package chart

import (
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
)

// draAPI is what a cluster of Kubernetes 1.34+ serves.
const draAPI = "resource.k8s.io/v1/DeviceClass"

// draPools are pools served each way: by the default (dra), by DRA
// explicitly in a per-node override, and by the device plugin.
var draPools = map[string]any{"config": map[string]any{
	"resourcePrefix": "example.com",
	"pools": []any{
		map[string]any{"name": "upf", "devices": map[string]any{"netdevs": []any{"ens1f0#8-15"}}},
		map[string]any{"name": "dns", "servedBy": "devicePlugin", "devices": map[string]any{"netdevs": []any{"ens1f0#4-7"}}},
	},
	"nodes": []any{map[string]any{"names": []any{"n1"}, "pools": []any{
		map[string]any{"name": "upf", "devices": map[string]any{"netdevs": []any{"ens2f0#8-15"}}},
		map[string]any{"name": "lb", "servedBy": "dra", "devices": map[string]any{"netdevs": []any{"ens2f0#0-3"}}},
	}}},
}}

// TestDRA: where the cluster serves resource.k8s.io/v1 the daemon is also
// the DRA driver (its flags, its socket and CDI directories at their host
// paths, its pod's UID for rolling updates, the RBAC it needs), and each
// pool DRA serves has a DeviceClass selecting its devices, with the
// pool's extended resource name; a pool the device plugin serves has
// none. Where the API is not served, or DRA is turned off, none of it.
func TestDRA(t *testing.T) {
	objs := objects(t, render(t, Options{APIVersions: []string{draAPI}, Values: draPools}))
	var classes []string
	for _, o := range find(objs, "DeviceClass") {
		dc := decode[resourceapi.DeviceClass](t, o)
		classes = append(classes, dc.Name)
		pool, extended := strings.CutSuffix(dc.Name, ".extended.xdpq.io")
		if !extended {
			pool = strings.TrimSuffix(dc.Name, ".xdpq.io")
		}
		want := `device.driver == "xdpq.io" && device.attributes["xdpq.io"].pool == "` + pool + `"`
		switch {
		case extended:
			// The extended resource's class: one netdev's queues per
			// node, those the daemon marks.
			want += ` && "extendedResource" in device.attributes["xdpq.io"] && device.attributes["xdpq.io"].extendedResource`
			if dc.Spec.ExtendedResourceName == nil || *dc.Spec.ExtendedResourceName != "example.com/"+pool {
				t.Errorf("DeviceClass %s: extendedResourceName %v", dc.Name, dc.Spec.ExtendedResourceName)
			}
		case dc.Spec.ExtendedResourceName != nil:
			t.Errorf("DeviceClass %s, of claims: extendedResourceName %s", dc.Name, *dc.Spec.ExtendedResourceName)
		}
		if len(dc.Spec.Selectors) != 1 || dc.Spec.Selectors[0].CEL == nil || dc.Spec.Selectors[0].CEL.Expression != want {
			t.Errorf("DeviceClass %s: selectors %+v, want %s", dc.Name, dc.Spec.Selectors, want)
		}
		if errs, ok := validate(t, o, nil); !ok || len(errs) > 0 {
			t.Errorf("DeviceClass %s is not valid: %v", dc.Name, errs)
		}
	}
	if strings.Join(classes, " ") != "upf.xdpq.io upf.extended.xdpq.io lb.xdpq.io lb.extended.xdpq.io" {
		t.Errorf("DeviceClasses %v, want upf's and lb's (dns is the device plugin's)", classes)
	}
	ds := daemonSet(t, objs)
	c := ds.Spec.Template.Spec.Containers[0]
	for _, arg := range []string{"--dra", "--served-by=dra", "--dra-plugin-dir=/var/lib/kubelet/plugins/xdpq.io", "--cdi-dir=/var/run/cdi",
		"--dra-uninstall-wait=600s"} {
		if !slices.Contains(c.Args, arg) {
			t.Errorf("args %v lack %s", c.Args, arg)
		}
	}
	// An uninstall waits for kubelet to unprepare the claims, then has
	// the datapath to remove: the pod is given the wait and 30 s.
	if g := ds.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g != 630 {
		t.Errorf("terminationGracePeriodSeconds %v with DRA, want 630", g)
	}
	for _, tc := range []struct {
		dra   map[string]any
		grace int64
	}{
		{map[string]any{"uninstallWaitSeconds": 0}, 30},
		{map[string]any{"enabled": false}, 30},
	} {
		ds := daemonSet(t, objects(t, render(t, Options{APIVersions: []string{draAPI}, Values: map[string]any{"config": draPools["config"], "dra": tc.dra}})))
		if g := ds.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g != tc.grace {
			t.Errorf("dra %v: terminationGracePeriodSeconds %v, want %d", tc.dra, g, tc.grace)
		}
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "POD_UID" && e.ValueFrom != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.uid"
	}) {
		t.Errorf("no POD_UID in %+v", c.Env)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	hosts := map[string]string{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			hosts[v.Name] = v.HostPath.Path
		}
	}
	for _, v := range []string{"dra-plugin", "cdi"} {
		if mounts[v] == "" || mounts[v] != hosts[v] {
			t.Errorf("volume %s: mounted at %q from host path %q; the same path is needed", v, mounts[v], hosts[v])
		}
	}
	cr := decode[rbacv1.ClusterRole](t, find(objs, "ClusterRole")[0])
	for _, want := range []rbacv1.PolicyRule{
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete", "deletecollection"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims"}, Verbs: []string{"get"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/status"}, Verbs: []string{"update"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/driver"}, Verbs: []string{"associated-node:update"}},
	} {
		if !slices.ContainsFunc(cr.Rules, func(r rbacv1.PolicyRule) bool {
			return slices.Equal(r.Resources, want.Resources) && slices.Equal(r.Verbs, want.Verbs)
		}) {
			t.Errorf("ClusterRole lacks %+v", want)
		}
	}

	for name, o := range map[string]Options{
		"no resource.k8s.io/v1": {Values: draPools},
		"dra.enabled false":     {APIVersions: []string{draAPI}, Values: map[string]any{"config": draPools["config"], "dra": map[string]any{"enabled": false}}},
	} {
		objs := objects(t, render(t, o))
		if n := len(find(objs, "DeviceClass")); n != 0 {
			t.Errorf("%s: %d DeviceClasses", name, n)
		}
		if args := daemonSet(t, objs).Spec.Template.Spec.Containers[0].Args; slices.Contains(args, "--dra") {
			t.Errorf("%s: args %v", name, args)
		}
	}
	// servedBy devicePlugin by default: only the pool that says dra.
	objs = objects(t, render(t, Options{APIVersions: []string{draAPI}, Values: map[string]any{"config": draPools["config"], "dra": map[string]any{"servedBy": "devicePlugin"}}}))
	if dcs := find(objs, "DeviceClass"); len(dcs) != 2 || dcs[0].Name != "lb.xdpq.io" || dcs[1].Name != "lb.extended.xdpq.io" {
		t.Errorf("with servedBy devicePlugin: DeviceClasses %v", dcs)
	}
}

// TestAdmissionPolicyRendered: the ValidatingAdmissionPolicy of the
// driver's config and its binding are rendered where DRA is on and the
// API server serves ValidatingAdmissionPolicies, unless turned off; the
// binding names the policy and denies. (test/e2e TestAdmissionPolicy
// has a real API server apply it.)
func TestAdmissionPolicyRendered(t *testing.T) {
	const vapAPI = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
	for _, c := range []struct {
		name   string
		apis   []string
		values map[string]any
		want   int
	}{
		{"served", []string{draAPI, vapAPI}, draPools, 1},
		{"no VAP API", []string{draAPI}, draPools, 0},
		{"no DRA", []string{vapAPI}, draPools, 0},
		{"turned off", []string{draAPI, vapAPI}, map[string]any{"config": draPools["config"], "dra": map[string]any{"admissionPolicy": false}}, 0},
	} {
		objs := objects(t, render(t, Options{APIVersions: c.apis, Values: c.values}))
		policies, bindings := find(objs, "ValidatingAdmissionPolicy"), find(objs, "ValidatingAdmissionPolicyBinding")
		if len(policies) != c.want || len(bindings) != c.want {
			t.Errorf("%s: %d policies, %d bindings; want %d", c.name, len(policies), len(bindings), c.want)
			continue
		}
		if c.want == 0 {
			continue
		}
		p := decode[admissionv1.ValidatingAdmissionPolicy](t, policies[0])
		b := decode[admissionv1.ValidatingAdmissionPolicyBinding](t, bindings[0])
		if b.Spec.PolicyName != p.Name || !slices.Equal(b.Spec.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) {
			t.Errorf("binding %+v of policy %s", b.Spec, p.Name)
		}
		if len(p.Spec.Validations) < 10 || p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionv1.Fail {
			t.Errorf("policy %+v", p.Spec)
		}
	}
}
