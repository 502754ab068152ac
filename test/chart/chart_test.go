package chart

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/xdpq/xdpq/pkg/cni"
	"github.com/xdpq/xdpq/pkg/config"
	"github.com/xdpq/xdpq/pkg/daemon"
)

const (
	serviceMonitorAPI = "monitoring.coreos.com/v1/ServiceMonitor"
	nadAPI            = "k8s.cni.cncf.io/v1/NetworkAttachmentDefinition"
)

// object is one rendered manifest: its kind, name, namespace and YAML.
type object struct {
	Kind, Name, Namespace, Source string
	YAML                          []byte
}

// objects splits a rendering into its objects, in order.
func objects(t *testing.T, r *Rendered) []object {
	t.Helper()
	var out []object
	for _, doc := range strings.Split(r.Manifest, "\n---") {
		doc = strings.TrimPrefix(doc, "---")
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("rendered YAML does not parse: %v\n%s", err, doc)
		}
		if meta.Kind == "" {
			continue // only comments
		}
		src := ""
		if _, rest, ok := strings.Cut(doc, "# Source: "); ok {
			src, _, _ = strings.Cut(rest, "\n")
		}
		out = append(out, object{meta.Kind, meta.Metadata.Name, meta.Metadata.Namespace, src, []byte(doc)})
	}
	return out
}

