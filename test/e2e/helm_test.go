package e2e_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/test/e2e/cluster"
)

// TestHelmDryRunServer: the chart installs on a real API server with
// --dry-run=server (the server defaults and validates every object of the
// release, admission included, and stores none), and a bad value is
// refused by the chart's schema before anything reaches the server.
// manifests/xdpq.yaml applies with kubectl apply --dry-run=server, each
// of its objects.
func TestHelmDryRunServer(t *testing.T) {
	testnet.RequireRoot(t)
	cp := cluster.StartControlPlaneForTest(t, cluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute) // a fresh build of helm included
	defer cancel()
	out, err := cp.Helm(ctx, "install", "xdpq", "../../charts/xdpq", "-n", "kube-system", "--dry-run=server",
		"--set", "config.pools[0].name=upf", "--set", "config.pools[0].devices.netdevs[0]=eth1#0-3")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"STATUS: pending-install", "kind: DaemonSet", "kind: ClusterRole", "kind: ConfigMap", "name: upf"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the dry run's output has no %q:\n%s", want, out)
		}
	}
	if out, err := cp.Kubectl(ctx, "-n", "kube-system", "get", "daemonsets", "-o", "name"); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("a dry run left objects: %q %v", out, err)
	}
	out, err = cp.Helm(ctx, "install", "xdpq", "../../charts/xdpq", "-n", "kube-system", "--dry-run=server",
		"--set", "securityContext.capabilities[0]=ALL")
	if err == nil || !strings.Contains(err.Error(), "values don't meet the specifications of the schema") {
		t.Errorf("a capability ALL: %v\n%s", err, out)
	}

	// docs/install.md's kubectl apply -f manifests/xdpq.yaml, with
	// --dry-run=server: every object of the file, the CRD first, is
	// accepted by the server, and none is stored.
	manifests := filepath.Join(repoRoot, "manifests", "xdpq.yaml")
	b, err := os.ReadFile(manifests)
	if err != nil {
		t.Fatal(err)
	}
	objects := regexp.MustCompile(`(?m)^kind: `).FindAll(b, -1)
	out, err = cp.Kubectl(ctx, "apply", "--dry-run=server", "-f", manifests)
	if err != nil {
		t.Fatalf("kubectl apply --dry-run=server -f %s: %v\n%s", manifests, err, out)
	}
	t.Logf("kubectl apply --dry-run=server -f %s:\n%s", manifests, out)
	applied := strings.Count(string(out), " created (server dry run)\n")
	if len(objects) < 5 || applied != len(objects) {
		t.Errorf("kubectl apply --dry-run=server created %d objects, the file has %d:\n%s", applied, len(objects), out)
	}
	for _, want := range []string{"customresourcedefinition.apiextensions.k8s.io/xdpqnodes.xdpq.io created", "daemonset.apps/xdpq created"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("kubectl apply --dry-run=server did not say %q:\n%s", want, out)
		}
	}
	for _, args := range [][]string{{"get", "crd", "-o", "name"}, {"-n", "kube-system", "get", "daemonsets", "-o", "name"}} {
		if out, err := cp.Kubectl(ctx, args...); err != nil || strings.Contains(string(out), "xdpq") {
			t.Errorf("kubectl apply --dry-run=server left objects: kubectl %s: %q %v", strings.Join(args, " "), out, err)
		}
	}
}
