package xdpq

import (
	"os/exec"
	"strings"
	"testing"
)

// The product's commands: what the image ships and what an operator or a
// pod runs.
var productCommands = []string{
	"./cmd/deviceplugin", "./cmd/cni", "./cmd/xdpqctl", "./cmd/kubectl-xdpq", "./cmd/xdpqperf", "./cmd/xdpq-install-cni",
}

// Where what only tests and tools use lives: harnesses and fixtures,
// and the demo, the benchmark and the image builder.
var notProduct = []string{"github.com/xdpq/xdpq/internal/testing/", "github.com/xdpq/xdpq/internal/tools/"}

// TestProductImportsNoHarness: internal/ holds two kinds of package,
// what the product runs (internal/<name>) and what only tests and tools
// use (internal/testing/..., internal/tools/...). No package of the
// product's commands or of pkg/... depends on the second kind, so a
// lower layer never imports a package that lives among test harnesses.
func TestProductImportsNoHarness(t *testing.T) {
	args := append([]string{"list", "-deps", "-f", `{{.ImportPath}} {{join .Imports " "}}`}, productCommands...)
	args = append(args, "./pkg/...")
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs int
	for l := range strings.Lines(string(out)) {
		f := strings.Fields(l)
		if len(f) == 0 || !strings.HasPrefix(f[0], "github.com/xdpq/xdpq") {
			continue
		}
		pkgs++
		for _, imp := range f[1:] {
			for _, bad := range notProduct {
				if strings.HasPrefix(imp, bad) {
					t.Errorf("%s imports %s, which only tests and tools may use", f[0], imp)
				}
			}
		}
	}
	if pkgs < 20 {
		t.Errorf("go list found %d of xdpq's packages in the product; the list of commands is wrong", pkgs)
	}
}