// find returns the objects of a kind.
func find(objs []object, kind string) []object {
	var out []object
	for _, o := range objs {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

// decode decodes an object strictly: a field the Kubernetes type does not
// have (a typo in a template) fails.
func decode[T any](t *testing.T, o object) *T {
	t.Helper()
	var v T
	if err := yaml.UnmarshalStrict(o.YAML, &v); err != nil {
		t.Fatalf("%s %s: %v", o.Kind, o.Name, err)
	}
	return &v
}

func render(t *testing.T, o Options) *Rendered {
	t.Helper()
	r, err := Render(Dir(), o)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return r
}

func daemonSet(t *testing.T, objs []object) *appsv1.DaemonSet {
	t.Helper()
	ds := find(objs, "DaemonSet")
	if len(ds) != 1 {
		t.Fatalf("%d DaemonSets rendered, want 1", len(ds))
	}
	return decode[appsv1.DaemonSet](t, ds[0])
}

func container(t *testing.T, cs []corev1.Container, name string) *corev1.Container {
	t.Helper()
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	t.Fatalf("no container %s", name)
	return nil
}

// values parses YAML into chart values.
func values(t *testing.T, s string) map[string]any {
	t.Helper()
	var v map[string]any
	if err := yaml.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// valueSets are the value sets every check runs with.
var valueSets = map[string]string{
	"default": ``,
	"example pools": `
config:
  resourcePrefix: example.com
  pools:
    - name: upf
      steering: hardware
      devices: {netdevs: ["ens1f0#8-15"]}
      allowTX: true
      limits: {maxUMEMBytes: 536870912, maxRing: 4096, maxQueuesPerPod: 4}
    - name: dns
      devices: {drivers: [mlx5_core]}
      queues: "4-7"
      linger: 30s
networkAttachmentDefinition: {enabled: true, pool: upf}
metrics: {serviceMonitor: {enabled: true, labels: {release: prometheus}}, dashboard: {enabled: true}}
`,
	"k3s": `
cni: {binDir: /var/lib/rancher/k3s/data/cni, removeOnUninstall: false}
kubelet: {rootDir: /var/lib/k3s/kubelet}
hostPaths: {netns: /run/netns}
securityContext: {capabilities: [NET_ADMIN, NET_RAW, BPF]}
metrics: {port: 19476, service: {enabled: false}}
fullnameOverride: xdpq-k3s
debug: true
extraArgs: ["--resync=1m"]
`,
}

// TestLint: Helm's linter (helm lint --strict's rules) finds nothing
// above INFO with each value set.
func TestLint(t *testing.T) {
	for name, vs := range valueSets {
		t.Run(name, func(t *testing.T) {
			kv, err := common.ParseKubeVersion(KubeVersion)
			if err != nil {
				t.Fatal(err)
			}
			res := lint.RunAll(Dir(), values(t, vs), "kube-system", lint.WithKubeVersion(kv))
			for _, m := range res.Messages {
				if m.Severity > support.InfoSev {
					t.Errorf("lint: %s", m)
				} else {
					t.Logf("lint: %s", m)
				}
			}
		})
	}
}

// TestRenderDefault checks the objects of the default values.
func TestRenderDefault(t *testing.T) {
	r := render(t, Options{})
	objs := objects(t, r)
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.Kind+"/"+o.Name)
		switch o.Kind {
		case "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition":
			if o.Namespace != "" {
				t.Errorf("%s %s: cluster-scoped with namespace %q", o.Kind, o.Name, o.Namespace)
			}
		default:
			if o.Namespace != "kube-system" {
				t.Errorf("%s %s: namespace %q, want the release's (kube-system), as plain YAML needs", o.Kind, o.Name, o.Namespace)
			}
		}
	}
	sort.Strings(kinds)
	want := []string{"ClusterRole/xdpq", "ClusterRole/xdpq-view", "ClusterRoleBinding/xdpq", "ConfigMap/xdpq", "DaemonSet/xdpq",
		"Role/xdpq", "Role/xdpq-top", "RoleBinding/xdpq", "Service/xdpq-metrics", "ServiceAccount/xdpq"}
	if diff := cmp.Diff(want, kinds); diff != "" {
		t.Errorf("objects (-want +got):\n%s", diff)
	}
	// kubectl xdpq top's Role: the daemons' pods and their proxy, bound
	// to no one (the RoleBinding is the daemon's).
	for _, o := range find(objs, "Role") {
		if o.Name != "xdpq-top" {
			continue
		}
		role := decode[rbacv1.Role](t, o)
		want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}},
			{APIGroups: []string{""}, Resources: []string{"pods/proxy"}, Verbs: []string{"get"}}}
		if diff := cmp.Diff(want, role.Rules); diff != "" {
			t.Errorf("Role xdpq-top's rules (-want +got):\n%s", diff)
		}
	}
	if !strings.Contains(r.Notes, "kubectl -n kube-system create rolebinding <user>-xdpq-top --role=xdpq-top --user=<user>") {
		t.Errorf("NOTES do not say how to let a user run kubectl xdpq top:\n%s", r.Notes)
	}

	ds := daemonSet(t, objs)
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork || !spec.HostPID {
		t.Errorf("hostNetwork %v hostPID %v, want both", spec.HostNetwork, spec.HostPID)
	}
	if spec.ServiceAccountName != "xdpq" {
		t.Errorf("service account %q", spec.ServiceAccountName)
	}
	d := container(t, spec.Containers, "xdpq")
	if want := "xdpq.io/xdpq:" + theRelease(t); d.Image != want {
		t.Errorf("image %q, want the chart's appVersion (%s)", d.Image, want)
	}
	for _, a := range []string{"--config=/etc/xdpq/config.yaml", "--metrics-addr=:9476", "--pin-dir=/sys/fs/bpf/xdpq", "--daemonset=xdpq"} {
		if !slices.Contains(d.Args, a) {
			t.Errorf("daemon args %q lack %s", d.Args, a)
		}
	}
	if p := d.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.String() != "metrics" {
		t.Errorf("liveness probe %+v, want GET /healthz on port metrics", p)
	}
	if p := d.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" || p.HTTPGet.Port.String() != "metrics" {
		t.Errorf("readiness probe %+v, want GET /readyz on port metrics", p)
	}
	if len(d.Ports) != 1 || d.Ports[0].Name != "metrics" || d.Ports[0].ContainerPort != 9476 {
		t.Errorf("ports %+v, want metrics 9476", d.Ports)
	}
	if len(d.Env) != 2 || d.Env[0].Name != "NODE_NAME" || d.Env[0].ValueFrom.FieldRef.FieldPath != "spec.nodeName" ||
		d.Env[1].Name != "POD_NAMESPACE" || d.Env[1].ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("env %+v, want NODE_NAME from spec.nodeName and POD_NAMESPACE from metadata.namespace", d.Env)
	}
	if ann := ds.Spec.Template.Annotations; len(ann) != 0 {
		t.Errorf("pod annotations %v: a checksum of the config would restart the daemons the config reloads in", ann)
	}

	// The CNI plugin: installed by an init container before the daemon,
	// removed by a native sidecar.
	if len(spec.InitContainers) != 2 {
		t.Fatalf("%d init containers, want install-cni and remove-cni-on-uninstall", len(spec.InitContainers))
	}
	inst, side := spec.InitContainers[0], spec.InitContainers[1]
	if inst.Name != "install-cni" || inst.RestartPolicy != nil {
		t.Errorf("first init container %s (restartPolicy %v), want install-cni run to completion", inst.Name, inst.RestartPolicy)
	}
	if want := []string{"/usr/local/bin/xdpq-install-cni", "install", "-src", "/opt/xdpq/cni/xdpq", "-dir", "/host/cni/bin"}; !slices.Equal(inst.Command, want) {
		t.Errorf("install-cni command %q, want %q", inst.Command, want)
	}
	if side.Name != "remove-cni-on-uninstall" || side.RestartPolicy == nil || *side.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("second init container %s (restartPolicy %v), want the sidecar remove-cni-on-uninstall, Always", side.Name, side.RestartPolicy)
	}
	if want := []string{"/usr/local/bin/xdpq-install-cni", "remove-on-uninstall", "-dir", "/host/cni/bin", "-daemonset", ds.Name}; !slices.Equal(side.Command, want) {
		t.Errorf("sidecar command %q, want %q", side.Command, want)
	}
	for _, c := range []corev1.Container{inst, side} {
		sc := c.SecurityContext
		if sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: security context %+v, want no capability, no escalation, read-only root", c.Name, sc)
		}
		if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].Name != "cni-bin" || c.VolumeMounts[0].MountPath != "/host/cni/bin" {
			t.Errorf("%s mounts %+v, want the CNI bin dir only", c.Name, c.VolumeMounts)
		}
	}
	if vol := volume(t, spec, "cni-bin"); vol.HostPath.Path != "/opt/cni/bin" {
		t.Errorf("cni-bin is %s, want /opt/cni/bin", vol.HostPath.Path)
	}

	// The ConfigMap: the daemon's config file, the directory mounted (a
	// subPath mount is never updated: no reload).
	cm := decode[corev1.ConfigMap](t, find(objs, "ConfigMap")[0])
	if _, err := config.Parse([]byte(cm.Data["config.yaml"])); err != nil {
		t.Errorf("the ConfigMap's config.yaml does not parse: %v\n%s", err, cm.Data["config.yaml"])
	}
	if vol := volume(t, spec, "config"); vol.ConfigMap == nil || vol.ConfigMap.Name != cm.Name {
		t.Errorf("config volume %+v, want ConfigMap %s", vol, cm.Name)
	}
	for _, m := range d.VolumeMounts {
		if m.Name == "config" && (m.MountPath != "/etc/xdpq" || m.SubPath != "") {
			t.Errorf("config mounted %+v, want the directory /etc/xdpq", m)
		}
	}

	svc := decode[corev1.Service](t, find(objs, "Service")[0])
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 9476 || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
		t.Errorf("metrics service ports %+v", svc.Spec.Ports)
	}
	for k, v := range svc.Spec.Selector {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("the metrics service selects %s=%s, which the daemon's pods lack", k, v)
		}
	}

	for _, w := range []string{"kubectl get xdpqnodes", "No pool is configured yet", "/opt/cni/bin/xdpq"} {
		if !strings.Contains(r.Notes, w) {
			t.Errorf("NOTES lack %q:\n%s", w, r.Notes)
		}
	}
}

