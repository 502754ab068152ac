package demo

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/internal/testing/testbin"
	"github.com/xdpq/xdpq/internal/testing/testnet"
)

func TestMain(m *testing.M) { os.Exit(testnet.MainWithLeakCheck(m)) }

// TestDemo runs the demo as `make demo` does, with the binaries built
// from this tree, and checks what it claims: the pod is unprivileged and
// receives on both queues once cnitool has added its flow; the operator's
// program takes the hook and xdpq comes back; nothing is left.
func TestDemo(t *testing.T) {
	testnet.RequireRoot(t)
	dir := t.TempDir()
	bin := Binaries{Perf: filepath.Join(dir, "xdpqperf"), CNITool: filepath.Join(dir, "cnitool"), CNIDir: filepath.Join(dir, "cni")}
	for out, pkg := range map[string]string{
		bin.Perf:                                "github.com/xdpq/xdpq/cmd/xdpqperf",
		bin.CNITool:                             "github.com/containernetworking/cni/cnitool",
		filepath.Join(bin.CNIDir, "xdpq"):       "github.com/xdpq/xdpq/cmd/cni",
		filepath.Join(bin.CNIDir, "host-local"): "github.com/containernetworking/plugins/plugins/ipam/host-local",
	} {
		testbin.Build(t, out, pkg)
	}
	var out bytes.Buffer
	if err := Run(context.Background(), &out, bin, 4); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{
		"as uid 65534, CapEff 0000000000000000, netns links [lo]",
		"host-local gave the pod 10.77.0.",
		"1 flow steered",
		"foreign program operator_pass",
		"state Overridden",
		"cnitool del",
		"no flow, no socket, no lease left",
		"nothing left behind",
		"received by the pod",
		"sent while xdpq's program was off xa's hook",
		"dropped by the kernel at the pod's sockets: fill ring empty",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if !regexp.MustCompile(`operator_pass[^\n]*\n(?s:.*)t=4s xa: xdpq_filter`).MatchString(s) {
		t.Errorf("xdpq did not come back after the operator's program left:\n%s", s)
	}
	rates := regexp.MustCompile(`q([01]) rx +([0-9]+) pps`).FindAllStringSubmatch(s, -1)
	positive := map[string]bool{}
	for _, r := range rates {
		if v, _ := strconv.Atoi(r[2]); v > 0 {
			positive[r[1]] = true
		}
	}
	if !positive["0"] || !positive["1"] {
		t.Errorf("the pod did not report traffic on both queues:\n%s", s)
	}
}

// TestAccounting: the demo's last lines add up, and a count that does not
// fails it.
func TestAccounting(t *testing.T) {
	a := accounting{sent: 1_000_000, received: 790_000, offHook: 200_500, fillEmpty: 8_000, ringFull: 1_000, seconds: 5}
	if a.rest() != 500 || a.check() != nil {
		t.Errorf("rest %d, check %v", a.rest(), a.check())
	}
	lines := strings.Join(a.lines(), "\n")
	for _, want := range []string{"the source sent 1000000 frames (200000 a second)", "790000 ( 79.0%) received by the pod",
		"9000 (  0.9%) dropped by the kernel at the pod's sockets: fill ring empty 8000, rx ring full 1000", "500 in flight"} {
		if !strings.Contains(lines, want) {
			t.Errorf("lines lack %q:\n%s", want, lines)
		}
	}
	a.received -= 50_000 // frames lost without a count
	if err := a.check(); err == nil {
		t.Errorf("50000 frames unexplained passed the check")
	}
}
