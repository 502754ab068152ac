package kubectlxdpq_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/xdpq/xdpq/internal/kubectlxdpq"
)

// kubeconfig names a server nobody listens on: what these tests check
// is refused before any request, or is that the server is away.
const kubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: ns1}}]
current-context: x
`

// run runs `kubectl xdpq args...` with kubeconfig.
func run(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	streams, _, out, errOut := genericiooptions.NewTestIOStreams()
	cmd := kubectlxdpq.NewCommand(streams)
	cmd.SetArgs(append([]string{"--kubeconfig", path, "--cache-dir", t.TempDir()}, args...))
	err = cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-h"}, []string{"kubectl xdpq [command]", "status", "pods", "describe", "top", "--kubeconfig", "--context", "--namespace"}},
		{[]string{"top", "-h"}, []string{"kubectl xdpq top [NODE...]", "--interval duration", "--once", "-o, --output", "--daemon-namespace string",
			"RING-FULL/s", "pods/proxy", "create rolebinding"}},
		{[]string{"status", "-h"}, []string{"kubectl xdpq status [NODE...]", "Overridden", "-o, --output"}},
		{[]string{"pods", "--help"}, []string{"kubectl xdpq pods", "-A, --all-namespaces", "--node", "-o, --output"}},
		{[]string{"describe", "-h"}, []string{"kubectl xdpq describe node [NAME...]", "Events"}},
		{[]string{"help", "status"}, []string{"kubectl xdpq status [NODE...]"}},
	} {
		out, _, err := run(t, tc.args...)
		if err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%q: output lacks %q:\n%s", tc.args, w, out)
			}
		}
	}
}

func TestRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "-o", "name"}, `output format "name", allowed formats are: json, wide, yaml`},
		{[]string{"pods", "-o", "table"}, `output format "table"`},
		{[]string{"pods", "extra"}, `unknown command "extra" for "kubectl xdpq pods"`},
		{[]string{"describe"}, "describe what? kubectl xdpq describe node NAME"},
		{[]string{"describe", "pod", "x"}, `kubectl xdpq describes nodes, not "pod"`},
		{[]string{"frob"}, `unknown command "frob" for "kubectl xdpq"`},
		{[]string{"status", "--frob"}, "unknown flag: --frob"},
		{[]string{"status", "--chunk-size", "-1"}, "--chunk-size -1: 0 (no chunks) or more"},
		{[]string{"top", "-o", "yaml"}, `output format "yaml", allowed formats are: json`},
		{[]string{"top", "--interval", "10ms"}, "--interval 10ms: at least 100ms"},
	} {
		out, _, err := run(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one saying %q", tc.args, err, tc.want)
		}
		if out != "" {
			t.Errorf("%q: wrote %q to stdout", tc.args, out)
		}
	}
}

// TestUnreachable: a command that gets past its checks says which server
// it could not reach.
func TestUnreachable(t *testing.T) {
	for _, args := range [][]string{{"status"}, {"pods", "-A"}, {"describe", "node", "n1"}, {"top", "--once"}, {"top", "-o", "json"}} {
		_, _, err := run(t, args...)
		if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
			t.Errorf("%q: error %v, want one naming the server", args, err)
		}
	}
}