func volume(t *testing.T, spec corev1.PodSpec, name string) corev1.Volume {
	t.Helper()
	for _, v := range spec.Volumes {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("no volume %s", name)
	return corev1.Volume{}
}

// TestSecurity: with every value set, the daemon is not privileged, has
// exactly the capabilities of the values, and mounts of the host only
// what it needs, each with the propagation it needs and never
// Bidirectional (which only a privileged container may have).
func TestSecurity(t *testing.T) {
	for name, vs := range valueSets {
		t.Run(name, func(t *testing.T) {
			v := values(t, vs)
			r := render(t, Options{Values: v, APIVersions: []string{serviceMonitorAPI, nadAPI}})
			spec := daemonSet(t, objects(t, r)).Spec.Template.Spec
			if strings.Contains(r.Manifest, "privileged: true") {
				t.Error("the manifest has privileged: true")
			}
			var caps []corev1.Capability
			for _, c := range capsOf(t, v) {
				caps = append(caps, corev1.Capability(c))
			}
			d := container(t, spec.Containers, "xdpq")
			sc := d.SecurityContext
			if sc == nil || sc.Privileged == nil || *sc.Privileged {
				t.Fatalf("security context %+v: want privileged: false", sc)
			}
			if !slices.Equal(sc.Capabilities.Add, caps) || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
				t.Errorf("capabilities add %q drop %q, want add %q drop ALL", sc.Capabilities.Add, sc.Capabilities.Drop, caps)
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Error("the root file system is writable")
			}
			// Kubernetes refuses allowPrivilegeEscalation false with CAP_SYS_ADMIN.
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Error("allowPrivilegeEscalation is not false")
			}
			for _, c := range append(spec.InitContainers, spec.Containers...) {
				if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || *c.SecurityContext.Privileged {
					t.Errorf("container %s: not explicitly unprivileged", c.Name)
				}
			}

			// The daemon's mounts of host paths and their propagation.
			hostPath := map[string]string{}
			for _, vol := range spec.Volumes {
				if vol.HostPath != nil {
					hostPath[vol.Name] = vol.HostPath.Path
				}
			}
			got := map[string]string{}
			for _, m := range d.VolumeMounts {
				p, ok := hostPath[m.Name]
				if !ok {
					continue
				}
				prop := "None"
				if m.MountPropagation != nil {
					prop = string(*m.MountPropagation)
				}
				got[p+" -> "+m.MountPath] = prop
			}
			kubelet := str(v, "kubelet", "rootDir", "/var/lib/kubelet")
			netns := str(v, "hostPaths", "netns", "/var/run/netns")
			want := map[string]string{
				kubelet + "/device-plugins -> /var/lib/kubelet/device-plugins":               "None",
				kubelet + "/plugins_registry -> /var/lib/kubelet/plugins_registry":           "None",
				kubelet + "/pod-resources -> /var/lib/kubelet/pod-resources":                 "None",
				"/sys/fs/bpf -> /sys/fs/bpf":                                                 "HostToContainer",
				"/run/xdpq -> /run/xdpq":                                                     "None",
				netns + " -> " + netns:                                                       "HostToContainer",
				"/var/run/k8s.cni.cncf.io/devinfo/dp -> /var/run/k8s.cni.cncf.io/devinfo/dp": "None",
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("the daemon's host mounts (-want +got):\n%s", diff)
			}
			// Every host path is mounted by someone: none is there for nothing.
			used := map[string]bool{}
			for _, c := range append(spec.InitContainers, spec.Containers...) {
				for _, m := range c.VolumeMounts {
					used[m.Name] = true
				}
			}
			for _, vol := range spec.Volumes {
				if !used[vol.Name] {
					t.Errorf("volume %s is mounted by no container", vol.Name)
				}
			}
		})
	}
}

