package bench

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestForwardTables runs the forwarding, transmit and latency tables as
// make bench does, briefly: every forwarder sends frames back to B
// (counted there), every transmitter's frames reach B, and every
// reflector answers the echo's frames, each timed.
func TestForwardTables(t *testing.T) {
	testpmd, cc, pods := tools(t)
	var out bytes.Buffer
	_, err := Run(Config{Duration: 300 * time.Millisecond, Rounds: 1, FrameSize: 64, TXBatch: 256,
		SenderCPU: 1, RxCPU: 0, Testpmd: testpmd, Pods: pods, PodQueues: []int{1, 2}, Out: &out,
		SkipReceive: true, Forward: true, Transmit: true, Latency: true})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log(out.String())
	forwarders := []string{"XDP_TX reflector (no socket)", "pod: xdpqperf l2fwd"}
	transmitters := []string{"pod: xdpqperf txpush"}
	reflectors := []string{"XDP_TX reflector (no socket)", "pod: xdpqperf l2fwd", "pod: xdpqperf l2fwd, busyPoll"}
	if testpmd != "" {
		forwarders = append(forwarders, "DPDK af_xdp PMD macswap")
		transmitters = append(transmitters, "DPDK af_xdp PMD txonly")
		reflectors = append(reflectors, "DPDK af_xdp PMD macswap")
	}
	if cc != "" {
		forwarders = append(forwarders, "pod: C xdpq-l2fwd")
		reflectors = append(reflectors, "pod: C xdpq-l2fwd")
	}
	num := `([0-9.]+)`
	for _, q := range []string{"1", "2"} {
		for _, f := range forwarders {
			m := regexp.MustCompile(`round 1  ` + regexp.QuoteMeta(f) + ` +q` + q + ` +` + num + ` Mpps back`).FindStringSubmatch(out.String())
			if m == nil || m[1] == "0.000" {
				t.Errorf("forwarding, %s at %s queues: %v", f, q, m)
			}
		}
		for _, f := range transmitters {
			m := regexp.MustCompile(`round 1  ` + regexp.QuoteMeta(f) + ` +q` + q + ` +` + num + ` Mpps at B`).FindStringSubmatch(out.String())
			if m == nil || m[1] == "0.000" {
				t.Errorf("transmit, %s at %s queues: %v", f, q, m)
			}
		}
	}
	// At 10,000 a second every frame comes back (a tenth may still be on
	// its way when a stalled machine ends the run); none when the
	// reflector answers elsewhere than the echo listens.
	for _, f := range reflectors {
		m := regexp.MustCompile(`round 1  ` + regexp.QuoteMeta(f) + ` +10000/s  sent (\d+) back (\d+) \(echo dropped \d+\)  p50 (\S+) `).FindStringSubmatch(out.String())
		if m == nil {
			t.Errorf("latency, %s: no row at 10000/s", f)
			continue
		}
		sent, _ := strconv.Atoi(m[1])
		back, _ := strconv.Atoi(m[2])
		if sent < 2000 || back*10 < sent*9 || m[3] == "0s" {
			t.Errorf("latency, %s: sent %d, back %d, p50 %s", f, sent, back, m[3])
		}
	}
	for _, s := range []string{"forwarding, 64-byte frames, medians of the rounds", "transmit, medians of the rounds", "latency, round trip in µs", "(busyPoll on veth at 10000/s: p50 ",
		"a 50 µs sleep on cpu 0 (the reflectors'), 20000 times, idle but for it: late by p50 ", "; beside a busy loop at nice 19, which keeps the core from halting: p50 "} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("no %q in the output", s)
		}
	}
}

// TestPercentiles: nearest rank, on a sorted copy.
func TestPercentiles(t *testing.T) {
	var v []time.Duration
	for i := 1000; i >= 1; i-- {
		v = append(v, time.Duration(i))
	}
	p50, p99, p999, mx := percentiles(v)
	if p50 != 501 || p99 != 991 || p999 != 1000 || mx != 1000 {
		t.Errorf("percentiles of 1..1000: %v %v %v %v", p50, p99, p999, mx)
	}
	if v[0] != 1000 {
		t.Error("percentiles sorted its argument")
	}
	if a, b, c, d := percentiles(nil); a+b+c+d != 0 {
		t.Error("percentiles of nothing are not zero")
	}
}
