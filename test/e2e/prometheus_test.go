package e2e_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/xdpq/xdpq/internal/testing/promtest"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/internal/testing/testproc"
	"github.com/xdpq/xdpq/test/e2e/cluster"
	"github.com/xdpq/xdpq/test/e2e/kubebin"
)

// serviceMonitor is the part of a monitoring.coreos.com/v1
// ServiceMonitor the chart renders that the Prometheus operator turns
// into a scrape config.
type serviceMonitor struct {
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string           `json:"port"`
			Path          string           `json:"path"`
			Interval      string           `json:"interval"`
			ScrapeTimeout string           `json:"scrapeTimeout"`
			HonorLabels   bool             `json:"honorLabels"`
			Relabelings   []map[string]any `json:"relabelings"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// labelName is a Kubernetes label's name as Prometheus' service
// discovery names it in its meta labels.
var labelName = regexp.MustCompile(`[^a-zA-Z0-9_]`)

// kubernetesSD is the kubernetes_sd_configs entry the Prometheus
// operator generates for sm's endpoints (pkg/prometheus/promcfg.go, with
// EndpointSlice discovery): the EndpointSlices of sm's namespaces,
// through the API server at api, with a CA file and a bearer token file.
func kubernetesSD(sm serviceMonitor, api, caFile, tokenFile string) ([]byte, error) {
	return yaml.Marshal(map[string]any{
		"role":          "endpointslice",
		"api_server":    api,
		"tls_config":    map[string]any{"ca_file": caFile},
		"authorization": map[string]any{"credentials_file": tokenFile},
		"namespaces":    map[string]any{"names": sm.Spec.NamespaceSelector.MatchNames},
	})
}

// scrapeConfigs is the scrape config the Prometheus operator generates
// for sm (pkg/prometheus/promcfg.go, generateServiceMonitorConfig): the
// targets of kubernetesSD's discovery, which kubesd writes to the file_sd
// file targets; keep the Services with sm's labels and the endpoints of
// its port; the target labels the operator sets (namespace, service,
// pod, container, node or pod of the address' target, job as the
// Service's name, endpoint as the port's); then sm's own relabelings.
func scrapeConfigs(sm serviceMonitor, targets string) (string, error) {
	var jobs []map[string]any
	for i, ep := range sm.Spec.Endpoints {
		var relabel []map[string]any
		keys := make([]string, 0, len(sm.Spec.Selector.MatchLabels))
		for k := range sm.Spec.Selector.MatchLabels {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			l := labelName.ReplaceAllString(k, "_")
			relabel = append(relabel, map[string]any{"action": "keep",
				"source_labels": []string{"__meta_kubernetes_service_label_" + l, "__meta_kubernetes_service_labelpresent_" + l},
				"regex":         "(" + regexp.QuoteMeta(sm.Spec.Selector.MatchLabels[k]) + ");true"})
		}
		relabel = append(relabel,
			map[string]any{"action": "keep", "source_labels": []string{"__meta_kubernetes_endpointslice_port_name"}, "regex": ep.Port},
			map[string]any{"source_labels": []string{"__meta_kubernetes_endpointslice_address_target_kind", "__meta_kubernetes_endpointslice_address_target_name"},
				"separator": ";", "regex": "Node;(.*)", "replacement": "${1}", "target_label": "node"},
			map[string]any{"source_labels": []string{"__meta_kubernetes_endpointslice_address_target_kind", "__meta_kubernetes_endpointslice_address_target_name"},
				"separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
			map[string]any{"source_labels": []string{"__meta_kubernetes_namespace"}, "target_label": "namespace"},
			map[string]any{"source_labels": []string{"__meta_kubernetes_service_name"}, "target_label": "service"},
			map[string]any{"source_labels": []string{"__meta_kubernetes_pod_name"}, "target_label": "pod"},
			map[string]any{"source_labels": []string{"__meta_kubernetes_pod_container_name"}, "target_label": "container"},
			map[string]any{"source_labels": []string{"__meta_kubernetes_service_name"}, "target_label": "job", "replacement": "${1}"},
			map[string]any{"target_label": "endpoint", "replacement": ep.Port},
		)
		// The ServiceMonitor's relabelings, their camelCase fields in
		// Prometheus' snake_case.
		rename := map[string]string{"sourceLabels": "source_labels", "targetLabel": "target_label"}
		for _, r := range ep.Relabelings {
			out := map[string]any{}
			for k, v := range r {
				if n, ok := rename[k]; ok {
					k = n
				}
				out[k] = v
			}
			relabel = append(relabel, out)
		}
		jobs = append(jobs, map[string]any{
			"job_name":        fmt.Sprintf("serviceMonitor/%s/%s/%d", sm.Metadata.Namespace, sm.Metadata.Name, i),
			"honor_labels":    ep.HonorLabels,
			"scrape_interval": ep.Interval,
			"scrape_timeout":  ep.ScrapeTimeout,
			"metrics_path":    ep.Path,
			"file_sd_configs": []map[string]any{{"files": []string{targets}}},
			"relabel_configs": relabel,
		})
	}
	b, err := yaml.Marshal(jobs)
	if err != nil {
		return "", err
	}
	return "  " + strings.ReplaceAll(strings.TrimSuffix(string(b), "\n"), "\n", "\n  ") + "\n", nil
}

// checkPrometheusThroughService has a real Prometheus find and scrape
// the node's daemon as the Prometheus operator would from the chart's
// ServiceMonitor (rendered with a 1s interval): through the chart's
// metrics Service's EndpointSlice, discovered with a ServiceAccount
// token whose ClusterRole allows only what discovery reads. Debian's
// Prometheus server is built without Kubernetes discovery: Prometheus's
// own (kubesd, kubebin's) discovers and hands the targets, with their
// meta labels, to the server's file discovery; the server relabels,
// scrapes and answers the queries. While frames
// flow to pod's queues, the target carries the labels the dashboard and
// the alerts expect (job, node); events makes what the panels of
// latencies show happen while Prometheus scrapes. Every panel of the chart's
// dashboard, its node variable put in, returns series with data (but
// three, of events this scenario does not cause); the per-pod panels
// name pod in its namespace, not the daemon's pod the target's labels
// would put there.
func checkPrometheusThroughService(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, node, ns string, pod *perfRun, events func(t *testing.T)) {
	t.Helper()
	promBin := testnet.RequireTool(t, "prometheus", "prometheus")
	bins, err := kubebin.Ensure(ctx, kubebin.Options{}, kubebin.KubeSD)
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	out, err = cp.Helm(ctx, "template", "xdpq", repoRoot+"/charts/xdpq", "-n", "kube-system",
		"--api-versions", "monitoring.coreos.com/v1/ServiceMonitor",
		"--set", "metrics.serviceMonitor.enabled=true",
		"--set", "metrics.serviceMonitor.interval=1s", "--set", "metrics.serviceMonitor.scrapeTimeout=1s",
		"--show-only", "templates/servicemonitor.yaml")
	if err != nil {
		t.Fatalf("helm template the ServiceMonitor: %v\n%s", err, out)
	}
	var sm serviceMonitor
	if err := yaml.Unmarshal(out, &sm); err != nil {
		t.Fatalf("the chart's ServiceMonitor: %v\n%s", err, out)
	}

	// Prometheus' identity: what its Kubernetes discovery reads, no more.
	const promNS, promSA = "monitoring", "prometheus"
	if err := cp.CreateNamespace(ctx, promNS, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().ServiceAccounts(promNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: promSA}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	read := []string{"get", "list", "watch"}
	if _, err := cp.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e-prometheus"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services", "pods"}, Verbs: read},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: read},
		}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-prometheus"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "e2e-prometheus"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: promNS, Name: promSA}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hour := int64(3600)
	tok, err := cp.Client.CoreV1().ServiceAccounts(promNS).CreateToken(ctx, promSA,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hour}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(tok.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	sd, err := kubernetesSD(sm, cp.URL, cp.CAFile, tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	sdFile, targetsFile := filepath.Join(dir, "kubernetes-sd.yaml"), filepath.Join(dir, "targets.json")
	if err := os.WriteFile(sdFile, sd, 0o600); err != nil {
		t.Fatal(err)
	}
	startKubeSD(t, bins[kubebin.KubeSD], sdFile, targetsFile)
	cfg, err := scrapeConfigs(sm, targetsFile)
	if err != nil {
		t.Fatal(err)
	}
	prom := promtest.Start(t, promBin, promtest.Config{ScrapeConfigs: cfg})
	start := time.Now()
	// The job the alerts name, the node the dashboard's variable lists.
	prom.WaitFor(t, fmt.Sprintf(`up{job="xdpq-metrics", node=%q, service="xdpq-metrics", endpoint="metrics"} == 1`, node))
	var targets struct {
		ActiveTargets []struct {
			DiscoveredLabels map[string]string `json:"discoveredLabels"`
			Labels           map[string]string `json:"labels"`
			Health           string            `json:"health"`
		} `json:"activeTargets"`
	}
	prom.Get(t, "/api/v1/targets", nil, &targets)
	if len(targets.ActiveTargets) != 1 || targets.ActiveTargets[0].DiscoveredLabels["__meta_kubernetes_endpointslice_name"] == "" {
		t.Fatalf("Prometheus' targets %+v, want the daemon's, found through the metrics Service's EndpointSlice", targets.ActiveTargets)
	}
	t.Logf("the daemon, found through EndpointSlice %s: %v", targets.ActiveTargets[0].DiscoveredLabels["__meta_kubernetes_endpointslice_name"], targets.ActiveTargets[0].Labels)
	events(t)

	panels := promtest.ReadPanels(t, filepath.Join(repoRoot, "charts/xdpq/files/xdpq-dashboard.json"))
	// $__rate_interval for a 1s scrape and a 1s step, as Grafana
	// computes it: max(4 * scrape interval, step + scrape interval).
	fill := strings.NewReplacer("$__rate_interval", "4s", "$node", node)
	byTitle := map[string]promtest.Panel{}
	for _, p := range panels {
		byTitle[p.Title] = p
	}
	// The pod's rows: what it receives, per pod and per queue. Prometheus
	// scrapes each second and tells no one: polled.
	want := []struct {
		panel string
		what  string
		match func(map[string]string) bool
	}{
		{"Frames redirected per pod", ns + "/" + pod.name + " receiving",
			func(l map[string]string) bool { return l["namespace"] == ns && l["pod"] == pod.name }},
		{"Frames redirected to pods per queue", fmt.Sprintf("%s's queues %v receiving", pod.name, pod.queues), nil},
	}
	for _, w := range want {
		p, ok := byTitle[w.panel]
		if !ok {
			t.Fatalf("no panel %q", w.panel)
		}
		var seen []promtest.Series
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(250 * time.Millisecond) {
			seen = prom.QueryRange(t, fill.Replace(p.Targets[0].Expr), start, time.Now())
			queues := map[string]bool{}
			for _, s := range seen {
				if (w.match == nil || w.match(s.Labels)) && slices.ContainsFunc(promtest.Finite(s.Values), func(v float64) bool { return v > 0 }) {
					queues[s.Labels["queue"]] = true
				}
			}
			if w.match != nil && len(queues) > 0 || w.match == nil && len(queues) >= len(pod.queues) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("panel %q does not show %s: %v", w.panel, w.what, seen)
			}
		}
	}

	// Every target of every panel, over at least 5 scrapes, but those
	// of the events this scenario does not cause (TestDashboardOnPrometheus
	// causes them, on a daemon of its own).
	prom.WaitFor(t, `count_over_time(up{job="xdpq-metrics"}[1m]) >= 5`)
	prom.CheckPanels(t, panels, fill, start, time.Now(), map[string]string{
		"Re-attach latency":        "no operator's program takes the netdev's hook here",
		"CNI latency":              "the pod's flows come from its annotation: no CNI call reaches the daemon",
		"CNI operations by result": "the pod's flows come from its annotation: no CNI call reaches the daemon",
	})
}

// startKubeSD runs kubesd, Prometheus's Kubernetes discovery, on the
// kubernetes_sd_configs entry in config, writing the targets it finds to
// the file_sd file targets, until the test ends, when it must exit
// cleanly; its output and targets go to the test's log when the test
// fails.
func startKubeSD(t *testing.T, bin, config, targets string) {
	t.Helper()
	p, err := testproc.Start(exec.Command(bin, "-config", config, "-output", targets))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := p.Stop(10 * time.Second)
		if err != nil || t.Failed() {
			b, rerr := os.ReadFile(targets)
			t.Logf("kubesd (%v):\n%s\nits targets (%v):\n%s", err, p.Out, rerr, b)
		}
		if err != nil {
			t.Errorf("kubesd exited: %v", err)
		}
	})
}