// capsOf returns the capabilities values set, or values.yaml's.
func capsOf(t *testing.T, v map[string]any) []string {
	if sc, ok := v["securityContext"].(map[string]any); ok {
		if cs, ok := sc["capabilities"].([]any); ok {
			var out []string
			for _, c := range cs {
				out = append(out, c.(string))
			}
			return out
		}
	}
	var def struct {
		SecurityContext struct {
			Capabilities []string `json:"capabilities"`
		} `json:"securityContext"`
	}
	b, err := os.ReadFile(filepath.Join(Dir(), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &def); err != nil {
		t.Fatal(err)
	}
	if len(def.SecurityContext.Capabilities) == 0 {
		t.Fatal("values.yaml lists no capability")
	}
	return def.SecurityContext.Capabilities
}

// str returns v[a][b] or def.
func str(v map[string]any, a, b, def string) string {
	if m, ok := v[a].(map[string]any); ok {
		if s, ok := m[b].(string); ok {
			return s
		}
	}
	return def
}

// TestRBAC: the daemon may do what it does with the API server and
// nothing more; it and the sidecar may read their DaemonSet only.
func TestRBAC(t *testing.T) {
	objs := objects(t, render(t, Options{}))
	cr := decode[rbacv1.ClusterRole](t, find(objs, "ClusterRole")[0])
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
		{APIGroups: []string{"xdpq.io"}, Resources: []string{"xdpqnodes"}, Verbs: []string{"create", "get", "patch", "delete"}},
		{APIGroups: []string{"xdpq.io"}, Resources: []string{"xdpqnodes/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
	if diff := cmp.Diff(want, cr.Rules); diff != "" {
		t.Errorf("ClusterRole rules (-want +got):\n%s", diff)
	}
	// Readers of XdpqNodes: the cluster's view, edit and admin roles.
	view := decode[rbacv1.ClusterRole](t, find(objs, "ClusterRole")[1])
	wantView := []rbacv1.PolicyRule{{APIGroups: []string{"xdpq.io"}, Resources: []string{"xdpqnodes"}, Verbs: []string{"get", "list", "watch"}}}
	if diff := cmp.Diff(wantView, view.Rules); diff != "" || view.Name != "xdpq-view" {
		t.Errorf("ClusterRole %s rules (-want +got):\n%s", view.Name, diff)
	}
	for _, agg := range []string{"view", "edit", "admin"} {
		if view.Labels["rbac.authorization.k8s.io/aggregate-to-"+agg] != "true" {
			t.Errorf("xdpq-view is not aggregated to %s: labels %v", agg, view.Labels)
		}
	}
	role := decode[rbacv1.Role](t, find(objs, "Role")[0])
	wantRole := []rbacv1.PolicyRule{{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, ResourceNames: []string{"xdpq"}, Verbs: []string{"get", "list", "watch"}}}
	if diff := cmp.Diff(wantRole, role.Rules); diff != "" {
		t.Errorf("Role rules (-want +got):\n%s", diff)
	}
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		b := decode[rbacv1.RoleBinding](t, find(objs, kind)[0]) // the same fields
		if len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Name != "xdpq" || b.Subjects[0].Namespace != "kube-system" {
			t.Errorf("%s subjects %+v, want the service account xdpq in kube-system", kind, b.Subjects)
		}
	}
}

// TestCustomPools: the example config of docs/ as values becomes the
// daemon's config unchanged.
func TestCustomPools(t *testing.T) {
	example, err := os.ReadFile("../../docs/config-example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(example, &cfg); err != nil {
		t.Fatal(err)
	}
	r := render(t, Options{Values: map[string]any{"config": cfg}})
	cm := decode[corev1.ConfigMap](t, find(objects(t, r), "ConfigMap")[0])
	got, err := config.Parse([]byte(cm.Data["config.yaml"]))
	if err != nil {
		t.Fatalf("the ConfigMap's config.yaml does not parse: %v", err)
	}
	want, err := config.Parse(example)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the ConfigMap's config differs from docs/config-example.yaml:\n%s", cmp.Diff(want, got))
	}
	for _, w := range []string{"xdpq.io/upf", "xdpq.io/dns", "xdpq.io/dpdk", "xdpq.io/upf: 2"} {
		if !strings.Contains(r.Notes, w) {
			t.Errorf("NOTES lack %q:\n%s", w, r.Notes)
		}
	}
}

// TestServiceMonitor: made only when asked and the API is served.
func TestServiceMonitor(t *testing.T) {
	on := map[string]any{"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true}}}
	for _, tc := range []struct {
		name  string
		vals  map[string]any
		apis  []string
		want  bool
		notes string
	}{
		{"enabled, API served", on, []string{serviceMonitorAPI}, true, "A ServiceMonitor makes Prometheus scrape them"},
		{"enabled, API not served", on, nil, false, "does not serve\n   monitoring.coreos.com/v1 ServiceMonitor: none was made"},
		{"disabled, API served", nil, []string{serviceMonitorAPI}, false, ""},
		{"disabled, API not served", nil, nil, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, Options{Values: tc.vals, APIVersions: tc.apis})
			objs := objects(t, r)
			sms := find(objs, "ServiceMonitor")
			if got := len(sms) == 1; got != tc.want {
				t.Fatalf("%d ServiceMonitors, want %v", len(sms), tc.want)
			}
			if !strings.Contains(r.Notes, tc.notes) {
				t.Errorf("NOTES lack %q:\n%s", tc.notes, r.Notes)
			}
			if !tc.want {
				return
			}
			var sm struct {
				Spec struct {
					Selector struct {
						MatchLabels map[string]string `json:"matchLabels"`
					} `json:"selector"`
					Endpoints []struct {
						Port string `json:"port"`
						Path string `json:"path"`
					} `json:"endpoints"`
				} `json:"spec"`
			}
			if err := yaml.Unmarshal(sms[0].YAML, &sm); err != nil {
				t.Fatal(err)
			}
			svc := decode[corev1.Service](t, find(objs, "Service")[0])
			for k, v := range sm.Spec.Selector.MatchLabels {
				if svc.Labels[k] != v {
					t.Errorf("the ServiceMonitor selects %s=%s, which the metrics Service lacks", k, v)
				}
			}
			if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" || sm.Spec.Endpoints[0].Path != "/metrics" {
				t.Errorf("endpoints %+v, want port metrics /metrics", sm.Spec.Endpoints)
			}
		})
	}
}

