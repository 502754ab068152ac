package demo

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/internal/testnet"
)

func TestMain(m *testing.M) { os.Exit(testnet.MainWithLeakCheck(m)) }

// TestDemo runs the demo as `make demo` does, with xdpqperf built from
// this tree, and checks what it claims: the pod is unprivileged, receives
// on both queues, and nothing is left.
func TestDemo(t *testing.T) {
	testnet.RequireRoot(t)
	perf := filepath.Join(t.TempDir(), "xdpqperf")
	if out, err := exec.Command("go", "build", "-o", perf, "github.com/xdpq/xdpq/cmd/xdpqperf").CombinedOutput(); err != nil {
		t.Fatalf("build xdpqperf: %v\n%s", err, out)
	}
	var out bytes.Buffer
	if err := Run(&out, perf, 2); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{
		"as uid 65534, CapEff 0000000000000000, netns links [lo]",
		"its lease is active: xa queues [0 1] in the XSKMAP; xdpq_direct",
		"the pod exited and its lease ended",
		"no XDP program on xa",
		"nothing left behind",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
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
