package chart

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/xdpq/xdpq/internal/testing/testnet"
)

const prometheusRuleAPI = "monitoring.coreos.com/v1/PrometheusRule"

// The alerts' one source: the plain rules file, which the chart's
// PrometheusRule template reads, and its promtool unit tests.
var (
	rulesFile      = filepath.Join(Dir(), "files", "xdpq.rules.yaml")
	rulesTestsFile = filepath.Join("testdata", "xdpq.rules.test.yaml")
)

// rules is a Prometheus rules file.
type rules struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Record      string            `json:"record"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

// rulesTests is a promtool unit test file, as far as this package's
// tests use it.
type rulesTests struct {
	RuleFiles          []string `json:"rule_files"`
	EvaluationInterval string   `json:"evaluation_interval"`
	Tests              []struct {
		Name           string `json:"name"`
		Interval       string `json:"interval"`
		InputSeries    []any  `json:"input_series"`
		AlertRuleTests []struct {
			EvalTime  string `json:"eval_time"`
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// readYAML decodes a YAML file strictly into v.
func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// promtool returns promtool's path: CI installs it (Debian's prometheus
// package) and fails without it; elsewhere its absence skips the test.
func promtool(t *testing.T) string {
	t.Helper()
	return testnet.RequireTool(t, "prometheus", "promtool")
}

// runPromtool runs promtool with args and fails the test with its output
// if it fails.
func runPromtool(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(promtool(t), args...).CombinedOutput()
	if err != nil {
		t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestAlertRules: promtool finds the rules file sound and its unit tests
// pass.
func TestAlertRules(t *testing.T) {
	runPromtool(t, "check", "rules", rulesFile)
	runPromtool(t, "test", "rules", rulesTestsFile)
}

// TestAlertsComplete: every alert says how bad it is, what it means and
// what to do, waits a `for:` before it fires, and has unit tests that
// see it silent one evaluation before it fires, and firing.
func TestAlertsComplete(t *testing.T) {
	var rf rules
	readYAML(t, rulesFile, &rf)
	var tf rulesTests
	readYAML(t, rulesTestsFile, &tf)
	if want := "../../../charts/xdpq/files/xdpq.rules.yaml"; len(tf.RuleFiles) != 1 || tf.RuleFiles[0] != want {
		t.Errorf("the unit tests load %q, want [%s]", tf.RuleFiles, want)
	}
	interval, err := time.ParseDuration(tf.EvaluationInterval)
	if err != nil {
		t.Fatalf("evaluation_interval: %v", err)
	}
	// Per alert, the evaluation times the tests expect it silent and
	// firing at.
	silent, firing := map[string][]time.Duration{}, map[string][]time.Duration{}
	for _, tc := range tf.Tests {
		for _, at := range tc.AlertRuleTests {
			d, err := time.ParseDuration(at.EvalTime)
			if err != nil {
				t.Fatalf("test %q: eval_time: %v", tc.Name, err)
			}
			if len(at.ExpAlerts) == 0 {
				silent[at.Alertname] = append(silent[at.Alertname], d)
			} else {
				firing[at.Alertname] = append(firing[at.Alertname], d)
			}
		}
	}
	alerts := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts[r.Alert] = true
			if sev := r.Labels["severity"]; sev != "warning" && sev != "critical" {
				t.Errorf("%s: severity %q, want warning or critical", r.Alert, sev)
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("%s: no summary", r.Alert)
			}
			if d := r.Annotations["description"]; !strings.Contains(d, "`kubectl ") {
				t.Errorf("%s: the description names no kubectl command to look closer with:\n%s", r.Alert, d)
			}
			wait, err := time.ParseDuration(r.For)
			if err != nil || wait <= 0 {
				t.Errorf("%s: for %q, want a duration above 0", r.Alert, r.For)
			}
			tight := false
			for _, f := range firing[r.Alert] {
				if f < wait {
					t.Errorf("%s: the tests expect it firing at %v, before its for: %v", r.Alert, f, wait)
				}
				for _, s := range silent[r.Alert] {
					if f-s == interval {
						tight = true
					}
				}
			}
			if !tight {
				t.Errorf("%s: no unit test expects it silent one evaluation (%v) before it fires (silent at %v, firing at %v)",
					r.Alert, interval, silent[r.Alert], firing[r.Alert])
			}
		}
	}
	if len(alerts) == 0 {
		t.Fatal("no alerts")
	}
	for name := range firing {
		if !alerts[name] {
			t.Errorf("the unit tests test %s, which is no alert", name)
		}
	}
}