// TestCustomCNIDir: the CNI bin directory and kubelet's root are the
// values'; without removeOnUninstall there is no sidecar (the daemon's
// Role stays: it follows its DaemonSet too).
func TestCustomCNIDir(t *testing.T) {
	r := render(t, Options{Values: values(t, valueSets["k3s"])})
	objs := objects(t, r)
	ds := daemonSet(t, objs)
	spec := ds.Spec.Template.Spec
	if p := volume(t, spec, "cni-bin").HostPath.Path; p != "/var/lib/rancher/k3s/data/cni" {
		t.Errorf("cni-bin is %s", p)
	}
	if p := volume(t, spec, "device-plugins").HostPath.Path; p != "/var/lib/k3s/kubelet/device-plugins" {
		t.Errorf("device-plugins is %s", p)
	}
	if len(spec.InitContainers) != 1 || spec.InitContainers[0].Name != "install-cni" {
		t.Errorf("init containers %d, want install-cni only", len(spec.InitContainers))
	}
	if len(find(objs, "Role")) != 2 || len(find(objs, "RoleBinding")) != 1 || len(find(objs, "Service")) != 0 {
		t.Error("want the daemon's Role and RoleBinding, top's Role, and no Service without the metrics service")
	}
	if ds.Name != "xdpq-k3s" {
		t.Errorf("DaemonSet %s, want the fullnameOverride", ds.Name)
	}
	d := container(t, spec.Containers, "xdpq")
	for _, a := range []string{"--metrics-addr=:19476", "--debug", "--resync=1m"} {
		if !slices.Contains(d.Args, a) {
			t.Errorf("args %q lack %s", d.Args, a)
		}
	}
	if !strings.Contains(r.Notes, "/var/lib/rancher/k3s/data/cni/xdpq") || !strings.Contains(r.Notes, "helm uninstall leaves it") {
		t.Errorf("NOTES do not say where the plugin is and that it stays:\n%s", r.Notes)
	}
}

