package chart

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/xdpq/xdpq/test/chart/dashboard"
)

// The dashboard's two copies: the chart's, which its ConfigMap serves,
// and the docs'.
var dashboardFiles = []string{
	filepath.Join(Dir(), "files", "xdpq-dashboard.json"),
	filepath.Join("..", "..", "docs", "dashboard", "xdpq-dashboard.json"),
}

// TestDashboardUpToDate: both copies are what package dashboard builds
// now.
func TestDashboardUpToDate(t *testing.T) {
	want, err := dashboard.Build()
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(want) {
		t.Fatal("the dashboard is not JSON")
	}
	for _, f := range dashboardFiles {
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run make generate\n%s", f, cmp.Diff(string(want), string(got)))
		}
	}
}

// TestDashboardConfigMap: the dashboard's ConfigMap is made only when
// asked, labelled for Grafana's sidecar, in the namespace asked for, and
// holds the chart's file unchanged.
func TestDashboardConfigMap(t *testing.T) {
	file, err := os.ReadFile(dashboardFiles[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, values   string
		want           bool
		namespace      string
		label, comment string
	}{
		{name: "default", values: ""},
		{name: "disabled", values: "metrics: {dashboard: {enabled: false}}"},
		{name: "enabled", values: "metrics: {dashboard: {enabled: true}}", want: true, namespace: "kube-system"},
		{name: "enabled elsewhere, labelled and annotated",
			values: "metrics: {dashboard: {enabled: true, namespace: monitoring, labels: {team: net}, annotations: {grafana_folder: xdpq}}}",
			want:   true, namespace: "monitoring", label: "net", comment: "xdpq"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cms []*corev1.ConfigMap
			for _, o := range find(objects(t, render(t, Options{Values: values(t, tc.values)})), "ConfigMap") {
				if cm := decode[corev1.ConfigMap](t, o); cm.Labels["grafana_dashboard"] != "" {
					cms = append(cms, cm)
				}
			}
			if got := len(cms) == 1; got != tc.want || len(cms) > 1 {
				t.Fatalf("%d dashboard ConfigMaps, want %v", len(cms), tc.want)
			}
			if !tc.want {
				return
			}
			cm := cms[0]
			if cm.Name != "xdpq-dashboard" || cm.Namespace != tc.namespace || cm.Labels["grafana_dashboard"] != "1" {
				t.Errorf("ConfigMap %s/%s labels %v; want xdpq-dashboard in %s, grafana_dashboard: \"1\"", cm.Namespace, cm.Name, cm.Labels, tc.namespace)
			}
			if cm.Labels["team"] != tc.label || cm.Annotations["grafana_folder"] != tc.comment {
				t.Errorf("labels %v, annotations %v", cm.Labels, cm.Annotations)
			}
			if len(cm.Data) != 1 || cm.Data["xdpq-dashboard.json"] != string(file) {
				t.Errorf("the ConfigMap's data is not %s: keys %v, diff:\n%s", dashboardFiles[0], keys(cm.Data),
					cmp.Diff(string(file), cm.Data["xdpq-dashboard.json"]))
			}
		})
	}
	_, err = Render(Dir(), Options{Values: values(t, "metrics: {dashboard: {enable: true}}")})
	if err == nil || !strings.Contains(err.Error(), "additional properties 'enable' not allowed") {
		t.Errorf("rendering with metrics.dashboard.enable: %v", err)
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
