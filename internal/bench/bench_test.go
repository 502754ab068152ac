package bench

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testnet"
)

// TestBenchRuns keeps `make bench` working: every receiver, DPDK's
// included, receives frames and the table is printed. It measures nothing.
func TestBenchRuns(t *testing.T) {
	testnet.RequireRoot(t)
	testpmd, err := exec.LookPath("dpdk-testpmd")
	if err != nil && os.Getenv("CI") == "true" {
		t.Fatal("CI installs dpdk-dev for this test: ", err)
	}
	var out bytes.Buffer
	rs, err := Run(Config{Duration: 300 * time.Millisecond, Rounds: 1, FrameSize: 64, TXBatch: 256,
		SenderCPU: 1, RxCPU: 0, Testpmd: testpmd, Out: &out})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	want := 3
	if testpmd != "" {
		want = 4
	}
	if len(rs) != want {
		t.Fatalf("%d receivers measured, want %d", len(rs), want)
	}
	for _, r := range rs {
		if r.Rates[0] <= 0 || r.SenderNS[0] <= 0 {
			t.Errorf("%s: rate %v, sender %v ns/pkt", r.Name, r.Rates, r.SenderNS)
		}
	}
	if !strings.Contains(out.String(), "b/a = ") {
		t.Errorf("no ratios printed:\n%s", out.String())
	}
}

func TestMain(m *testing.M) { os.Exit(testnet.MainWithLeakCheck(m)) }