// TestNetworkAttachmentDefinition: the example network's CNI config is
// one the xdpq plugin accepts, of the pool's resource.
func TestNetworkAttachmentDefinition(t *testing.T) {
	v := values(t, valueSets["example pools"])
	r := render(t, Options{Values: v, APIVersions: []string{nadAPI}})
	nads := find(objects(t, r), "NetworkAttachmentDefinition")
	if len(nads) != 1 {
		t.Fatalf("%d NetworkAttachmentDefinitions, want 1", len(nads))
	}
	var nad struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name        string            `json:"name"`
			Namespace   string            `json:"namespace"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Spec struct {
			Config string `json:"config"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(nads[0].YAML, &nad); err != nil {
		t.Fatal(err)
	}
	conf, flows, err := cni.ParseNetConf([]byte(nad.Spec.Config))
	if err != nil {
		t.Fatalf("the plugin refuses the example's config: %v\n%s", err, nad.Spec.Config)
	}
	if conf.Type != "xdpq" || conf.ResourceName != "example.com/upf" || conf.Name != nad.Metadata.Name || len(flows) != 1 {
		t.Errorf("config %+v (%d flows), want type xdpq, resource example.com/upf, name %s, 1 flow", conf, len(flows), nad.Metadata.Name)
	}
	if nad.Metadata.Annotations["k8s.v1.cni.cncf.io/resourceName"] != "example.com/upf" {
		t.Errorf("annotations %v, want Multus's resourceName", nad.Metadata.Annotations)
	}
	if !strings.Contains(r.Notes, "k8s.v1.cni.cncf.io/networks: kube-system/"+nad.Metadata.Name) {
		t.Errorf("NOTES do not say how to use the network:\n%s", r.Notes)
	}
	// Not asked for: none.
	delete(v, "networkAttachmentDefinition")
	if n := find(objects(t, render(t, Options{Values: v, APIVersions: []string{nadAPI}})), "NetworkAttachmentDefinition"); len(n) != 0 {
		t.Error("a NetworkAttachmentDefinition rendered without being asked for")
	}
}

