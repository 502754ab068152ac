package bench

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/testnet"
)

// tools finds testpmd and a C compiler and builds the pods' programs:
// testpmd or cc "" when not installed, which CI=true does not allow.
func tools(t *testing.T) (testpmd, cc string, pods Pods) {
	t.Helper()
	testnet.RequireRoot(t)
	ci := os.Getenv("CI") == "true"
	testpmd, err := exec.LookPath("dpdk-testpmd")
	if err != nil && ci {
		t.Fatal("CI installs dpdk-dev for this test: ", err)
	}
	cc, err = FindCC("clang,clang-14")
	if err != nil {
		if ci {
			t.Fatal("CI installs clang-14 for this test: ", err)
		}
		t.Logf("%v: the C client's rows left out (Debian: apt-get install clang-14)", err)
	}
	if pods, err = BuildPods(t.TempDir(), cc); err != nil {
		t.Fatal(err)
	}
	return testpmd, cc, pods
}

// TestBenchRuns keeps `make bench` working: every receiver, DPDK's and
// the pods' (xdpqperf with and without busy polling, the C client's
// xdpq-rxdrop, on 1, 2 and 4 queues) included, receives frames, and the
// table and the ratios are printed; and so with 9014-byte frames in
// several descriptors. It measures nothing.
func TestBenchRuns(t *testing.T) {
	testpmd, cc, pods := tools(t)
	var out bytes.Buffer
	rs, err := Run(Config{Duration: 300 * time.Millisecond, Rounds: 1, FrameSize: 64, TXBatch: 256,
		SenderCPU: 1, RxCPU: 0, Testpmd: testpmd, Pods: pods, Out: &out})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	// (a) to (c); (a) on 2 and 4 queues; (e) and (f) on 1, 2 and 4
	// queues; (e) with a loop per queue on 4; (g), or (e) without it, on
	// 4 queues of ring 512.
	want := 3 + 2 + 2*3 + 1 + 1
	if testpmd != "" {
		want++
	}
	if cc != "" {
		want += 3
	}
	if len(rs) != want {
		t.Fatalf("%d receivers measured, want %d\n%s", len(rs), want, out.String())
	}
	for _, r := range rs {
		if r.Rates[0] <= 0 || r.SenderNS[0] <= 0 {
			t.Errorf("%s, %d queues: rate %v, sender %v ns/pkt", r.Name, r.Queues, r.Rates, r.SenderNS)
		}
		if !strings.HasPrefix(r.Name, "(a)") && (len(r.RxCPUNS) != 1 || r.RxCPUNS[0] <= 0) {
			t.Errorf("%s, %d queues: receiver CPU %v ns/pkt", r.Name, r.Queues, r.RxCPUNS)
		}
		if withDrops := !strings.HasPrefix(r.Name, "(a)") && !strings.HasPrefix(r.Name, "(d)"); withDrops && len(r.Drops) != 1 {
			t.Errorf("%s, %d queues: drops %v", r.Name, r.Queues, r.Drops)
		}
	}
	for _, s := range []string{"b/a = ", "(a) XDP_DROP: 2 queues/1 queue = ", "(e) 1 queue: rate/(a) = ", "4 queues/1 queue = ", "1 sender core",
		" 4 queues of ring 512 (the frames of 1 queue's ring in all): 4 queues/1 queue = ",
		"(b) 1 queue: the longest its loop was away from its RX ring while frames came was ",
		"(e) 4 queues: one loop over them all (client.Poller, xdpqperf's default with fewer cores than queues) "} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("no %q in the output:\n%s", s, out.String())
		}
	}
	if cc != "" && !strings.Contains(out.String(), "(g) 1 queue: the longest its loop was away") {
		t.Errorf("no gap line for (g) in the output:\n%s", out.String())
	}
	t.Log(out.String())

	// Jumbo frames: the same receivers but (d), every frame in 5
	// descriptors of 2 KiB frames (3 of 4 KiB for the pods).
	out.Reset()
	rs, err = Run(Config{Duration: 300 * time.Millisecond, Rounds: 1, FrameSize: 9014, TXBatch: 256,
		SenderCPU: 1, RxCPU: 0, Testpmd: testpmd, Pods: pods, PodQueues: []int{1}, Out: &out})
	if err != nil {
		t.Fatalf("jumbo: %v\n%s", err, out.String())
	}
	want = 5 // (a), (b), (c), (e), (f); and (g) with the C client
	if cc != "" {
		want++
	}
	if len(rs) != want {
		t.Fatalf("jumbo: %d receivers measured, want %d\n%s", len(rs), want, out.String())
	}
	for _, r := range rs {
		if r.Rates[0] <= 0 {
			t.Errorf("jumbo: %s: rate %v", r.Name, r.Rates)
		}
	}
	if !strings.Contains(out.String(), "jumbo frames: MTU 9000") || !strings.Contains(out.String(), "Gbit/s") {
		t.Errorf("jumbo: no MTU or Gbit/s in the output:\n%s", out.String())
	}
	t.Log(out.String())
}

func TestMain(m *testing.M) { os.Exit(testnet.MainWithLeakCheck(m)) }
