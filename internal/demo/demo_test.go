package demo

import (
	"bytes"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/internal/testnet"
)

func TestMain(m *testing.M) {
	// StartPod runs this binary again as the pod.
	if os.Getenv(strings.Split(PodEnv, "=")[0]) == "1" {
		if err := Pod(); err != nil {
			os.Stderr.WriteString("pod: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(testnet.MainWithLeakCheck(m))
}

// TestDemo runs the demo as `make demo` does and checks what it claims:
// the pod is unprivileged, receives on both queues, and nothing is left.
func TestDemo(t *testing.T) {
	testnet.RequireRoot(t)
	var out bytes.Buffer
	if err := Run(&out, 2); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{
		"uid 65534, CapEff 0000000000000000, netns links [lo]",
		"native mode, xdpq's",
		"10 of 10 frames on q0 now reach a kernel UDP socket",
		"detached (no XDP program)",
		"nothing left behind",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	rates := regexp.MustCompile(`q([01]) +([0-9.]+) kpps`).FindAllStringSubmatch(s, -1)
	if len(rates) != 4 {
		t.Fatalf("want 2 lines of 2 queue rates:\n%s", s)
	}
	for _, r := range rates {
		if v, _ := strconv.ParseFloat(r[2], 64); v <= 0 {
			t.Errorf("queue %s received nothing in a second:\n%s", r[1], s)
		}
	}
}