// prometheusRuleSpec returns the spec of the rendered PrometheusRule o.
func prometheusRuleSpec(t *testing.T, o object) map[string]any {
	t.Helper()
	var pr struct {
		Spec map[string]any `json:"spec"`
	}
	if err := yaml.Unmarshal(o.YAML, &pr); err != nil {
		t.Fatal(err)
	}
	return pr.Spec
}

// TestPrometheusRule: made only when asked and the API is served, and
// then with the rules file's groups.
func TestPrometheusRule(t *testing.T) {
	on := values(t, "metrics: {prometheusRule: {enabled: true, labels: {release: prometheus}}}")
	for _, tc := range []struct {
		name string
		vals map[string]any
		apis []string
		want bool
	}{
		{"enabled, API served", on, []string{prometheusRuleAPI}, true},
		{"enabled, API not served", on, nil, false},
		{"enabled, only ServiceMonitor served", on, []string{serviceMonitorAPI}, false},
		{"disabled, API served", nil, []string{prometheusRuleAPI}, false},
		{"disabled, API not served", nil, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prs := find(objects(t, render(t, Options{Values: tc.vals, APIVersions: tc.apis})), "PrometheusRule")
			if got := len(prs) == 1; got != tc.want {
				t.Fatalf("%d PrometheusRules, want %v", len(prs), tc.want)
			}
			if !tc.want {
				return
			}
			var meta struct {
				Metadata struct {
					Labels map[string]string `json:"labels"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal(prs[0].YAML, &meta); err != nil {
				t.Fatal(err)
			}
			if prs[0].Namespace != "kube-system" || meta.Metadata.Labels["release"] != "prometheus" {
				t.Errorf("namespace %q, labels %v; want kube-system and release: prometheus", prs[0].Namespace, meta.Metadata.Labels)
			}
			// Release xdpq in kube-system: the file's own names.
			var want map[string]any
			readYAML(t, rulesFile, &want)
			if d := cmp.Diff(want, prometheusRuleSpec(t, prs[0])); d != "" {
				t.Errorf("the PrometheusRule's spec is not %s (-file +spec):\n%s", rulesFile, d)
			}
		})
	}
}

// TestPrometheusRuleNames: in another release, namespace and resource
// prefix the rules name that release's metrics Service (the
// ServiceMonitor's job), DaemonSet and namespace (in queries and in the
// commands the descriptions give), and the prefix as
// kube-state-metrics spells it; nothing else changes, and promtool
// finds them sound.
func TestPrometheusRuleNames(t *testing.T) {
	r := render(t, Options{
		ReleaseName: "edge", Namespace: "net",
		Values:      values(t, "config: {resourcePrefix: example.com}\nmetrics: {prometheusRule: {enabled: true}, serviceMonitor: {enabled: true}}"),
		APIVersions: []string{prometheusRuleAPI, serviceMonitorAPI},
	})
	objs := objects(t, r)
	prs := find(objs, "PrometheusRule")
	if len(prs) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(prs))
	}
	ds := daemonSet(t, objs)
	svcs := find(objs, "Service")
	if len(svcs) != 1 {
		t.Fatalf("%d Services, want 1 (metrics)", len(svcs))
	}
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for old, new := range map[string]string{
		`job="xdpq-metrics"`:      `job="` + svcs[0].Name + `"`,
		`created_by_name="xdpq"`:  `created_by_name="` + ds.Name + `"`,
		`namespace="kube-system"`: `namespace="` + ds.Namespace + `"`,
		"kubectl -n kube-system ": "kubectl -n " + ds.Namespace + " ",
		`"xdpq_io_`:               `"example_com_`,
	} {
		if !strings.Contains(text, old) {
			t.Errorf("%s lacks %s", rulesFile, old)
		}
		text = strings.ReplaceAll(text, old, new)
	}
	var want map[string]any
	if err := yaml.Unmarshal([]byte(text), &want); err != nil {
		t.Fatal(err)
	}
	spec := prometheusRuleSpec(t, prs[0])
	if d := cmp.Diff(want, spec); d != "" {
		t.Errorf("the PrometheusRule's spec (-want +got):\n%s", d)
	}
	if svcs[0].Name != "edge-xdpq-metrics" || ds.Name != "edge-xdpq" || ds.Namespace != "net" {
		t.Errorf("Service %s, DaemonSet %s/%s: the release's names are not in the rules", svcs[0].Name, ds.Namespace, ds.Name)
	}
	out, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, "check", "rules", path)
}

// TestPrometheusRuleBadValues: a misspelt value is refused.
func TestPrometheusRuleBadValues(t *testing.T) {
	_, err := Render(Dir(), Options{Values: values(t, "metrics: {prometheusRule: {enable: true}}")})
	if err == nil || !strings.Contains(err.Error(), "additional properties 'enable' not allowed") {
		t.Errorf("rendering with metrics.prometheusRule.enable: %v", err)
	}
}