// TestBadValues: values the chart cannot work with are refused by helm,
// with a message that names what is wrong.
func TestBadValues(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		apis         []string
		want         []string
	}{
		{"pool without devices", "config: {pools: [{name: upf}]}", nil,
			[]string{"/config/pools/0", "missing property 'devices'"}},
		{"misspelt pool field", "config: {pools: [{name: upf, devices: {netdevs: [eth1]}, queue: 0-3}]}", nil,
			[]string{"/config/pools/0", "additional properties 'queue' not allowed"}},
		{"bad steering", "config: {pools: [{name: upf, devices: {netdevs: [eth1]}, steering: fast}]}", nil,
			[]string{"/config/pools/0/steering", "'auto', 'hardware', 'software'"}},
		{"bad linger", "config: {pools: [{name: upf, devices: {netdevs: [eth1]}, linger: soon}]}", nil,
			[]string{"/config/pools/0/linger", "does not match pattern"}},
		{"no pools", "config: {pools: null}", nil, []string{"at '/config': missing property 'pools'"}},
		{"pools not a list", "config: {pools: {name: upf}}", nil, []string{"at '/config/pools': got object, want array"}},
		{"unknown value", "replicas: 3", nil, []string{"additional properties 'replicas' not allowed"}},
		{"relative CNI dir", "cni: {binDir: opt/cni/bin}", nil, []string{"/cni/binDir", "does not match pattern"}},
		{"port 0", "metrics: {port: 0}", nil, []string{"/metrics/port", "minimum"}},
		{"capability ALL", "securityContext: {capabilities: [ALL]}", nil, []string{"/securityContext/capabilities/0", "'not' failed"}},
		{"capability with CAP_", "securityContext: {capabilities: [CAP_SYS_ADMIN]}", nil, []string{"/securityContext/capabilities/0", "'not' failed"}},
		{"capability twice", "securityContext: {capabilities: [BPF, BPF]}", nil, []string{"/securityContext/capabilities", "items at 0 and 1 are equal"}},
		{"privileged", "securityContext: {privileged: true, capabilities: [BPF]}", nil, []string{"additional properties 'privileged' not allowed"}},
		{"NAD of an unknown pool", "config: {pools: [{name: upf, devices: {netdevs: [eth1#0-3]}}]}\nnetworkAttachmentDefinition: {enabled: true, pool: dns}",
			[]string{nadAPI}, []string{`networkAttachmentDefinition.pool "dns" is not one of config.pools (upf)`}},
		{"NAD without Multus", "config: {pools: [{name: upf, devices: {netdevs: [eth1#0-3]}}]}\nnetworkAttachmentDefinition: {enabled: true, pool: upf}",
			nil, []string{"does not serve k8s.cni.cncf.io/v1 NetworkAttachmentDefinition; install Multus first"}},
		{"ServiceMonitor without Service", "metrics: {service: {enabled: false}, serviceMonitor: {enabled: true}}",
			[]string{serviceMonitorAPI}, []string{"metrics.serviceMonitor.enabled needs metrics.service.enabled"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render(Dir(), Options{Values: values(t, tc.values), APIVersions: tc.apis})
			if err == nil {
				t.Fatal("rendered")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestManifestsUpToDate: manifests/xdpq.yaml is the chart rendered now.
func TestManifestsUpToDate(t *testing.T) {
	want, err := Manifests(Dir())
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../manifests/xdpq.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("manifests/xdpq.yaml is stale: run make manifests\n%s", cmp.Diff(string(want), string(got)))
	}
	crds, _ := filepath.Glob(filepath.Join(Dir(), "crds", "*.yaml"))
	for _, c := range crds {
		if !bytes.Contains(got, []byte("# Source: xdpq/crds/"+filepath.Base(c))) {
			t.Errorf("manifests/xdpq.yaml lacks the CRD %s", filepath.Base(c))
		}
	}
}

// TestKubeVersion: a cluster older than native sidecars is refused.
func TestKubeVersion(t *testing.T) {
	_, err := Render(Dir(), Options{KubeVersion: "v1.28.9"})
	if err == nil || !strings.Contains(err.Error(), "chart requires kubeVersion: >=1.29.0-0 which is incompatible with Kubernetes v1.28.9") {
		t.Errorf("rendering for 1.28: %v", err)
	}
	render(t, Options{KubeVersion: "v1.29.0"})
}

// TestCapabilitiesMeasured: values.yaml adds exactly the capabilities
// pkg/daemon's TestCapabilities measures the daemon needs
// (daemon.Capabilities), no more.
func TestCapabilitiesMeasured(t *testing.T) {
	var want []string
	for c := range daemon.Capabilities {
		want = append(want, strings.ToUpper(c))
	}
	got := capsOf(t, nil)
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("values.yaml adds %v; the daemon needs %v (pkg/daemon.Capabilities, measured)", got, want)
	}
}

// TestChartVersionIsTheRelease: the chart's version and appVersion (the
// image tag it installs by default) are the release in the file VERSION,
// which make image tags the image with: set them together with
// `make version V=x.y.z`.
func TestChartVersionIsTheRelease(t *testing.T) {
	release := theRelease(t)
	meta, err := os.ReadFile(filepath.Join(Dir(), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(meta, &chart); err != nil {
		t.Fatal(err)
	}
	if chart.Version != release || chart.AppVersion != release {
		t.Errorf("Chart.yaml has version %q and appVersion %q; the release (VERSION) is %q: make version V=%s sets them", chart.Version, chart.AppVersion, release, release)
	}
}

// theRelease is the file VERSION's release.
func theRelease(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Dir(), "..", "..", "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
